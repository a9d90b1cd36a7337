"""Throughput on the SQLite default: N pre-loaded outbox events to one webhook destination.

Phases, each under a hard time limit: start the receiver; set Herald up
(migrate, create a ``whsec_``-signed webhook destination subscribed to ``*``,
run until it is ``active``, stop); pre-load N outbox rows in one transaction;
start ``herald run`` and wait until N event deliveries are ``success``; check
the rows; run the ceiling loop against the same receiver.

Herald's time runs from spawning ``herald run`` (start-up included) to the
last delivery's ``updated_at``; the relay's to the last event's
``ingested_at``. Both are Herald's own commit-time clocks, so the 0.2 s
polling only decides when to stop waiting.

Then the baselines (``bench/baselines.py``): Celery 5 and Dramatiq with a
Redis broker delivering the first 20,000 of the same signed events to the same nginx, timed
from the first enqueue to the last 2xx in nginx's access log; the result
file records Herald's rate divided by each. ``--quick`` is a small smoke run
whose result goes to ``bench/results/quick/``.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import baselines, ceiling, cpu, profile, receiver
from bench.common import (
    DEFAULT_PHASE_TIMEOUT,
    BenchError,
    Child,
    Deadline,
    Row,
    config_overrides,
    iso_now,
    log,
    machine,
    result_file,
    table,
    write_result,
)
from bench.daemon import HeraldInstance, vm_hwm_mb
from herald.config import auto_worker_processes

NAME = "throughput"
HELP = "deliveries per second on the SQLite default, against a bare-loop ceiling"
RESULT_FILE = "throughput_sqlite"
DEFAULT_EVENTS = 100_000
BASELINE_EVENTS = 20_000  # the size for Celery and Dramatiq (they are slow)
QUICK_EVENTS = 2_000
POLL_SECONDS = 0.2
PROGRESS_SECONDS = 5.0
DONE_SQL = "SELECT COUNT(*) FROM herald_deliveries WHERE status = 'success' AND kind = 'event'"
PROGRESS_SQL = "SELECT COALESCE(MAX(rowid), 0) FROM herald_attempts"
"""How far the run is, for one index probe: the attempts' rowids only grow (nothing is
purged during a run). :data:`DONE_SQL` scans every delivery (23 ms at 100,000 rows on a
slow guest): asked five times a second, it took a tenth of a core from the run it
measured, which the ceiling's loop does not pay. It is asked only once the attempts made
since the start reach the events."""
SECRET = "whsec_" + "YmVuY2gtc2VjcmV0LWJlbmNoLXNlY3JldC0zMmJ5dGU="  # 32 bytes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--events",
        type=int,
        default=None,
        help=f"events to deliver ({DEFAULT_EVENTS}; {QUICK_EVENTS} with --quick)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="small smoke run; result in bench/results/quick/"
    )
    parser.add_argument(
        "--no-baselines",
        dest="baselines",
        action="store_false",
        help="skip the Celery and Dramatiq baselines",
    )
    parser.add_argument(
        "--ceiling-events",
        type=int,
        default=None,
        help="requests for the ceiling loop (default: the same as --events)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_PHASE_TIMEOUT,
        help="hard limit per phase in seconds (%(default)s)",
    )
    parser.add_argument(
        "--receiver",
        choices=("auto", "nginx", "aiohttp"),
        default="auto",
        help="nginx (installed when missing and possible), aiohttp, or auto (%(default)s)",
    )
    parser.add_argument(
        "--profile",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="sample herald with py-spy for SECONDS during delivery; no result file is written",
    )
    parser.add_argument("--py-spy", help="py-spy binary (default: $PY_SPY or PATH)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a Herald config key (repeatable); no result file is written",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temp dir and print it")


def _count(conn: sqlite3.Connection, sql: str) -> int:
    return int(conn.execute(sql).fetchone()[0] or 0)


def _deliver(
    inst: HeraldInstance,
    events: int,
    deadline: Deadline,
    args: argparse.Namespace,
    recv: receiver.Receiver,
) -> tuple[float, float, float, cpu.Phase, dict[str, int]]:
    """Run Herald until all events are delivered: (seconds, relay seconds, RSS peak MiB,
    CPU over the delivery phase, the deliveries it took by hand-over and by claim).

    The delivery phase runs from the first poll that sees a delivery done to the
    last (start-up, the first relay batch and the stop excluded); its CPU is that
    of the daemon, of its attempt processes (its children) and of the receiver.
    """
    spy_bin = profile.find_py_spy(args.py_spy) if args.profile else None
    if args.profile and spy_bin is None:
        raise BenchError("--profile needs py-spy: pass --py-spy PATH or set $PY_SPY")
    conn = inst.reader()
    before = _count(conn, PROGRESS_SQL)  # the set-up's verification attempts
    child = inst.start()
    spy: Child | None = None
    meter = cpu.CpuMeter(
        {
            "daemon": cpu.only(child.pid),
            "workers": cpu.kids(child.pid),
            "receiver": cpu.tree(recv.pid) if recv.pid else list,
        }
    )
    first_done, t_first = 0, 0.0
    try:
        last_progress = time.monotonic()
        while True:
            if not child.alive():
                raise BenchError(f"herald run exited during delivery:\n{child.log_tail()}")
            # Attempted: in this run every attempt succeeds (_verify checks it after).
            done = _count(conn, PROGRESS_SQL) - before
            if done >= events and _count(conn, DONE_SQL) >= events:
                break
            if meter.started:
                meter.sample()
            elif done > 0:
                meter.start()
                first_done, t_first = done, time.monotonic()
            if spy_bin is not None and spy is None and done > 0:
                spy = profile.start_record(
                    spy_bin, child.pid, args.profile, inst.workdir / "profile.raw"
                )
            if time.monotonic() - last_progress >= PROGRESS_SECONDS:
                last_progress = time.monotonic()
                log(f"herald: {done}/{events} delivered")
            deadline.check(f"{done}/{events} delivered")
            time.sleep(POLL_SECONDS)
        if not meter.started:  # all done by the first poll that saw any: no phase to measure
            meter.start()
            first_done, t_first = events, time.monotonic()
        phase = cpu.Phase(
            events - first_done,
            time.monotonic() - t_first,
            meter.stop(),
            meter.machine_busy_s,
            meter.waits,
        )
        rss = vm_hwm_mb(child.pid)
        taken = inst.taken()
        if spy is not None:
            spy.proc.wait(timeout=args.profile + 30)
            spy.stop()
            raw = inst.workdir / "profile.raw"
            if raw.exists():
                print(f"\npy-spy, herald run ({args.profile:g} s):\n{profile.summarise(raw)}\n")
            else:
                log(f"py-spy wrote nothing:\n{spy.log_tail()}")
    except BaseException:
        if spy is not None:
            spy.stop(timeout=5)
        child.stop(timeout=10)
        raise
    finally:
        conn.close()
    inst.stop(child)
    last = inst.scalar("SELECT MAX(updated_at) FROM herald_deliveries WHERE kind = 'event'")
    relayed = inst.scalar("SELECT MAX(ingested_at) FROM herald_events WHERE id LIKE 'evt_bench%'")
    return float(last) - child.started_wall, float(relayed) - child.started_wall, rss, phase, taken


def _verify(inst: HeraldInstance, events: int) -> None:
    """The correctness guard: exactly N successful event deliveries and N attempts."""
    conn = inst.reader()
    try:
        found = {
            "event deliveries": _count(
                conn, "SELECT COUNT(*) FROM herald_deliveries WHERE kind = 'event'"
            ),
            "successful event deliveries": _count(conn, DONE_SQL),
            "event attempts": _count(
                conn,
                "SELECT COUNT(*) FROM herald_attempts a JOIN herald_deliveries d"
                " ON d.id = a.delivery_id WHERE d.kind = 'event'",
            ),
            "events": _count(conn, "SELECT COUNT(*) FROM herald_events WHERE id LIKE 'evt_bench%'"),
        }
        leftovers = {
            "outbox rows": _count(conn, "SELECT COUNT(*) FROM herald_outbox"),
            "rejected rows": _count(conn, "SELECT COUNT(*) FROM herald_outbox_rejected"),
        }
    finally:
        conn.close()
    wrong = [f"{k}: {v} (expected {events})" for k, v in found.items() if v != events]
    wrong += [f"{k}: {v} (expected 0)" for k, v in leftovers.items() if v]
    if wrong:
        raise BenchError("correctness check failed: " + "; ".join(wrong))
    log(f"verified: {events} events, deliveries and attempts, all success")


def run(args: argparse.Namespace) -> int:
    from herald.config import DeliverySettings

    events: int = args.events or (QUICK_EVENTS if args.quick else DEFAULT_EVENTS)
    if events < 1:
        raise BenchError("--events must be at least 1")
    ceiling_events: int = args.ceiling_events or events
    overrides = config_overrides(args.set)
    load_before = os.getloadavg()[0]
    concurrency = DeliverySettings().max_concurrency
    keep_dir = tempfile.mkdtemp(prefix="herald-bench-") if args.keep else None
    with tempfile.TemporaryDirectory(prefix="herald-bench-") as scratch:
        workdir = Path(keep_dir or scratch)
        with receiver.start(args.receiver, workdir) as recv:
            log(f"receiver: {recv.kind} at {recv.url}")
            inst = HeraldInstance(workdir, overrides)
            setup = Deadline("setup", args.timeout)
            inst.migrate()
            dest_id = inst.create_webhook(recv.url, SECRET)
            inst.activate(dest_id, setup)
            load = inst.preload(events)
            log(f"pre-loaded {events} outbox rows in {load:.2f} s")
            herald_s, relay_s, rss, phase, taken = _deliver(
                inst, events, Deadline("delivery", args.timeout), args, recv
            )
            _verify(inst, events)
            log(f"ceiling: {ceiling_events} requests, concurrency {concurrency}")
            loop = ceiling.measure(
                recv.url,
                SECRET,
                events=ceiling_events,
                concurrency=concurrency,
                timeout=args.timeout,
            )
            top = loop.row
            baseline_events = min(events, BASELINE_EVENTS)
            extra = _baselines(recv, baseline_events, workdir, args) if args.baselines else {}
        if keep_dir:
            log(f"kept {workdir}")

    rows = [
        Row("herald (sqlite)", events, herald_s),
        Row("herald relay (outbox drain)", events, relay_s),
        top,
        *extra.values(),
    ]
    config = "SQLite default" if not overrides else "SQLite with " + " ".join(args.set)
    workers = overrides.get("delivery", {}).get("worker_processes", auto_worker_processes())
    config += f" ({workers} attempt process{'es' if workers != 1 else ''})"
    print(f"\nthroughput, {config}, receiver {recv.kind}; {machine()}")
    print(f"load average (1 min) before/after: {load_before:.2f}/{os.getloadavg()[0]:.2f}")
    if recv.note:
        print(f"note: {recv.note}")
    print(table(rows, top))
    for name, row in extra.items():
        print(f"herald / {name}: {rows[0].per_s / row.per_s:.2f}")
    cpu_us = cpu_per_delivery(phase)
    loop_us = loop.cpu_us_per_request
    print(
        f"\nCPU per delivery over the delivery phase ({phase.items} deliveries in"
        f" {phase.wall_seconds:.2f} s), µs: daemon {cpu_us['daemon']}, attempt processes"
        f" {cpu_us['workers']}, total {cpu_us['total']}; receiver {phase.us('receiver')};"
        f" the whole machine {phase.machine_us}"
    )
    ratio = cpu_us["total"] / loop_us if loop_us else 0.0
    print(f"bare loop per request: {loop_us} µs → Herald's total = {ratio:.2f}× the bare loop's")
    waits = {g: phase.waiting(g) for g in ("daemon", "workers", "receiver")}
    print(
        "waiting for a CPU (run queue, s per s of the phase): daemon {daemon}, attempt"
        " processes {workers}, receiver {receiver}".format(**waits)
    )
    all_taken = sum(taken.values()) or 1
    print(
        "deliveries the daemon took to attempt: "
        + ", ".join(f"by {via} {n} ({100 * n / all_taken:.0f} %)" for via, n in taken.items())
    )
    result: dict[str, Any] = {
        "herald_per_s": round(rows[0].per_s, 1),
        "ceiling_per_s": round(top.per_s, 1),
        "ratio_to_ceiling": round(rows[0].per_s / top.per_s, 4),
        "cpu_us_per_delivery": cpu_us,
        "ceiling_cpu_us_per_request": loop_us,
        "cpu_ratio_to_ceiling": round(ratio, 3),
        "cpu_phase": {
            "deliveries": phase.items,
            "seconds": round(phase.wall_seconds, 3),
            "receiver_us_per_delivery": phase.us("receiver"),
            "machine_busy_us_per_delivery": phase.machine_us,
            "run_queue_wait_per_s": waits,
            "note": "utime+stime from /proc over the delivery phase (first delivery seen to"
            " last); machine = /proc/stat busy time of every process on the host;"
            " run_queue_wait_per_s = seconds the group's threads waited for a CPU"
            " (schedstat) per second of the phase",
        },
        "deliveries_taken": taken,
        "relay_per_s": round(rows[1].per_s, 1),
        "rss_peak_mb": round(rss, 1),
        "events": events,
        "ceiling_events": ceiling_events,
        "concurrency": concurrency,
        "worker_processes": workers,
        "herald_seconds": round(herald_s, 3),
        "date": iso_now(),
        "machine": machine(),
        "receiver": recv.kind,
        "load_avg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }
    for name, row in extra.items():
        result[f"{name}_per_s"] = round(row.per_s, 1)
        result[f"herald_over_{name}"] = round(rows[0].per_s / row.per_s, 3)
        result[f"{name}_concurrency"] = row.name.rpartition(", ")[2]
    if extra:
        result["baseline_events"] = baseline_events
        result["baselines_note"] = (
            f"the first {baseline_events} of the same events, same nginx; clock from the"
            " first enqueue to the last 2xx in"
            " nginx's access log; Redis broker; tasks sign and POST with requests"
        )
    if args.quick:
        result["quick"] = True
    if overrides:
        result["overrides"] = overrides
        print(f"\n(--set {' '.join(args.set)}: not the default config; result file not written)")
        print(json.dumps(result, indent=2))
        return 0
    if args.profile:
        print("\n(--profile: py-spy slowed herald; result file not written)")
        return 0
    path = write_result(result_file(RESULT_FILE, quick=args.quick), result)
    print(f"\nwrote {path}")
    return 0


def cpu_per_delivery(phase: cpu.Phase) -> dict[str, float]:
    """``{"daemon", "workers", "total"}`` in µs per delivery over the phase."""
    return {
        "daemon": phase.us("daemon"),
        "workers": phase.us("workers"),
        "total": phase.us("daemon", "workers"),
    }


def _baselines(
    recv: receiver.Receiver, events: int, workdir: Path, args: argparse.Namespace
) -> dict[str, Row]:
    """Celery and Dramatiq on the same receiver and events: name -> measured row."""
    python = baselines.ensure_venv()
    out: dict[str, Row] = {}
    with baselines.redis(workdir) as (broker_url, note):
        log(f"baselines: broker {note}")
        for plan in baselines.plans(python):
            log(f"baseline {plan.name}: {events} events, {plan.concurrency}")
            out[plan.name] = baselines.run_one(
                python,
                plan,
                broker_url=broker_url,
                recv=recv,
                secret=SECRET,
                events=events,
                workdir=workdir,
                timeout=args.timeout,
            )
    return out
