"""Shared helpers: workload, child processes, deadlines, tables and result files."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import orjson

RESULTS_DIR = Path(__file__).resolve().parent / "results"
REPO_ROOT = Path(__file__).resolve().parent.parent

EVENT_TYPE = "task_run.completed"
TENANT = "default"
DEFAULT_PHASE_TIMEOUT = 300.0


class BenchError(Exception):
    """A benchmark could not run or produced a wrong result."""


# --- workload -------------------------------------------------------------------
def event_id(i: int) -> str:
    """A unique, deterministic event id for event number ``i``."""
    return f"evt_bench{i:010d}"


def payload(i: int) -> bytes:
    """A realistic event payload of about 200 bytes (JSON object)."""
    secs = 30 + i % 90
    return orjson.dumps(
        {
            "task_run_id": f"tr_{i:010d}",
            "workflow": "nightly-invoice-sync",
            "status": "completed",
            "attempt": 1 + i % 3,
            "duration_ms": secs * 1000 + i % 1000,
            "finished_at": f"2025-06-01T02:{secs % 60:02d}:{i % 60:02d}.000Z",
            "records": {"read": 1800 + i % 97, "written": 1790 + i % 89, "skipped": i % 7},
        }
    )


def envelope(evt_id: str, type_: str, created_at: str, data: bytes) -> bytes:
    """The body Herald POSTs: ``{"id","type","created_at","data"}`` with ``data`` verbatim."""
    return b"".join(
        (
            b'{"id":',
            orjson.dumps(evt_id),
            b',"type":',
            orjson.dumps(type_),
            b',"created_at":',
            orjson.dumps(created_at),
            b',"data":',
            data,
            b"}",
        )
    )


def iso_ms(ts: float) -> str:
    """ISO 8601 UTC text with milliseconds and ``Z`` (the outbox's ``created_at``)."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


# --- machine --------------------------------------------------------------------
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def nproc() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def machine() -> str:
    return f"{platform.platform()}; nproc={nproc()}; cpu={cpu_model()}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, *, timeout: float, alive: Callable[[], bool] = lambda: True) -> None:
    """Wait until something accepts TCP connections on 127.0.0.1:``port``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive():
            raise BenchError(f"the process meant to listen on port {port} exited")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.05)
    raise BenchError(f"nothing listens on 127.0.0.1:{port} after {timeout:g} s")


# --- deadlines ------------------------------------------------------------------
class Deadline:
    """A hard time limit for one phase of a benchmark."""

    def __init__(self, phase: str, seconds: float) -> None:
        self.phase = phase
        self.seconds = seconds
        self.start = time.monotonic()

    @property
    def remaining(self) -> float:
        return self.seconds - (time.monotonic() - self.start)

    def check(self, detail: str = "") -> None:
        if self.remaining <= 0:
            more = f" ({detail})" if detail else ""
            raise BenchError(f"phase {self.phase!r} exceeded its {self.seconds:g} s limit{more}")


# --- child processes --------------------------------------------------------------
class Child:
    """A subprocess in its own session, stopped by its own PID (or process group)."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log_path: Path,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
        group: bool = False,
    ) -> None:
        self.name = name
        self.log_path = log_path
        self.group = group
        self._log: IO[bytes] = log_path.open("ab")
        self.started_wall = time.time()
        self.proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=dict(env) if env is not None else None,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            if self.group:
                os.killpg(self.proc.pid, sig)  # our own session: the child and its workers
            else:
                os.kill(self.proc.pid, sig)

    def stop(self, *, sig: signal.Signals = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Signal, wait up to ``timeout``, then SIGKILL; returns the exit status."""
        try:
            if self.proc.poll() is None:
                self._signal(sig)
                try:
                    self.proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    self._signal(signal.SIGKILL)
                    self.proc.wait(timeout=10)
            elif self.group:
                # The leader is gone; make sure no worker of its group lingers.
                self._signal(signal.SIGKILL)
        finally:
            self._log.close()
        return self.proc.returncode

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def run_cmd(argv: Sequence[str], *, timeout: float, what: str, cwd: Path | None = None) -> str:
    """Run a short command; return its stdout or raise BenchError with its stderr."""
    try:
        proc = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout, cwd=cwd, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise BenchError(f"{what} did not finish within {timeout:g} s") from exc
    if proc.returncode != 0:
        raise BenchError(f"{what} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


def log(msg: str) -> None:
    """Progress on stderr (the table and the JSON go to stdout)."""
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


# --- output -----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Row:
    """One measured system: how many events in how many seconds."""

    name: str
    events: int
    seconds: float

    @property
    def per_s(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0


def table(rows: Sequence[Row], ceiling: Row | None) -> str:
    """Rows as a plain-text table with each one's ratio to the ceiling."""
    header = ("name", "events", "seconds", "per_s", "ratio")
    body = []
    for r in rows:
        ratio = f"{r.per_s / ceiling.per_s:.3f}" if ceiling and ceiling.per_s else "-"
        body.append((r.name, str(r.events), f"{r.seconds:.2f}", f"{r.per_s:,.0f}", ratio))
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(header)]

    def fmt(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = (c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True))
        return "  ".join((first, *rest))

    return "\n".join([fmt(header), fmt(["-" * w for w in widths]), *(fmt(b) for b in body)])


def write_result(name: str, data: Mapping[str, Any]) -> Path:
    """Write ``bench/results/NAME.json`` atomically."""
    path = RESULTS_DIR / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)
    return path


def iso_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# --- shared by the newer benchmarks ------------------------------------------------
QUICK_DIR = "quick"


def result_file(name: str, *, quick: bool) -> str:
    """``NAME`` for a full run; ``quick/NAME`` (git-ignored) for a ``--quick`` smoke run."""
    return f"{QUICK_DIR}/{name}" if quick else name


def write_named(name: str, data: Mapping[str, Any], *, quick: bool) -> Path:
    """Write the result file (full runs) or its ``quick/`` twin, and say where."""
    path = write_result(result_file(name, quick=quick), data)
    print(f"\nwrote {path.relative_to(REPO_ROOT)}")
    return path


def load_avg() -> float:
    """The 1-minute load average (the machine is shared: every result records it)."""
    return round(os.getloadavg()[0], 2)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of already sorted values, nearest-rank."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), round(q / 100 * len(sorted_values) + 0.5)))
    return float(sorted_values[rank - 1])


def latency_summary(seconds: Sequence[float]) -> dict[str, float]:
    """p50/p95/p99/max (and mean) in milliseconds."""
    ordered = sorted(seconds)
    out = {f"p{q}_ms": percentile(ordered, q) * 1000 for q in (50, 95, 99)}
    out["max_ms"] = (ordered[-1] if ordered else float("nan")) * 1000
    out["mean_ms"] = (sum(ordered) / len(ordered) if ordered else float("nan")) * 1000
    return {k: round(v, 1) for k, v in out.items()}


def grid(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain-text table: first column left-aligned, the others right-aligned."""

    def cell(value: object) -> str:
        if isinstance(value, float):
            return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
        if isinstance(value, int):
            return f"{value:,}"
        return str(value)

    body = [[cell(v) for v in row] for row in rows]
    widths = [
        max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(header)
    ]

    def fmt(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = (c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True))
        return "  ".join((first, *rest))

    return "\n".join([fmt(header), fmt(["-" * w for w in widths]), *(fmt(b) for b in body)])


def iso_us(ts: float) -> str:
    """ISO 8601 UTC text with microseconds and ``Z`` (a precise outbox ``created_at``)."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_iso(text: str) -> float:
    """Epoch seconds of ``YYYY-MM-DDTHH:MM:SS[.fff…]Z`` (the bench's own format)."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def config_overrides(items: list[str]) -> dict[str, dict[str, object]]:
    """``--set SECTION.KEY=VALUE`` options as config sections (values parsed as JSON
    where they are JSON)."""
    out: dict[str, dict[str, object]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        section, dot, name = key.partition(".")
        if not sep or not dot or not section or not name:
            raise BenchError(f"--set {item!r}: expected SECTION.KEY=VALUE")
        value: object = raw
        with contextlib.suppress(ValueError):
            value = json.loads(raw)
        out.setdefault(section, {})[name] = value
    return out
