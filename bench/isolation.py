"""Isolation: nine healthy destinations, with and without one that answers after 4.9 s.

Healthy destinations are nginx paths; the slow one is an aiohttp process
(nginx cannot delay) that answers events 204 after 4.9 s — inside the 5 s
webhook timeout, so every one of its attempts holds a connection and a
concurrency slot for 4.9 s — and the verification ping at once.

Each run is a fresh SQLite Herald with N pre-loaded events subscribed by every
destination. Healthy throughput = healthy deliveries / (spawn → last healthy
success), with the slow destination vs without it; the ratio is the share of
healthy throughput that survives a slow neighbour. The slow destination's own
progress during the run is reported too (at most
``delivery.max_per_destination`` = 64 in flight: 64 / 4.9 s ≈ 13/s).

A tenth destination costs something even when it is fast or never attempted:
each event becomes ten deliveries to write instead of nine. A third phase
separates that from the slowness: the tenth destination present but inactive
(its deliveries written and held, none attempted). "with / inactive" is then
the share of healthy throughput the slowness alone costs.

On a shared 2-core machine one phase can run 10 % faster or slower than the
next for no reason of Herald's, and a short phase is half start-up. So a phase
delivers 20,000 events to the nine (180,000 healthy deliveries, about 15 s; with
5,000 the daemon's 0.5 s start was an eighth of it and the slow destination
held its 64 connections for barely one round), the three phases run
``--rounds`` times (3), each round starting with another phase, and every
figure is the median; the ratios are those of the medians, and the ratio of
each round is printed beside them.

Hostile receivers (issue 9): then the same nine healthy destinations alone, and
beside six hostile ones — ``tests/support/hostile.py`` run as a process of its
own (``python -m tests.support.hostile``): one black hole (reads the request,
never answers), one answering after 10 s (past the 5 s webhook timeout), one
answering 500, one resetting the connection, one sending an endless chunked body
and one a 1 GiB body (both 200: a success once the first KiB is read, the rest
never read). Retries run at a realistic pace: ``delivery.backoff_base_seconds``
= 1 (1 s, 2 s, 4 s … after each failure; the default is 30 s), in both phases.

The hostile destinations get their own ``--hostile-events`` events (200 by
default), written to the outbox ahead of the healthy ones: enough to hold the
black hole and the slow one at their 64-connection limit for the whole run and to
keep the 500 and reset ones retrying; not the healthy events, with which the
endless and 1 GiB ones would just be two more successful destinations (more
work for Herald, not a fault to isolate). The ratio is healthy throughput beside
/ alone; the hostile server's requests per path and Herald's attempts per
hostile destination inside the measured window show the work the hostile set
cost.

CPU: a sampler thread reads ``/proc/<pid>/stat`` (utime + stime, every
process thread) of Herald's processes (``herald run`` and its ``herald worker``
children), of the hostile server, and of the receiver (nginx) every 0.1 s, and
``/proc/stat`` for the whole machine; figures are interpolated at the phase's
start (spawn) and end (last healthy success). On 2 cores the hostile server's own
CPU (streaming bodies at full speed) and the other tenants' ("other": the
machine's busy time minus the processes above) compete with Herald: that is not
Herald's isolation failing, and the CPU columns say how much there was.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.hostile import BEHAVIOURS

from bench import receiver
from bench.common import (
    DEFAULT_PHASE_TIMEOUT,
    EVENT_TYPE,
    REPO_ROOT,
    BenchError,
    Child,
    Deadline,
    free_port,
    grid,
    iso_now,
    load_avg,
    log,
    machine,
    wait_port,
    write_named,
)
from bench.daemon import HeraldInstance
from bench.runs import Burst, burst, setup_webhooks
from bench.throughput import SECRET

NAME = "isolation"
HELP = (
    "healthy throughput with vs without one destination answering after 4.9 s,"
    " and beside six hostile receivers"
)
HEALTHY = 9
EVENTS, QUICK_EVENTS = 20_000, 500
ROUNDS = 3
PHASES = ("without", "inactive", "with")
SLOW_SECONDS = 4.9
# The hostile scenario (issue 9).
HOSTILE_SLOW_SECONDS = 10.0
HOSTILE_EVENTS = 200
HOSTILE_TYPE = "hostile.x"
BACKOFF_BASE_SECONDS = 1.0
SAMPLE_SECONDS = 0.1
TICK = os.sysconf("SC_CLK_TCK")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--events", type=int, default=None, help=f"events ({EVENTS})")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_EVENTS} events")
    parser.add_argument("--timeout", type=float, default=DEFAULT_PHASE_TIMEOUT)
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help=f"rounds of the three phases; each figure is the median ({ROUNDS}; 1 with --quick)",
    )
    parser.add_argument(
        "--hostile-events",
        type=int,
        default=HOSTILE_EVENTS,
        help=f"events for the hostile destinations ({HOSTILE_EVENTS})",
    )


def _run(
    workdir: Path,
    urls: list[str],
    events: int,
    slow_url: str | None,
    timeout: float,
    *,
    tenth_inactive: bool = False,
) -> tuple[Burst, dict[str, Any]]:
    """One phase. ``tenth_inactive``: the extra destination (``slow_url``) is made
    inactive before the events arrive, so its deliveries are written and held but never
    attempted - the fan-out cost of a tenth destination without its slowness."""
    inst = HeraldInstance(workdir)
    all_urls = [*urls, slow_url] if slow_url else urls
    ids = setup_webhooks(inst, all_urls, SECRET, Deadline("setup", timeout))
    if tenth_inactive:
        inst.cli("destinations", "update", ids[-1], "--data", '{"status": "inactive"}')
        slow_url = None
    healthy = ", ".join(f"'{i}'" for i in ids[: len(urls)])
    inst.preload(events)
    in_healthy = f"destination_id IN ({healthy})"
    result = burst(
        [inst],
        deliveries=events * len(urls),
        events=events,
        deadline=Deadline("isolation", timeout),
        done_sql="SELECT COUNT(*) FROM herald_deliveries WHERE status = 'success'"
        f" AND kind = 'event' AND {in_healthy}",
        delivery_filter=in_healthy,
    )
    slow: dict[str, Any] = {}
    if slow_url:
        slow_id = ids[-1]
        slow["successes"] = inst.db.count(
            "SELECT COUNT(*) FROM herald_deliveries WHERE destination_id = ? AND kind = 'event'"
            " AND status = 'success'",
            (slow_id,),
        )
        slow["attempts_by_outcome"] = dict(
            inst.db.query(
                "SELECT a.outcome, COUNT(*) FROM herald_attempts a JOIN herald_deliveries d"
                " ON d.id = a.delivery_id WHERE d.destination_id = ? AND d.kind = 'event'"
                " GROUP BY a.outcome",
                (slow_id,),
            )
        )
        slow["per_s"] = round(slow["successes"] / result.seconds, 1)
    return result, slow


# --- CPU accounting ----------------------------------------------------------------
def _proc_cpu_ticks(pid: int) -> int | None:
    """utime + stime of ``pid`` (all its threads), in clock ticks; None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])  # fields 14 and 15 of proc(5)


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        with suppress(OSError):
            out += [int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
    return out


def _find(mark: str) -> list[int]:
    """Processes whose command line contains ``mark``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if mark.encode() in cmdline:
                found.append(int(entry))
    return found


def _machine_busy_ticks() -> int:
    """Busy time of all CPUs, in clock ticks: everything but idle and iowait (steal, the
    time the hypervisor gave other guests, counts as busy: it lands in ``other``)."""
    with open("/proc/stat") as fh:
        values = [int(v) for v in fh.readline().split()[1:9]]
    return sum(values) - values[3] - values[4]


class CpuSampler:
    """Cumulative CPU seconds of process trees, each found by a mark in the command line
    of its root (the root and its descendants), and of the whole machine, sampled in a
    thread every ``SAMPLE_SECONDS``."""

    def __init__(self, marks: dict[str, str]) -> None:
        self.marks = marks
        self.times: list[float] = []
        self.samples: list[dict[str, float]] = []
        self._roots: dict[str, list[int]] = {name: [] for name in marks}
        self._seen: dict[str, dict[int, int]] = {name: {} for name in marks}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)

    def _sample(self) -> None:
        now = time.time()
        sample = {"machine": _machine_busy_ticks() / TICK}
        for name, mark in self.marks.items():
            if not self._roots[name]:
                self._roots[name] = _find(mark)
            seen = self._seen[name]
            todo = list(self._roots[name])
            while todo:
                pid = todo.pop()
                ticks = _proc_cpu_ticks(pid)
                if ticks is not None:
                    seen[pid] = ticks  # a process that is gone keeps its last figure
                    todo += _children(pid)
            sample[name] = sum(seen.values()) / TICK
        self.times.append(now)
        self.samples.append(sample)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(SAMPLE_SECONDS)

    def __enter__(self) -> CpuSampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._sample()

    def at(self, ts: float) -> dict[str, float]:
        """Every figure at wall time ``ts``, interpolated between the samples around it."""
        i = bisect.bisect_right(self.times, ts)
        if i == 0:
            return dict(self.samples[0])
        if i == len(self.times):
            return dict(self.samples[-1])
        t0, t1 = self.times[i - 1], self.times[i]
        a, b = self.samples[i - 1], self.samples[i]
        f = (ts - t0) / (t1 - t0) if t1 > t0 else 1.0
        return {k: a[k] + (b[k] - a[k]) * f for k in a}

    def between(self, start: float, end: float) -> dict[str, float]:
        """CPU seconds used between two wall times; ``other`` is the machine's busy time
        not used by the tracked processes (other tenants, the benchmark driver)."""
        a, b = self.at(start), self.at(end)
        used = {k: round(b[k] - a[k], 2) for k in b}
        used["other"] = round(used["machine"] - sum(used[k] for k in self.marks), 2)
        return used


# --- the hostile scenario ---------------------------------------------------------
@dataclass(frozen=True, slots=True)
class HostileServer:
    base: str
    mark: str
    """In its command line (the CPU sampler finds it by it)."""
    counts: Path

    def url(self, behaviour: str) -> str:
        return f"{self.base}/{behaviour}"

    def requests(self) -> dict[str, int]:
        """Requests per path (after it stopped)."""
        try:
            data: dict[str, int] = json.loads(self.counts.read_text())
        except (OSError, ValueError):
            return {}
        return {b: data.get(b, 0) for b in BEHAVIOURS}


@contextmanager
def hostile_server(workdir: Path) -> Iterator[HostileServer]:
    """tests/support/hostile.py in a process of its own, on a free port."""
    port = free_port()
    counts = workdir / "hostile-requests.json"
    argv = [sys.executable, "-m", "tests.support.hostile", "--port", str(port)]
    argv += ["--slow-seconds", str(HOSTILE_SLOW_SECONDS), "--counts", str(counts)]
    child = Child("hostile", argv, log_path=workdir / "hostile.log", cwd=REPO_ROOT)
    server = HostileServer(f"http://127.0.0.1:{port}", str(counts), counts)
    try:
        try:
            wait_port(port, timeout=15, alive=child.alive)
        except BenchError as exc:
            raise BenchError(f"hostile receivers did not start: {exc}\n{child.log_tail()}") from exc
        yield server
    finally:
        child.stop(timeout=15)


@dataclass(slots=True)
class HostilePhase:
    result: Burst
    cpu: dict[str, float]
    """CPU seconds from spawn to the last healthy success."""
    attempts: dict[str, dict[str, int]]
    """Attempts started in that window, per hostile behaviour and outcome."""


def _hostile_run(
    workdir: Path,
    urls: list[str],
    events: int,
    hostile: HostileServer | None,
    hostile_events: int,
    marks: dict[str, str],
    timeout: float,
) -> HostilePhase:
    """One phase: nine healthy destinations, alone (``hostile`` None) or beside the six."""
    inst = HeraldInstance(workdir, {"delivery": {"backoff_base_seconds": BACKOFF_BASE_SECONDS}})
    bad = [hostile.url(b) for b in BEHAVIOURS] if hostile else []
    patterns = [[EVENT_TYPE]] * len(urls) + [["hostile.*"]] * len(bad)
    ids = setup_webhooks(inst, [*urls, *bad], SECRET, Deadline("setup", timeout), patterns)
    healthy = ", ".join(f"'{i}'" for i in ids[: len(urls)])
    n_bad = hostile_events if hostile else 0
    # The hostile events first: their deliveries are pending before the healthy ones.
    inst.preload(n_bad + events, type_of=lambda i: HOSTILE_TYPE if i < n_bad else EVENT_TYPE)
    in_healthy = f"destination_id IN ({healthy})"
    with CpuSampler({"herald": str(inst.config_path), **marks}) as sampler:
        result = burst(
            [inst],
            deliveries=events * len(urls),
            events=n_bad + events,
            deadline=Deadline("hostile" if hostile else "alone", timeout),
            done_sql="SELECT COUNT(*) FROM herald_deliveries WHERE status = 'success'"
            f" AND kind = 'event' AND {in_healthy}",
            delivery_filter=in_healthy,
        )
    end = float(
        inst.db.scalar(
            "SELECT MAX(updated_at) FROM herald_deliveries WHERE status = 'success'"
            f" AND kind = 'event' AND {in_healthy}"
        )
    )
    start = end - result.seconds
    bad_ids = dict(zip(BEHAVIOURS, ids[len(urls) :], strict=True)) if hostile else {}
    attempts: dict[str, dict[str, int]] = {}
    for behaviour, dest_id in bad_ids.items():
        attempts[behaviour] = dict(
            inst.db.query(
                "SELECT a.outcome, COUNT(*) FROM herald_attempts a JOIN herald_deliveries d"
                " ON d.id = a.delivery_id WHERE d.destination_id = ? AND d.kind = 'event'"
                " AND a.started_at BETWEEN ? AND ? GROUP BY a.outcome",
                (dest_id, start, end),
            )
        )
    return HostilePhase(result, sampler.between(start, end), attempts)


def _receiver_mark(recv: receiver.Receiver) -> str:
    """What the receiver's command line holds: nginx its config, aiohttp its access log."""
    assert recv.access_log is not None
    if recv.kind == "nginx":
        return str(recv.access_log.parent / "nginx.conf")
    return str(recv.access_log)


def _hostile_scenario(
    workdir: Path, recv: receiver.Receiver, events: int, hostile_events: int, timeout: float
) -> tuple[dict[str, Any], str]:
    """Alone, then beside the hostile set: the result keys and the printed report."""
    urls = [f"{recv.base}/healthy/{i}" for i in range(HEALTHY)]
    load_before = load_avg()
    with hostile_server(workdir) as server:
        marks = {"hostile": server.mark, "receiver": _receiver_mark(recv)}
        (workdir / "alone").mkdir()
        (workdir / "beside").mkdir()
        alone = _hostile_run(workdir / "alone", urls, events, None, hostile_events, marks, timeout)
        log(f"healthy alone: {alone.result.per_s:,.0f} deliveries/s, CPU {alone.cpu}")
        beside = _hostile_run(
            workdir / "beside", urls, events, server, hostile_events, marks, timeout
        )
        log(f"healthy beside the hostile set: {beside.result.per_s:,.0f}/s, CPU {beside.cpu}")
    requests = server.requests()
    load_after = load_avg()
    ratio = beside.result.per_s / alone.result.per_s
    cpu_keys = ("herald", "hostile", "receiver", "other", "machine")
    report = "\n".join(
        [
            f"\nhostile receivers, SQLite, {HEALTHY} healthy destinations (nginx) x {events}"
            f" events; {len(BEHAVIOURS)} hostile destinations x {hostile_events} events;"
            f" backoff_base_seconds {BACKOFF_BASE_SECONDS:g}; CPU seconds in the window",
            f"load average (1 min) before/after: {load_before}/{load_after}",
            grid(
                ["run", "healthy", "seconds", "healthy/s", *(f"cpu {k}" for k in cpu_keys)],
                [
                    [
                        name,
                        phase.result.deliveries,
                        round(phase.result.seconds, 2),
                        phase.result.per_s,
                        *(phase.cpu[k] for k in cpu_keys),
                    ]
                    for name, phase in (("alone", alone), ("beside the hostile set", beside))
                ],
            ),
            "",
            grid(
                ["hostile", "requests (phase)", "attempts started in the window"],
                [
                    [b, requests.get(b, "?"), json.dumps(beside.attempts[b], sort_keys=True)]
                    for b in BEHAVIOURS
                ],
            ),
            f"\nhealthy throughput beside / alone the hostile set: {ratio:.3f}",
        ]
    )
    result = {
        "hostile_ratio": round(ratio, 3),
        "hostile": {
            "behaviours": list(BEHAVIOURS),
            "slow_seconds": HOSTILE_SLOW_SECONDS,
            "backoff_base_seconds": BACKOFF_BASE_SECONDS,
            "hostile_events": hostile_events,
            "healthy_per_s_alone": round(alone.result.per_s, 1),
            "healthy_per_s_beside": round(beside.result.per_s, 1),
            "seconds": {
                "alone": round(alone.result.seconds, 2),
                "beside": round(beside.result.seconds, 2),
            },
            "cpu_seconds": {"alone": alone.cpu, "beside": beside.cpu},
            "requests": requests,
            "attempts_in_window": beside.attempts,
            "rss_peak_mb": {"alone": alone.result.rss_mb[0], "beside": beside.result.rss_mb[0]},
            "load_avg_1m": [load_before, load_after],
        },
    }
    return result, report


def _median(runs: list[tuple[Burst, dict[str, Any]]]) -> tuple[Burst, dict[str, Any]]:
    """The run of median healthy throughput (the lower middle one of an even count)."""
    ordered = sorted(runs, key=lambda got: got[0].per_s)
    return ordered[(len(ordered) - 1) // 2]


def run(args: argparse.Namespace) -> int:
    events = args.events or (QUICK_EVENTS if args.quick else EVENTS)
    rounds = args.rounds or (1 if args.quick else ROUNDS)
    load_before = load_avg()
    with tempfile.TemporaryDirectory(prefix="herald-bench-") as scratch:
        workdir = Path(scratch)
        with (
            receiver.start("auto", workdir) as recv,
            receiver.aiohttp_receiver(
                workdir, delay=SLOW_SECONDS, delay_prefix="evt_bench", name="slow"
            ) as slow_recv,
        ):
            urls = [f"{recv.base}/healthy/{i}" for i in range(HEALTHY)]
            runs: dict[str, list[tuple[Burst, dict[str, Any]]]] = {p: [] for p in PHASES}
            for r in range(rounds):
                # Each round starts with another phase: a drift of the machine over the
                # rounds (another tenant, a warming cache) then falls on every phase.
                for phase in PHASES[r % 3 :] + PHASES[: r % 3]:
                    phase_dir = workdir / f"{phase}-{r}"
                    phase_dir.mkdir()
                    got = _run(
                        phase_dir,
                        urls,
                        events,
                        None if phase == "without" else slow_recv.url,
                        args.timeout,
                        tenth_inactive=phase == "inactive",
                    )
                    runs[phase].append(got)
                    log(f"round {r + 1}, {phase}: {got[0].per_s:,.0f} healthy deliveries/s")
            without, _ = _median(runs["without"])
            inactive, _ = _median(runs["inactive"])
            with_slow, slow = _median(runs["with"])
            load_after = load_avg()
            (workdir / "hostile").mkdir()
            hostile, hostile_report = _hostile_scenario(
                workdir / "hostile", recv, events, args.hostile_events, args.timeout
            )
    ratio = with_slow.per_s / without.per_s
    ratio_inactive = with_slow.per_s / inactive.per_s
    per_round = [
        round(w[0].per_s / wo[0].per_s, 3)
        for w, wo in zip(runs["with"], runs["without"], strict=True)
    ]
    print(
        f"\nisolation, SQLite, {HEALTHY} healthy destinations (nginx) x {events} events;"
        f" median of {rounds} round(s); {machine()}"
    )
    print(f"load average (1 min) before/after: {load_before}/{load_after}")
    print(
        grid(
            ["run", "healthy deliveries", "seconds", "healthy/s", "slow ok", "slow/s"],
            [
                [
                    "without the slow one",
                    without.deliveries,
                    round(without.seconds, 2),
                    without.per_s,
                    "-",
                    "-",
                ],
                [
                    "with a tenth destination, inactive",
                    inactive.deliveries,
                    round(inactive.seconds, 2),
                    inactive.per_s,
                    "-",
                    "-",
                ],
                [
                    f"with one answering in {SLOW_SECONDS} s",
                    with_slow.deliveries,
                    round(with_slow.seconds, 2),
                    with_slow.per_s,
                    slow["successes"],
                    slow["per_s"],
                ],
            ],
        )
    )
    print(
        f"\nhealthy throughput with / without the slow destination: {ratio:.3f}"
        f" (medians; round by round {', '.join(f'{x:.3f}' for x in per_round)})"
    )
    print(
        "healthy throughput with the slow destination / with it inactive (the same fan-out,"
        f" so only its slowness differs): {ratio_inactive:.3f}"
    )
    print(hostile_report)
    result: dict[str, Any] = {
        "events": events,
        "healthy_destinations": HEALTHY,
        "slow_seconds": SLOW_SECONDS,
        "healthy_per_s_without": round(without.per_s, 1),
        "healthy_per_s_with": round(with_slow.per_s, 1),
        "ratio_with_over_without": round(ratio, 3),
        "rounds": rounds,
        "ratio_with_over_without_by_round": per_round,
        "healthy_per_s_by_round": {
            phase: [round(b.per_s, 1) for b, _ in got] for phase, got in runs.items()
        },
        "healthy_per_s_tenth_inactive": round(inactive.per_s, 1),
        "ratio_with_over_tenth_inactive": round(ratio_inactive, 3),
        "slow_destination": slow,
        "rss_peak_mb": {"without": without.rss_mb[0], "with": with_slow.rss_mb[0]},
        "date": iso_now(),
        "machine": machine(),
        "receiver": recv.kind,
        "load_avg_1m": [load_before, load_after],
        **hostile,
    }
    if args.quick:
        result["quick"] = True
    write_named(NAME, result, quick=args.quick)
    return 0
