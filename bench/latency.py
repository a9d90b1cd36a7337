"""Outbox-to-receiver latency under a steady flow, on SQLite and on PostgreSQL.

A producer process (``bench/producer.py``) writes a steady 1,000 events/s for
30 s into ``herald_outbox``, each row's ``created_at`` set at insert time, each
row its own transaction. nginx logs ``$msec $status $uri $http_webhook_id``
for every request (millisecond wall clock at the end of the request); latency
is that arrival minus ``created_at``, for every event (the first second
included: the daemon is started and ready before the producer begins).

SQLite: the relay polls the outbox (``relay.poll_interval_seconds``, 0.02 s).
PostgreSQL: an insert trigger ``NOTIFY``s the relay. Same machine, same
receiver, same run.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from bench import receiver
from bench.common import (
    DEFAULT_PHASE_TIMEOUT,
    Deadline,
    config_overrides,
    grid,
    iso_now,
    load_avg,
    log,
    machine,
    write_named,
)
from bench.daemon import HeraldInstance
from bench.db import database
from bench.runs import Steady, setup_webhooks, steady
from bench.throughput import SECRET

NAME = "latency"
HELP = "outbox-to-receiver latency percentiles at a steady 1,000 events/s (SQLite, PostgreSQL)"
RATE, SECONDS = 1000.0, 30.0
QUICK_RATE, QUICK_SECONDS = 200.0, 5.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rate", type=float, default=None, help=f"events/s ({RATE:g})")
    parser.add_argument("--seconds", type=float, default=None, help=f"duration ({SECONDS:g})")
    parser.add_argument(
        "--backends", default="sqlite,postgres", help="comma-separated (%(default)s)"
    )
    parser.add_argument("--quick", action="store_true", help="200 events/s for 5 s")
    parser.add_argument("--timeout", type=float, default=DEFAULT_PHASE_TIMEOUT)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="config override (repeatable); the result file is then not written",
    )


def latency_row(label: str, s: Steady) -> list[object]:
    lat = s.latency
    return [
        label,
        s.events,
        s.rate,
        lat["p50_ms"],
        lat["p95_ms"],
        lat["p99_ms"],
        lat["max_ms"],
        s.delivered_per_s,
        max(s.rss_mb),
    ]


LATENCY_HEADER = [
    "run",
    "events",
    "rate/s",
    "p50 ms",
    "p95 ms",
    "p99 ms",
    "max ms",
    "recv/s",
    "RSS MiB",
]


def steady_json(s: Steady) -> dict[str, Any]:
    return {
        "events": s.events,
        "producer_rate_per_s": s.rate,
        "producer_max_lag_ms": s.producer_max_lag_ms,
        **s.latency,
        "received_per_s": s.delivered_per_s,
        "rss_peak_mb": s.rss_mb,
    }


def run(args: argparse.Namespace) -> int:
    rate = args.rate or (QUICK_RATE if args.quick else RATE)
    seconds = args.seconds or (QUICK_SECONDS if args.quick else SECONDS)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    overrides = config_overrides(args.set)
    load_before = load_avg()
    results: dict[str, Steady] = {}
    with tempfile.TemporaryDirectory(prefix="herald-bench-") as scratch:
        workdir = Path(scratch)
        with receiver.start("auto", workdir) as recv:
            for n, kind in enumerate(backends):
                sub = workdir / kind
                sub.mkdir()
                with database(kind, sub) as db:
                    inst = HeraldInstance(sub, overrides, db=db)
                    path = f"/latency-{kind}"
                    setup_webhooks(
                        inst, [recv.base + path], SECRET, Deadline("setup", args.timeout)
                    )
                    results[kind] = steady(
                        [inst],
                        recv,
                        path,
                        rate=rate,
                        seconds=seconds,
                        start=n * 10_000_000,
                        deadline=Deadline(f"latency {kind}", seconds + args.timeout),
                    )
                    log(f"{kind}: {results[kind].latency}")
    load_after = load_avg()
    rows = [latency_row(f"herald ({kind})", s) for kind, s in results.items()]
    print(f"\nlatency, outbox -> receiver, {rate:g} events/s for {seconds:g} s; {machine()}")
    print(f"receiver {recv.kind}; load average (1 min) before/after: {load_before}/{load_after}")
    print(grid(LATENCY_HEADER, rows))
    result: dict[str, Any] = {
        "rate_per_s": rate,
        "seconds": seconds,
        **{kind: steady_json(s) for kind, s in results.items()},
        "date": iso_now(),
        "machine": machine(),
        "receiver": recv.kind,
        "load_avg_1m": [load_before, load_after],
    }
    if "sqlite" in results and "postgres" in results:
        result["p99_postgres_over_sqlite"] = round(
            results["postgres"].latency["p99_ms"] / results["sqlite"].latency["p99_ms"], 3
        )
    if args.quick:
        result["quick"] = True
    if overrides:
        print(f"\n(--set {' '.join(args.set)}: not the default config; result file not written)")
        return 0
    write_named(NAME, result, quick=args.quick)
    return 0
