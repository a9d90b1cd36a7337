"""Optional sampling of a running process with py-spy, summarised as the hottest frames.

py-spy is not a project dependency: point ``--py-spy`` (or ``$PY_SPY``) at a
binary installed elsewhere, e.g. ``pip install --target /tmp/pyspy py-spy``.
"""

from __future__ import annotations

import os
import shutil
from collections import Counter
from pathlib import Path

from bench.common import Child, log


def find_py_spy(explicit: str | None) -> str | None:
    for candidate in (explicit, os.environ.get("PY_SPY"), shutil.which("py-spy")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def start_record(binary: str, pid: int, seconds: float, out: Path) -> Child:
    """Sample ``pid`` (all threads, idle frames dropped) for ``seconds`` into a raw file."""
    argv = [
        binary,
        "record",
        "--pid",
        str(pid),
        "--duration",
        str(max(1, round(seconds))),
        "--rate",
        "100",
        "--format",
        "raw",
        "--output",
        str(out),
    ]
    log(f"py-spy recording pid {pid} for {seconds:g} s")
    return Child("py-spy", argv, log_path=out.with_suffix(".log"))


def summarise(raw: Path, top: int = 15) -> str:
    """Self-time and inclusive-time leaders from py-spy's collapsed-stack output."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        total += count
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    if not total:
        return "no samples"
    lines = [f"{total} samples", "", "self time:"]
    lines += [f"  {n / total:6.1%}  {f}" for f, n in own.most_common(top)]
    lines += ["", "inclusive time:"]
    lines += [f"  {n / total:6.1%}  {f}" for f, n in inclusive.most_common(top)]
    return "\n".join(lines)
