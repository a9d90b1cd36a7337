"""Ordered delivery's cost (docs/ordering.md): one webhook destination, unordered and
ordered per key with 1, 10 and 1,000 keys, ``--events`` each (50,000).

Each phase is a fresh Herald (SQLite by default) with the default config: the
destination is made active, the events are pre-loaded into the outbox in one
transaction (event i has key ``k{i % keys}``), and the rate is the deliveries over
the time from spawning ``herald run`` to the last delivery's ``updated_at``, as in
``bench throughput``. The figure is each ordered rate over the unordered one, measured
in the same run (the goal: at least 0.8 with 1,000 keys). With one key the deliveries
go one at a time: the rate is bound by the receiver's latency (a round trip plus a
recording), not by Herald's throughput.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import receiver
from bench.common import (
    DEFAULT_PHASE_TIMEOUT,
    EVENT_TYPE,
    TENANT,
    Deadline,
    event_id,
    grid,
    iso_ms,
    iso_now,
    load_avg,
    log,
    machine,
    payload,
    write_named,
)
from bench.daemon import HeraldInstance
from bench.db import database
from bench.runs import Burst, burst
from bench.throughput import SECRET

NAME = "ordering"
HELP = "an ordered destination with 1, 10 and 1,000 keys vs the same unordered"
EVENTS, QUICK_EVENTS = 50_000, 2_000
PHASES: tuple[tuple[str, int], ...] = (
    ("unordered", 0),
    ("1 key", 1),
    ("10 keys", 10),
    ("1,000 keys", 1000),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--events", type=int, default=None, help=f"events a phase ({EVENTS})")
    parser.add_argument("--backend", default="sqlite", choices=("sqlite", "postgres"))
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_EVENTS} events a phase")
    parser.add_argument(
        "--one-key-events",
        type=int,
        default=None,
        help="events of the 1-key phase (default: as --events; it is latency-bound)",
    )
    parser.add_argument("--timeout", type=float, default=DEFAULT_PHASE_TIMEOUT)


def phase(
    name: str,
    keys: int,
    workdir: Path,
    recv: receiver.Receiver,
    *,
    backend: str,
    events: int,
    timeout: float,
) -> Burst:
    sub = workdir / name.replace(",", "").replace(" ", "-")
    sub.mkdir()
    with database(backend, sub) as db:
        inst = HeraldInstance(sub, db=db)
        inst.migrate()
        body: dict[str, Any] = {
            "name": name,
            "type": "webhook",
            "events": ["*"],
            "webhook": {"url": f"{recv.base}/ordering-{sub.name}", "secret": SECRET},
            "ordering": "key" if keys else "none",
        }
        dest = inst.create_destination(body)
        inst.activate(dest, Deadline("setup", timeout))
        stamp = iso_ms(time.time())
        sql = db._sql(
            "INSERT INTO herald_outbox (id, tenant_id, type, data, created_at, ordering_key)"
            " VALUES (?, ?, ?, ?, ?, ?)"
        )
        rows = [
            (
                event_id(i),
                TENANT,
                EVENT_TYPE,
                payload(i).decode(),
                stamp,
                f"k{i % keys}" if keys else None,
            )
            for i in range(events)
        ]
        with db.connect() as conn:
            if db.kind == "sqlite":
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany(sql, rows)
                conn.execute("COMMIT")
            else:
                with conn.transaction(), conn.cursor() as cur:
                    cur.executemany(sql, rows)
        log(f"{name}: {events} events preloaded")
        return burst(
            [inst],
            deliveries=events,
            events=events,
            deadline=Deadline(f"ordering {name}", timeout),
        )


def run(args: argparse.Namespace) -> int:
    events = args.events or (QUICK_EVENTS if args.quick else EVENTS)
    one_key = args.one_key_events or events
    load_before = load_avg()
    results: dict[str, Burst] = {}
    with tempfile.TemporaryDirectory(prefix="herald-bench-") as scratch:
        workdir = Path(scratch)
        with receiver.start("auto", workdir) as recv:
            for name, keys in PHASES:
                n = one_key if keys == 1 else events
                results[name] = phase(
                    name,
                    keys,
                    workdir,
                    recv,
                    backend=args.backend,
                    events=n,
                    timeout=args.timeout,
                )
                log(f"{name}: {results[name].per_s:,.0f} deliveries/s")
    load_after = load_avg()
    base = results["unordered"].per_s
    ratios = {name: round(b.per_s / base, 3) if base else 0.0 for name, b in results.items()}
    print(
        f"\nordering ({args.backend}): one webhook destination, {events} events a phase"
        f" (1 key: {one_key}); {machine()}"
    )
    print(f"receiver {recv.kind}; load average (1 min) before/after: {load_before}/{load_after}")
    print(
        grid(
            ["phase", "events", "seconds", "deliveries/s", "/ unordered"],
            [
                [name, b.events, round(b.seconds, 2), round(b.per_s), ratios[name]]
                for name, b in results.items()
            ],
        )
    )
    print(
        "1 key: one delivery at a time, so its rate is bound by the receiver's latency"
        " (round trip + recording), not by Herald's throughput."
    )
    result: dict[str, Any] = {
        "backend": args.backend,
        "events": events,
        "one_key_events": one_key,
        **{
            name: {"seconds": round(b.seconds, 3), "per_s": round(b.per_s, 1)}
            for name, b in results.items()
        },
        "ratios": ratios,
        "date": iso_now(),
        "machine": machine(),
        "receiver": recv.kind,
        "load_avg_1m": [load_before, load_after],
    }
    if args.quick:
        result["quick"] = True
    write_named(f"{NAME}_{args.backend}", result, quick=args.quick)
    return 0
