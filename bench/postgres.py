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

Over each burst's delivery phase (``bench/cpu.py``): the CPU per delivery of
the instances (daemons, attempt processes), of PostgreSQL's backends serving
Herald (``pg_stat_activity`` of the bench database, the bench's own
``herald-bench`` connections left out), of its WAL writer, checkpointer,
background writer and this database's autovacuum workers (shared with whatever
else uses the server), of nginx, and of the whole machine; and over the whole
burst, from spawning the first instance to stopping the last, WAL bytes per
delivery (``pg_current_wal_lsn()``, cluster-wide: other databases' writes
included; the rate of a quiet two seconds before is printed beside it) and
transactions and rows written per delivery (``pg_stat_database``; the server
has no ``pg_stat_statements``). Sampled at each poll: Herald's connections (the
most seen) and the share of them waiting on a lock.

The capacity model (``bench/capacity.py``, docs/scaling.md) takes the smallest
fleet's CPU per delivery and predicts each fleet's rate; the table prints it
beside the measurement with its error. ``--pin`` runs instance k on CPU
k mod nproc (``taskset``), so a fleet of N has N × 1 core of its own and
PostgreSQL and nginx run where they can; ``--no-latency`` skips the latency
runs.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench import capacity, cpu, receiver
from bench.common import (
    DEFAULT_PHASE_TIMEOUT,
    BenchError,
    Child,
    Deadline,
    grid,
    iso_now,
    load_avg,
    log,
    machine,
    nproc,
    write_named,
)
from bench.daemon import HeraldInstance
from bench.db import APPLICATION_NAME, CONNECT_TIMEOUT, Database, postgres_database
from bench.latency import LATENCY_HEADER, latency_row, steady_json
from bench.runs import Burst, Steady, burst, setup_webhooks, steady
from bench.throughput import SECRET

NAME = "postgres"
HELP = "throughput and latency on PostgreSQL, one instance vs three"
EVENTS, QUICK_EVENTS = 20_000, 2_000
DESTINATIONS = 5
RATE, SECONDS = 1000.0, 30.0
QUICK_RATE, QUICK_SECONDS = 200.0, 5.0
QUIET_SECONDS = 2.0


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
    parser.add_argument(
        "--pin", action="store_true", help="instance k on CPU k mod nproc only (taskset)"
    )
    parser.add_argument(
        "--no-latency", dest="latency", action="store_false", help="skip the latency runs"
    )
    parser.add_argument("--timeout", type=float, default=DEFAULT_PHASE_TIMEOUT)


def _instances(
    workdir: Path, count: int, db: Database, *, pin: bool = False
) -> list[HeraldInstance]:
    first = HeraldInstance(workdir, db=db, name="herald-1")
    insts = [first, *(first.sibling(f"herald-{n}") for n in range(2, count + 1))]
    if pin:
        for k, inst in enumerate(insts):
            inst.cpus = (k % nproc(),)
    return insts


BACKENDS_SQL = (
    "SELECT pid, coalesce(wait_event_type, '') FROM pg_stat_activity WHERE datname = %s"
    " AND backend_type = 'client backend' AND application_name <> %s"
)
BACKGROUND_SQL = (
    "SELECT pid FROM pg_stat_activity WHERE backend_type IN"
    " ('walwriter', 'checkpointer', 'background writer')"
    " OR (backend_type = 'autovacuum worker' AND datname = %s)"
)
COUNTERS_SQL = (
    "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0'), xact_commit + xact_rollback,"
    " tup_inserted + tup_updated + tup_deleted FROM pg_stat_database WHERE datname = %s"
)
GONE_TIMEOUT = 15.0


class PgWatch:
    """PostgreSQL's side of a burst, on one connection of its own (``herald-bench``)."""

    def __init__(self, db: Database) -> None:
        import psycopg

        self.db = db
        self.conn = psycopg.connect(
            db.url,
            autocommit=True,
            connect_timeout=CONNECT_TIMEOUT,
            application_name=APPLICATION_NAME,
        )
        self.max_connections = 0
        self.samples = 0
        self.lock_waits = 0

    def close(self) -> None:
        self.conn.close()

    def backends(self) -> list[int]:
        """Herald's backends now; counts them and those waiting on a lock."""
        rows = self.conn.execute(BACKENDS_SQL, (self.db.name, APPLICATION_NAME)).fetchall()
        self.max_connections = max(self.max_connections, len(rows))
        self.samples += len(rows)
        self.lock_waits += sum(1 for _, wait in rows if wait == "Lock")
        return [int(pid) for pid, _ in rows]

    def background(self) -> list[int]:
        rows = self.conn.execute(BACKGROUND_SQL, (self.db.name,)).fetchall()
        return [int(r[0]) for r in rows]

    def counters(self) -> tuple[float, int, int]:
        """(WAL position in bytes, transactions, rows written) of the database."""
        row = self.conn.execute(COUNTERS_SQL, (self.db.name,)).fetchone()
        if row is None:
            raise BenchError(f"no pg_stat_database row for {self.db.name}")
        return float(row[0]), int(row[1]), int(row[2])

    def wal_rate(self, seconds: float) -> float:
        """WAL bytes/s written by the whole server over ``seconds`` (nothing of ours runs)."""
        start = self.counters()[0]
        time.sleep(seconds)
        return (self.counters()[0] - start) / seconds

    def wait_gone(self) -> None:
        """Until Herald's backends have exited (their statistics are flushed on exit)."""
        deadline = time.monotonic() + GONE_TIMEOUT
        while self.conn.execute(
            BACKENDS_SQL.replace("pid, coalesce(wait_event_type, '')", "count(*)"),
            (self.db.name, APPLICATION_NAME),
        ).fetchone() != (0,):
            if time.monotonic() > deadline:
                log("PostgreSQL backends still there after the instances stopped")
                return
            time.sleep(0.1)

    def groups(
        self, children: Sequence[Child], recv: receiver.Receiver
    ) -> Mapping[str, cpu.Finder]:
        pids = [c.pid for c in children]
        return {
            "daemon": lambda: pids,
            "workers": lambda: [k for p in pids for k in cpu.children(p)],
            "postgres": self.backends,
            "postgres_background": self.background,
            "receiver": cpu.tree(recv.pid) if recv.pid else list,
        }


@contextlib.contextmanager
def pg_watch(db: Database) -> Iterator[PgWatch]:
    watch = PgWatch(db)
    try:
        yield watch
    finally:
        watch.close()


def burst_figures(
    b: Burst,
    *,
    instances: int,
    cores: float,
    before: tuple[float, int, int],
    after: tuple[float, int, int],
    quiet_wal_per_s: float,
    watch: PgWatch,
) -> dict[str, Any]:
    """The CPU and PostgreSQL figures of one burst, per delivery."""
    phase = b.phase
    if phase is None or phase.items == 0:
        raise BenchError("the burst had no delivery phase to measure")
    ours = sum(phase.cpu_seconds.values())
    instance_s = phase.cpu_seconds["daemon"] + phase.cpu_seconds["workers"]
    return {
        "cpu_us_per_delivery": {
            "daemon": phase.us("daemon"),
            "workers": phase.us("workers"),
            "total": phase.us("daemon", "workers"),
        },
        "postgres_cpu_us_per_delivery": phase.us("postgres"),
        "postgres_background_us_per_delivery": phase.us("postgres_background"),
        "receiver_us_per_delivery": phase.us("receiver"),
        "machine_busy_us_per_delivery": phase.machine_us,
        "other_cores": round(max(0.0, phase.machine_busy_seconds - ours) / phase.wall_seconds, 2),
        "herald_pg_nginx_cores": round(ours / phase.wall_seconds, 3),
        "instance_utilisation": round(instance_s / (phase.wall_seconds * instances * cores), 3),
        "phase_deliveries": phase.items,
        "phase_seconds": round(phase.wall_seconds, 3),
        "phase_per_s": round(phase.items / phase.wall_seconds, 1),
        "wal_bytes_per_delivery": round((after[0] - before[0]) / b.deliveries, 1),
        "wal_quiet_bytes_per_s": round(quiet_wal_per_s),
        "transactions_per_delivery": round((after[1] - before[1]) / b.deliveries, 3),
        "rows_written_per_delivery": round((after[2] - before[2]) / b.deliveries, 3),
        "connections_max": watch.max_connections,
        "lock_wait_share": round(watch.lock_waits / watch.samples, 4) if watch.samples else 0.0,
    }


def model_rows(
    figures: Mapping[int, Mapping[str, Any]],
    measured: Mapping[int, float],
    *,
    cores: Mapping[int, float],
) -> dict[int, dict[str, Any]]:
    """Each fleet's rate as the capacity model predicts it from the smallest fleet's costs."""
    base_n = min(figures)
    base = figures[base_n]
    costs = capacity.Costs(
        instance_us=base["cpu_us_per_delivery"]["total"],
        postgres_us=base["postgres_cpu_us_per_delivery"],
        other_us=base["receiver_us_per_delivery"] + base["postgres_background_us_per_delivery"],
        wal_bytes=base["wal_bytes_per_delivery"],
    )
    base_us = sum(
        base[k]
        for k in (
            "postgres_cpu_us_per_delivery",
            "postgres_background_us_per_delivery",
            "receiver_us_per_delivery",
        )
    )
    base_us += base["cpu_us_per_delivery"]["total"]
    out: dict[int, dict[str, Any]] = {}
    for n, fig in figures.items():
        # What the fleet, PostgreSQL and nginx got of the machine in this run, spent at
        # the smallest fleet's CPU per delivery: tests that the cost per delivery does
        # not grow with the fleet (claims, locks, connections), whatever the machine's load.
        used = fig["herald_pg_nginx_cores"]
        at_base_cost = round(used * 1e6 / base_us, 1)
        host = max(0.5, nproc() - fig["other_cores"])
        fleet = capacity.Fleet(
            instances=n,
            cores_per_instance=cores[n],
            postgres_cores=nproc(),
            instance_utilisation=min(1.0, base["instance_utilisation"]),
            host_cores=host,
        )
        got = capacity.predict(costs, fleet)
        out[n] = {
            "predicted_per_s": got.per_s,
            "limit": got.limit,
            "caps": got.caps,
            "host_cores_free": round(host, 2),
            "error": round(capacity.error(got.per_s, measured[n]), 3),
            "cores_used": used,
            "at_base_cost_per_s": at_base_cost,
            "at_base_cost_error": round(capacity.error(at_base_cost, measured[n]), 3),
            "from": f"x{base_n}",
        }
    return out


def run(args: argparse.Namespace) -> int:
    events = args.events or (QUICK_EVENTS if args.quick else EVENTS)
    rate = args.rate or (QUICK_RATE if args.quick else RATE)
    seconds = args.seconds or (QUICK_SECONDS if args.quick else SECONDS)
    counts = [int(c) for c in args.instances.split(",")]
    dests = args.destinations
    load_before = load_avg()
    bursts: dict[int, Burst] = {}
    flows: dict[int, Steady] = {}
    figures: dict[int, dict[str, Any]] = {}
    cores: dict[int, float] = {}
    with tempfile.TemporaryDirectory(prefix="herald-bench-") as scratch:
        workdir = Path(scratch)
        with receiver.start("auto", workdir) as recv:
            for count in counts:
                sub = workdir / f"burst-{count}"
                sub.mkdir()
                with postgres_database() as db, pg_watch(db) as watch:
                    insts = _instances(sub, count, db, pin=args.pin)
                    cores[count] = len(insts[0].cpus) or nproc()
                    urls = [f"{recv.base}/burst-{count}/{i}" for i in range(dests)]
                    setup_webhooks(insts[0], urls, SECRET, Deadline("setup", args.timeout))
                    load = insts[0].preload(events)
                    log(f"{count} instance(s): pre-loaded {events} rows in {load:.2f} s")
                    quiet = watch.wal_rate(QUIET_SECONDS)
                    before = watch.counters()
                    bursts[count] = burst(
                        insts,
                        deliveries=events * dests,
                        events=events,
                        deadline=Deadline(f"burst x{count}", args.timeout),
                        cpu_groups=functools.partial(watch.groups, recv=recv),
                    )
                    watch.wait_gone()
                    figures[count] = burst_figures(
                        bursts[count],
                        instances=count,
                        cores=cores[count],
                        before=before,
                        after=watch.counters(),
                        quiet_wal_per_s=quiet,
                        watch=watch,
                    )
                    log(f"{count} instance(s): {bursts[count].per_s:,.0f} deliveries/s")
            for n, count in enumerate(counts if args.latency else []):
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
    fleets = " vs ".join(map(str, counts))
    print(f"\nPostgreSQL, {fleets} instances; {machine()}")
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
    pinned = " (pinned: instance k on CPU k mod nproc)" if args.pin else ""
    print(f"\nCPU per delivery over the delivery phase, µs{pinned}:")
    print(
        grid(
            [
                "instances",
                "daemon",
                "workers",
                "herald",
                "pg backends",
                "pg bg",
                "nginx",
                "machine",
                "other cores",
                "inst util",
            ],
            [
                [
                    f"x{c}",
                    f["cpu_us_per_delivery"]["daemon"],
                    f["cpu_us_per_delivery"]["workers"],
                    f["cpu_us_per_delivery"]["total"],
                    f["postgres_cpu_us_per_delivery"],
                    f["postgres_background_us_per_delivery"],
                    f["receiver_us_per_delivery"],
                    f["machine_busy_us_per_delivery"],
                    f["other_cores"],
                    f["instance_utilisation"],
                ]
                for c, f in figures.items()
            ],
        )
    )
    print("\nPostgreSQL per delivery (whole burst; WAL is cluster-wide):")
    print(
        grid(
            [
                "instances",
                "WAL bytes",
                "quiet WAL B/s",
                "transactions",
                "rows written",
                "connections",
                "lock waits",
            ],
            [
                [
                    f"x{c}",
                    f["wal_bytes_per_delivery"],
                    f["wal_quiet_bytes_per_s"],
                    f["transactions_per_delivery"],
                    f["rows_written_per_delivery"],
                    f["connections_max"],
                    f"{f['lock_wait_share']:.1%}",
                ]
                for c, f in figures.items()
            ],
        )
    )
    model = model_rows(figures, {c: f["phase_per_s"] for c, f in figures.items()}, cores=cores)
    print(
        "\ncapacity model (bench/capacity.py) from the smallest fleet's costs vs the rate"
        " measured over the delivery phase (start-up excluded, as in the model):"
    )
    print(
        grid(
            [
                "instances",
                "cores each",
                "phase/s",
                "predicted/s",
                "limit",
                "error",
                "cores used",
                "at x1 cost/s",
                "error",
            ],
            [
                [
                    f"x{c}",
                    cores[c],
                    figures[c]["phase_per_s"],
                    m["predicted_per_s"],
                    m["limit"],
                    f"{m['error']:+.1%}",
                    m["cores_used"],
                    m["at_base_cost_per_s"],
                    f"{m['at_base_cost_error']:+.1%}",
                ]
                for c, m in model.items()
            ],
        )
    )
    if flows:
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
                "cores_per_instance": cores[c],
                **figures[c],
                "model": model[c],
            }
            for c, b in bursts.items()
        },
        "pinned": args.pin,
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
    if args.pin or not args.latency or args.instances != "1,3":
        write_named(
            f"{NAME}_{'pinned_' if args.pin else ''}x{'_'.join(map(str, counts))}",
            result,
            quick=True,
        )
        return 0
    write_named(NAME, result, quick=args.quick)
    return 0
