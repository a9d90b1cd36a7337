"""Throughput and latency on PostgreSQL with one and with three instances.

Each configuration gets a fresh database; three instances share it, the
same ``security.encryption_key`` and each its own ``api.listen``.

- throughput: the issue's scale-out, N events (20,000) pre-loaded in the
  outbox to 5 signed webhook destinations on nginx (5 N deliveries);
  deliveries/s from spawning the first instance to the last success (Herald's
  own ``updated_at``), as in ``throughput``. One destination would measure
  ``delivery.max_per_destination`` as much as the instances;
- latency: the steady producer of ``latency`` (1,000 events/s for 30 s) to one
  destination, as in ``latency``, so the two compare (five would make it
  5,000 deliveries/s, more than this machine delivers: queueing, not latency).

The ratio 3 ÷ 1 is what scaling out buys on this machine (2 cores: three
processes compete for the same CPUs as PostgreSQL and nginx).
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
    grid,
    iso_now,
    load_avg,
    log,
    machine,
    write_named,
)
from bench.daemon import HeraldInstance
from bench.db import Database, postgres_database
from bench.latency import LATENCY_HEADER, latency_row, steady_json
from bench.runs import Burst, Steady, burst, setup_webhooks, steady
from bench.throughput import SECRET

NAME = "postgres"
HELP = "throughput and latency on PostgreSQL, one instance vs three"
EVENTS, QUICK_EVENTS = 20_000, 2_000
DESTINATIONS = 5
RATE, SECONDS = 1000.0, 30.0
QUICK_RATE, QUICK_SECONDS = 200.0, 5.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--events", type=int, default=None, help=f"burst size ({EVENTS})")
    parser.add_argument("--rate", type=float, default=None, help=f"latency events/s ({RATE:g})")
    parser.add_argument("--seconds", type=float, default=None, help=f"latency run ({SECONDS:g})")
    parser.add_argument("--instances", default="1,3", help="instance counts (%(default)s)")
    parser.add_argument(
        "--destinations",
        type=int,
        default=DESTINATIONS,
        help="webhook destinations of the burst, each taking every event (%(default)s)",
    )
    parser.add_argument("--quick", action="store_true", help="2,000 events; 200 events/s for 5 s")
    parser.add_argument("--timeout", type=float, default=DEFAULT_PHASE_TIMEOUT)


def _instances(workdir: Path, count: int, db: Database) -> list[HeraldInstance]:
    first = HeraldInstance(workdir, db=db, name="herald-1")
    return [first, *(first.sibling(f"herald-{n}") for n in range(2, count + 1))]


def run(args: argparse.Namespace) -> int:
    events = args.events or (QUICK_EVENTS if args.quick else EVENTS)
    rate = args.rate or (QUICK_RATE if args.quick else RATE)
    seconds = args.seconds or (QUICK_SECONDS if args.quick else SECONDS)
    counts = [int(c) for c in args.instances.split(",")]
    dests = args.destinations
    load_before = load_avg()
    bursts: dict[int, Burst] = {}
    flows: dict[int, Steady] = {}
    with tempfile.TemporaryDirectory(prefix="herald-bench-") as scratch:
        workdir = Path(scratch)
        with receiver.start("auto", workdir) as recv:
            for count in counts:
                sub = workdir / f"burst-{count}"
                sub.mkdir()
                with postgres_database() as db:
                    insts = _instances(sub, count, db)
                    urls = [f"{recv.base}/burst-{count}/{i}" for i in range(dests)]
                    setup_webhooks(insts[0], urls, SECRET, Deadline("setup", args.timeout))
                    load = insts[0].preload(events)
                    log(f"{count} instance(s): pre-loaded {events} rows in {load:.2f} s")
                    bursts[count] = burst(
                        insts,
                        deliveries=events * dests,
                        events=events,
                        deadline=Deadline(f"burst x{count}", args.timeout),
                    )
                    log(f"{count} instance(s): {bursts[count].per_s:,.0f} deliveries/s")
            for n, count in enumerate(counts):
                sub = workdir / f"steady-{count}"
                sub.mkdir()
                with postgres_database() as db:
                    insts = _instances(sub, count, db)
                    path = f"/pg-{count}"
                    setup_webhooks(
                        insts[0], [recv.base + path], SECRET, Deadline("setup", args.timeout)
                    )
                    flows[count] = steady(
                        insts,
                        recv,
                        path,
                        rate=rate,
                        seconds=seconds,
                        start=(n + 1) * 10_000_000,
                        deadline=Deadline(f"latency x{count}", seconds + args.timeout),
                    )
                    log(f"{count} instance(s): {flows[count].latency}")
    load_after = load_avg()
    print(f"\nPostgreSQL, 1 vs 3 instances; {machine()}")
    print(f"receiver {recv.kind}; load average (1 min) before/after: {load_before}/{load_after}")
    print(f"\nthroughput, {events} pre-loaded events to {dests} webhooks:")
    print(
        grid(
            ["instances", "deliveries", "seconds", "deliveries/s", "relay ev/s", "RSS MiB each"],
            [
                [
                    f"x{c}",
                    b.deliveries,
                    round(b.seconds, 2),
                    b.per_s,
                    b.relay_per_s,
                    str(b.rss_mb),
                ]
                for c, b in bursts.items()
            ],
        )
    )
    print(f"\nlatency at {rate:g} events/s for {seconds:g} s to one webhook:")
    print(grid(LATENCY_HEADER, [latency_row(f"x{c}", s) for c, s in flows.items()]))
    result: dict[str, Any] = {
        "events": events,
        "destinations": dests,
        "deliveries": events * dests,
        "rate_per_s": rate,
        "seconds": seconds,
        "throughput": {
            f"x{c}": {
                "per_s": round(b.per_s, 1),
                "relay_per_s": round(b.relay_per_s, 1),
                "seconds": round(b.seconds, 3),
                "rss_peak_mb": b.rss_mb,
            }
            for c, b in bursts.items()
        },
        "latency": {f"x{c}": steady_json(s) for c, s in flows.items()},
        "date": iso_now(),
        "machine": machine(),
        "receiver": recv.kind,
        "load_avg_1m": [load_before, load_after],
    }
    if 1 in bursts and 3 in bursts:
        ratio = bursts[3].per_s / bursts[1].per_s
        result["throughput_3_over_1"] = round(ratio, 3)
        print(f"\nthroughput 3 / 1 instances: {ratio:.2f}")
    if 1 in flows and 3 in flows:
        p99 = flows[3].latency["p99_ms"] / flows[1].latency["p99_ms"]
        p50 = flows[3].latency["p50_ms"] / flows[1].latency["p50_ms"]
        result["latency_p50_3_over_1"] = round(p50, 3)
        result["latency_p99_3_over_1"] = round(p99, 3)
        print(f"latency 3 / 1 instances: p50 {p50:.2f}, p99 {p99:.2f}")
    if args.quick:
        result["quick"] = True
    write_named(NAME, result, quick=args.quick)
    return 0
