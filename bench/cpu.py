"""CPU time of processes from ``/proc``, over one phase of a benchmark.

``/proc/PID/stat`` gives a process's ``utime`` and ``stime`` (fields 14 and 15,
every thread included) in clock ticks; ``/proc/PID/task/TID/children`` lists
its children (Herald's attempt processes under ``herald run``, nginx's worker
under its master), with a scan of every ``/proc/PID/stat``'s parent field
where the kernel lacks that file. A :class:`CpuMeter` watches named groups of
processes: :meth:`CpuMeter.start` records each process's time, every
:meth:`CpuMeter.sample` (call it at each poll) finds the group's processes again
and keeps each one's latest time, :meth:`CpuMeter.stop` returns the CPU seconds
each group spent since ``start``. A process that appeared during the phase
counts from zero when it started after ``start`` (PostgreSQL backends a pool
opened); one that exited counts up to its last sample.

The meter also reads how long each group's threads waited on a run queue for a
CPU (``/proc/PID/task/TID/schedstat``'s second field, in ns): on a machine with
fewer cores than busy threads, a pipeline's stages wait for each other's CPU as
well as for each other's work. Only the threads alive at each sample count (one
that ended takes its wait with it), and a kernel without schedstats gives none.

The parsing functions are pure (they take the file's text) and unit-tested in
``tests/unit/test_bench_cpu.py``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

PROC = Path("/proc")
Finder = Callable[[], Iterable[int]]
"""Returns the pids of one group now (they may change between calls)."""


class ProcParseError(ValueError):
    """A ``/proc`` file whose text is not what the kernel writes."""


@dataclass(frozen=True, slots=True)
class Stat:
    """The fields of ``/proc/PID/stat`` a benchmark needs (times in clock ticks)."""

    pid: int
    comm: str
    ppid: int
    utime: int
    stime: int
    starttime: int
    """Since boot, in clock ticks."""

    @property
    def ticks(self) -> int:
        return self.utime + self.stime


def parse_stat(text: str) -> Stat:
    """Parse one ``/proc/PID/stat`` line.

    ``comm`` is in parentheses and may itself hold spaces and parentheses, so the
    fields after it are found from the *last* ``)``.
    """
    head, sep, tail = text.rpartition(")")
    pid_text, open_paren, comm = head.partition(" (")
    if not sep or not open_paren:
        raise ProcParseError(f"not a /proc/PID/stat line: {text[:80]!r}")
    rest = tail.split()
    # rest[0] is field 3 (state): field n is rest[n - 3].
    if len(rest) < 20:
        raise ProcParseError(f"/proc/PID/stat has {len(rest) + 2} fields, expected at least 22")
    try:
        return Stat(
            pid=int(pid_text),
            comm=comm,
            ppid=int(rest[1]),
            utime=int(rest[11]),
            stime=int(rest[12]),
            starttime=int(rest[19]),
        )
    except ValueError as exc:
        raise ProcParseError(f"/proc/PID/stat: {exc}") from exc


def parse_children(text: str) -> list[int]:
    """``/proc/PID/task/TID/children``: pids separated by spaces."""
    try:
        return [int(p) for p in text.split()]
    except ValueError as exc:
        raise ProcParseError(f"/proc/PID/task/TID/children: {text[:80]!r}") from exc


def parse_system_busy(text: str) -> tuple[int, int]:
    """``/proc/stat``'s ``cpu`` line: (busy ticks, total ticks) of the whole machine.

    Busy is everything but ``idle`` and ``iowait``; ``guest`` time is already in
    ``user`` and is not added twice.
    """
    for line in text.splitlines():
        if line.startswith("cpu "):
            values = [int(v) for v in line.split()[1:]]
            total = sum(values[:8])  # user nice system idle iowait irq softirq steal
            idle = values[3] + (values[4] if len(values) > 4 else 0)
            return total - idle, total
    raise ProcParseError("no aggregate 'cpu' line in /proc/stat")


def parse_schedstat(text: str) -> tuple[int, int]:
    """``/proc/PID/task/TID/schedstat``: (ns run on a CPU, ns waited on a run queue)."""
    fields = text.split()
    try:
        return int(fields[0]), int(fields[1])
    except (IndexError, ValueError) as exc:
        raise ProcParseError(f"not a schedstat line: {text[:80]!r}") from exc


def run_queue_wait_ns(pid: int, proc: Path = PROC) -> int | None:
    """Nanoseconds the threads of ``pid`` alive now have waited for a CPU, each since
    it started; None when the process has exited or the kernel keeps no schedstats."""
    tasks = proc / str(pid) / "task"
    try:
        tids = list(tasks.iterdir())
    except (FileNotFoundError, ProcessLookupError):
        return None
    total, found = 0, False
    for tid in tids:
        try:
            total += parse_schedstat((tid / "schedstat").read_text())[1]
        except (FileNotFoundError, ProcessLookupError):
            continue
        found = True
    return total if found else None


def clock_ticks() -> int:
    return os.sysconf("SC_CLK_TCK")


def read_stat(pid: int, proc: Path = PROC) -> Stat | None:
    """The process's stat, or None when it has exited."""
    try:
        return parse_stat((proc / str(pid) / "stat").read_text())
    except (FileNotFoundError, ProcessLookupError):
        return None


def cpu_seconds(pid: int, proc: Path = PROC) -> float:
    """utime + stime of ``pid`` (every thread), in seconds; 0 when it has exited."""
    st = read_stat(pid, proc)
    return st.ticks / clock_ticks() if st else 0.0


def children(pid: int, proc: Path = PROC) -> list[int]:
    """The direct children of ``pid`` (empty when it has exited)."""
    tasks = proc / str(pid) / "task"
    try:
        tids = [t.name for t in tasks.iterdir()]
    except (FileNotFoundError, ProcessLookupError):
        return _children_by_scan(pid, proc) if (proc / str(pid)).exists() else []
    found: list[int] = []
    have_file = False
    for tid in tids:
        try:
            found += parse_children((tasks / tid / "children").read_text())
            have_file = True
        except (FileNotFoundError, ProcessLookupError):
            continue
    if have_file:
        return sorted(set(found))
    return _children_by_scan(pid, proc)


def _children_by_scan(pid: int, proc: Path) -> list[int]:
    out = []
    for entry in proc.iterdir():
        if entry.name.isdigit():
            st = read_stat(int(entry.name), proc)
            if st is not None and st.ppid == pid:
                out.append(st.pid)
    return sorted(out)


def system_busy(proc: Path = PROC) -> tuple[int, int]:
    """(busy, total) ticks of the whole machine since boot."""
    return parse_system_busy((proc / "stat").read_text())


def uptime_ticks(proc: Path = PROC) -> int:
    """Seconds since boot in clock ticks (the unit of ``Stat.starttime``)."""
    return int(float((proc / "uptime").read_text().split()[0]) * clock_ticks())


@dataclass(slots=True)
class _Group:
    finder: Finder
    base: dict[int, int] = field(default_factory=dict)
    last: dict[int, int] = field(default_factory=dict)
    wait_base: dict[int, int] = field(default_factory=dict)
    wait_last: dict[int, int] = field(default_factory=dict)


class CpuMeter:
    """CPU seconds spent by named groups of processes between ``start`` and ``stop``."""

    def __init__(self, groups: Mapping[str, Finder], proc: Path = PROC) -> None:
        self._groups = {name: _Group(finder) for name, finder in groups.items()}
        self._proc = proc
        self._start_ticks = 0
        self._busy0 = (0, 0)
        self.machine_busy_s = 0.0
        """The whole machine's busy CPU seconds over the phase (every other process too)."""
        self.waits: dict[str, float] = {}
        """After ``stop``: seconds each group's threads waited for a CPU over the phase."""
        self.started = False

    def start(self) -> None:
        self._start_ticks = uptime_ticks(self._proc)
        self._busy0 = system_busy(self._proc)
        for group in self._groups.values():
            for pid in group.finder():
                st = read_stat(pid, self._proc)
                if st is not None:
                    group.base[pid] = group.last[pid] = st.ticks
                wait = run_queue_wait_ns(pid, self._proc)
                if wait is not None:
                    group.wait_base[pid] = group.wait_last[pid] = wait
        self.started = True

    def sample(self) -> None:
        for group in self._groups.values():
            for pid in group.finder():
                st = read_stat(pid, self._proc)
                if st is None:
                    continue
                new = st.starttime >= self._start_ticks
                if pid not in group.base:
                    # Started during the phase: all of its time is the phase's; one that
                    # was already running and only now found counts from now.
                    group.base[pid] = 0 if new else st.ticks
                group.last[pid] = st.ticks
                wait = run_queue_wait_ns(pid, self._proc)
                if wait is not None:
                    group.wait_base.setdefault(pid, 0 if new else wait)
                    group.wait_last[pid] = wait

    def stop(self) -> dict[str, float]:
        """Sample once more; CPU seconds of each group since ``start``."""
        self.sample()
        busy1 = system_busy(self._proc)
        tck = clock_ticks()
        self.machine_busy_s = (busy1[0] - self._busy0[0]) / tck
        self.waits = {
            name: sum(max(0, g.wait_last[p] - g.wait_base[p]) for p in g.wait_last) / 1e9
            for name, g in self._groups.items()
        }
        return {
            name: sum(g.last[p] - g.base[p] for p in g.last) / tck
            for name, g in self._groups.items()
        }

    def lifetime(self) -> dict[str, float]:
        """CPU seconds of each group's processes since each started (start-up included),
        as of the last sample."""
        tck = clock_ticks()
        return {name: sum(g.last.values()) / tck for name, g in self._groups.items()}

    def pids(self, name: str) -> list[int]:
        """Every process of group ``name`` seen during the phase."""
        return sorted(self._groups[name].last)


def tree(pid: int, proc: Path = PROC) -> Finder:
    """A finder for ``pid`` itself and its children."""
    return lambda: [pid, *children(pid, proc)]


def only(pid: int) -> Finder:
    return lambda: [pid]


def kids(pid: int, proc: Path = PROC) -> Finder:
    """A finder for the children of ``pid`` (not ``pid`` itself)."""
    return lambda: children(pid, proc)


@dataclass(frozen=True, slots=True)
class Phase:
    """What a :class:`CpuMeter` measured over a phase in which ``items`` were done."""

    items: int
    wall_seconds: float
    cpu_seconds: Mapping[str, float]
    machine_busy_seconds: float
    wait_seconds: Mapping[str, float] = field(default_factory=dict)
    """Seconds the groups' threads waited for a CPU (:attr:`CpuMeter.waits`)."""

    def waiting(self, *names: str) -> float:
        """The named groups' threads' wait for a CPU, in seconds per second of the
        phase (0.5: half a thread's worth of time spent waiting, all phase long)."""
        if self.wall_seconds <= 0:
            return 0.0
        return round(sum(self.wait_seconds.get(n, 0.0) for n in names) / self.wall_seconds, 3)

    def us(self, *names: str) -> float:
        """Microseconds of CPU per item of the named groups together."""
        return per_item_us(sum(self.cpu_seconds.get(n, 0.0) for n in names), self.items)

    @property
    def machine_us(self) -> float:
        """The whole machine's busy CPU per item (other tenants of the machine included)."""
        return per_item_us(self.machine_busy_seconds, self.items)


def per_item_us(seconds: float, items: int) -> float:
    """CPU seconds over ``items`` as microseconds each (0 when there were none)."""
    return round(seconds * 1e6 / items, 1) if items > 0 else 0.0
