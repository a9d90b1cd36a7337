"""The systemd unit's sandbox, held to its numbers: ``systemd-analyze security``
scores it at 2.0 or better, and every system call a working daemon makes is one its
``SystemCallFilter`` allows (traced with strace, so no systemd is needed to know that
the daemon still runs under the filter)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest

from tests.e2e.conftest import SECRET
from tests.support.daemon import Herald
from tests.support.receiver import Receiver

pytestmark = pytest.mark.e2e

UNIT = Path(__file__).resolve().parents[2] / "deploy" / "systemd" / "herald.service"
EXPOSURE_LIMIT = 2.0


def tool(name: str) -> str:
    found = shutil.which(name)
    assert found is not None, f"{name} is not installed (Debian's systemd / strace packages)"
    return found


def directives(name: str) -> list[str]:
    return re.findall(rf"^{name}=(.*)$", UNIT.read_text(), flags=re.M)


def test_unit_exposure_is_at_most_two(tmp_path: Path) -> None:
    unit = tmp_path / "herald.service"
    unit.write_text(UNIT.read_text())
    out = subprocess.run(
        [tool("systemd-analyze"), "security", "--offline=true", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    ).stdout
    found = re.search(r"Overall exposure level for herald\.service: (\d+(?:\.\d+)?)", out)
    assert found, out
    assert float(found[1]) <= EXPOSURE_LIMIT, out
    assert directives("LimitNOFILE"), "a file-descriptor limit for many concurrent sockets"


def expand(analyze: str, item: str, seen: set[str] | None = None) -> set[str]:
    """The system calls a filter entry (a call or an @group, nested) names."""
    if not item.startswith("@"):
        return {item}
    seen = set() if seen is None else seen
    if item in seen:
        return set()
    seen.add(item)
    out = subprocess.run(
        [analyze, "syscall-filter", "--no-pager", item],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    calls: set[str] = set()
    for line in out.splitlines()[1:]:
        entry = line.strip()
        if not entry or entry.startswith("#"):
            continue
        calls |= expand(analyze, entry, seen)
    return calls


def allowed_calls() -> set[str]:
    """What the unit's SystemCallFilter lines leave allowed, applied in order."""
    analyze = tool("systemd-analyze")
    allowed: set[str] = set()
    for value in directives("SystemCallFilter"):
        deny = value.startswith("~")
        names = {c for entry in value.lstrip("~").split() for c in expand(analyze, entry)}
        allowed = allowed - names if deny else allowed | names
    assert allowed, "the unit filters system calls"
    return allowed


def traced_calls(summary: str) -> set[str]:
    """The call names of an ``strace -c`` summary table."""
    calls = set()
    for line in summary.splitlines():
        cells = line.split()
        if len(cells) >= 5 and re.fullmatch(r"[\d.]+", cells[0]) and cells[-1] != "total":
            calls.add(cells[-1])
    return calls


def scrape(port: int) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        return bytes(resp.read())


def daemon_pid(tracer: int) -> int:
    """The traced herald process: strace's child."""
    children = Path(f"/proc/{tracer}/task/{tracer}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


async def test_a_working_daemon_stays_inside_the_units_system_call_filter(
    tmp_path: Path, receiver: Receiver
) -> None:
    summary = tmp_path / "strace.txt"
    # Worker processes too: the unit runs the default, which forks them.
    h = Herald(
        tmp_path,
        {"delivery": {"worker_processes": 2}},
        wrapper=[tool("strace"), "-f", "-c", "-q", "-o", str(summary)],
    )
    await h.astart()
    try:
        dest = await h.acreate_webhook(receiver.url, secret=SECRET, events=["*"])
        h.insert_events(
            [(f"evt_sc{i}", "default", "order.paid", json.dumps({"n": i})) for i in range(20)]
        )
        await receiver.wait_for(lambda: len(receiver.events("order.paid")) == 20, what="events")
        assert b"herald_" in await asyncio.to_thread(scrape, h.port)
        listed = await h.acli_json("deliveries", "list", "--destination", dest["id"])
        assert listed["data"]
    finally:
        assert h.proc is not None
        pid = daemon_pid(h.proc.pid)
        # SIGTERM to the daemon itself: strace would only detach on its own.
        os.kill(pid, signal.SIGTERM)
        assert h.wait_exit(60) == 0, h.log()[-3000:]
    used = traced_calls(summary.read_text())
    assert {"epoll_wait", "sendto", "clone"} & used, summary.read_text()
    refused = used - allowed_calls()
    assert not refused, f"calls the unit's SystemCallFilter refuses (EPERM): {sorted(refused)}"
