"""What an idle daemon costs on SQLite, and how soon it still sees a new outbox row.

A daemon on SQLite with one verified webhook and nothing to do: its CPU time (the
daemon and its worker processes, from ``/proc``) over a quiet spell, as a share
of one core. Then single rows, each its own transaction, at random gaps of 0.2–1.8 s
(a trickle: the daemon is quiet between them, often past the second after which
its commit check slows to every 50 ms): the pickup latency of each is the
delivery's ``created_at`` (written by the relay) minus the moment the producer's
commit returned.

SQLite cannot notify, so the relay is woken by a look at ``PRAGMA data_version``
(microseconds) and queries the outbox only after a commit. The baseline, in the
same run, is the relay querying the outbox on every look, as before that check
(``relay.idle_poll_seconds`` = ``relay.poll_interval_seconds``).

A third run is the default daemon with one outbox source of each kind (a SQLite file
watched by inotify, a MariaDB database polled, a PostgreSQL database listened to:
``bench sources``' databases, empty), to put the sources' idle cost beside the plain
daemon's; its PostgreSQL source's transactions over the quiet spell
(``pg_stat_database``) say how often an idle source is read.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import receiver
from bench.common import (
    DEFAULT_PHASE_TIMEOUT,
    TENANT,
    Child,
    Deadline,
    config_overrides,
    event_id,
    grid,
    iso_now,
    load_avg,
    log,
    machine,
    write_named,
)
from bench.daemon import HeraldInstance
from bench.runs import setup_webhooks
from bench.sources import mariadb, postgres
from bench.throughput import SECRET
from herald.sourcedb.schema import outbox_ddl

NAME = "idle"
HELP = "an idle daemon's CPU share on SQLite, and its pickup latency for a trickle of rows"
SECONDS, ROWS = 30.0, 120
QUICK_SECONDS, QUICK_ROWS = 8.0, 30
SETTLE_SECONDS = 3.0
# Gaps on both sides of the second after which the commit check slows down.
GAP_SECONDS = (0.2, 1.8)
TICKS = os.sysconf("SC_CLK_TCK")

# (label, overrides): the default, then the old behaviour as the baseline.
VARIANTS: list[tuple[str, dict[str, dict[str, object]]]] = [
    ("commit check (default)", {}),
    ("baseline: query every look", {"relay": {"idle_poll_seconds": 0.02}}),
]
WITH_SOURCES = "default + 3 outbox sources"
"""The run with one source of each dialect (the plain default is its baseline)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=None, help=f"idle spell ({SECONDS:g})")
    parser.add_argument("--rows", type=int, default=None, help=f"trickled rows ({ROWS})")
    parser.add_argument("--quick", action="store_true", help="an 8 s spell and 30 rows")
    parser.add_argument("--timeout", type=float, default=DEFAULT_PHASE_TIMEOUT)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="config override for both variants (repeatable); no result file then",
    )


@dataclass
class Idle:
    cpu_percent: float
    pickup_ms: dict[str, float]
    source_reads_per_s: float | None = None
    """The PostgreSQL source's transactions a second over the quiet spell."""


@dataclass
class Sources:
    """``[[outbox.sources]]`` TOML for one empty source of each dialect."""

    toml: str
    pg_name: str


@contextmanager
def three_sources(workdir: Path) -> Iterator[Sources]:
    with ExitStack() as stack:
        my = stack.enter_context(mariadb())
        pg = stack.enter_context(postgres())
        path = workdir / "producer.db"
        conn = sqlite3.connect(path)
        conn.execute("PRAGMA journal_mode = wal")
        conn.executescript(outbox_ddl("sqlite"))
        conn.close()
        toml = "".join(
            f'[[outbox.sources]]\nname = "{name}"\nurl = {json.dumps(url)}\n'
            for name, url in (("lite", f"sqlite:///{path}"), ("my", my.source), ("pg", pg.source))
        )
        yield Sources(toml, pg.source.rpartition("/")[2])


def pg_transactions(src: Sources) -> int:
    import psycopg

    from bench.db import admin_dsn

    with psycopg.connect(admin_dsn(), autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s",
            (src.pg_name,),
        ).fetchone()
    return int(row[0]) if row else 0


def cpu_seconds(pid: int) -> float:
    """User and system CPU of ``pid`` and its children (the worker processes)."""
    total = 0
    pids = [pid]
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if children.exists():
        pids += [int(p) for p in children.read_text().split()]
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rpartition(")")[2].split()
        except FileNotFoundError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICKS


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def trickle(inst: HeraldInstance, child: Child, rows: int, deadline: Deadline) -> list[float]:
    """Insert ``rows`` rows one by one; each one's pickup latency in milliseconds."""
    conn = sqlite3.connect(inst.db_path, isolation_level=None)
    conn.execute("PRAGMA busy_timeout=10000")
    committed: dict[str, float] = {}
    rng = random.Random(7)
    try:
        for i in range(rows):
            time.sleep(rng.uniform(*GAP_SECONDS))
            evt = event_id(50_000_000 + i)
            conn.execute(
                "INSERT INTO herald_outbox (id, tenant_id, type, data, created_at)"
                " VALUES (?, ?, 'bench.idle', ?, strftime('%Y-%m-%dT%H:%M:%fZ'))",
                (evt, TENANT, json.dumps({"n": i})),
            )
            committed[evt] = time.time()
            if not child.alive():
                raise RuntimeError(f"herald exited:\n{child.log_tail()}")
            deadline.check("trickle")
        picked: dict[str, float] = {}
        while len(picked) < rows:
            deadline.check(f"pickup: {len(picked)}/{rows}")
            picked = dict(
                conn.execute(
                    "SELECT event_id, MIN(created_at) FROM herald_deliveries"
                    " WHERE kind = 'event' GROUP BY event_id"
                ).fetchall()
            )
            time.sleep(0.1)
    finally:
        conn.close()
    return [(picked[e] - t) * 1000 for e, t in committed.items()]


def measure(
    workdir: Path,
    recv_url: str,
    overrides: dict[str, dict[str, object]],
    *,
    seconds: float,
    rows: int,
    timeout: float,
    sources: Sources | None = None,
) -> Idle:
    inst = HeraldInstance(workdir, overrides)
    if sources is not None:
        with inst.config_path.open("a") as fh:
            fh.write(sources.toml)
    setup_webhooks(inst, [recv_url], SECRET, Deadline("setup", timeout))
    child = inst.start()
    try:
        inst.wait_ready(child, Deadline("start", timeout))
        time.sleep(SETTLE_SECONDS)  # start-up work done; only the idle loops remain
        reads = pg_transactions(sources) if sources is not None else 0
        before, t0 = cpu_seconds(child.pid), time.monotonic()
        time.sleep(seconds)
        used, wall = cpu_seconds(child.pid) - before, time.monotonic() - t0
        if sources is not None:
            time.sleep(1.0)  # PostgreSQL's statistics are flushed about once a second
            reads = pg_transactions(sources) - reads
        if not child.alive():
            raise RuntimeError(f"herald exited:\n{child.log_tail()}")
        pickups = trickle(inst, child, rows, Deadline("trickle", rows + timeout))
    finally:
        inst.stop(child)
    return Idle(
        cpu_percent=round(100 * used / wall, 3),
        pickup_ms={
            f"p{int(q * 100)}_ms": round(percentile(pickups, q), 1) for q in (0.5, 0.95, 0.99)
        }
        | {"max_ms": round(max(pickups), 1)},
        source_reads_per_s=None if sources is None else round(reads / wall, 2),
    )


def run(args: argparse.Namespace) -> int:
    seconds = args.seconds or (QUICK_SECONDS if args.quick else SECONDS)
    rows = args.rows or (QUICK_ROWS if args.quick else ROWS)
    extra = config_overrides(args.set)
    load_before = load_avg()
    results: dict[str, Idle] = {}
    with tempfile.TemporaryDirectory(prefix="herald-bench-") as scratch:
        workdir = Path(scratch)
        with receiver.start("auto", workdir) as recv:
            for n, (label, overrides) in enumerate(VARIANTS):
                sub = workdir / f"v{n}"
                sub.mkdir()
                merged = {k: {**v} for k, v in extra.items()}
                for section, values in overrides.items():
                    merged.setdefault(section, {}).update(values)
                results[label] = measure(
                    sub,
                    recv.base + f"/idle-{n}",
                    merged,
                    seconds=seconds,
                    rows=rows,
                    timeout=args.timeout,
                )
                log(f"{label}: {results[label]}")
            sub = workdir / "sources"
            sub.mkdir()
            with three_sources(sub) as srcs:
                results[WITH_SOURCES] = measure(
                    sub,
                    recv.base + "/idle-sources",
                    {k: {**v} for k, v in extra.items()},
                    seconds=seconds,
                    rows=rows,
                    timeout=args.timeout,
                    sources=srcs,
                )
            log(f"{WITH_SOURCES}: {results[WITH_SOURCES]}")
    load_after = load_avg()
    default, baseline = (results[label] for label, _ in VARIANTS)
    header = ["run", "CPU % of a core", "p50 ms", "p95 ms", "p99 ms", "max ms"]
    table = [[label, r.cpu_percent, *r.pickup_ms.values()] for label, r in results.items()]
    print(f"\nidle daemon on SQLite: {seconds:g} s quiet, then {rows} rows at 0.2-1.8 s gaps")
    print(f"{machine()}; load average (1 min) before/after: {load_before}/{load_after}")
    print(grid(header, table))
    ratio = round(default.cpu_percent / baseline.cpu_percent, 3) if baseline.cpu_percent else None
    print(f"CPU, default / baseline: {ratio}")
    with_sources = results[WITH_SOURCES]
    src_ratio = (
        round(with_sources.cpu_percent / default.cpu_percent, 3) if default.cpu_percent else None
    )
    print(
        f"CPU, with 3 sources / default: {src_ratio}; the idle PostgreSQL source's"
        f" transactions: {with_sources.source_reads_per_s}/s"
    )
    result: dict[str, Any] = {
        "seconds": seconds,
        "rows": rows,
        **{label: {"cpu_percent": r.cpu_percent, **r.pickup_ms} for label, r in results.items()},
        "cpu_default_over_baseline": ratio,
        "cpu_sources_over_default": src_ratio,
        "pg_source_transactions_per_s": with_sources.source_reads_per_s,
        "date": iso_now(),
        "machine": machine(),
        "load_avg_1m": [load_before, load_after],
    }
    if args.quick:
        result["quick"] = True
    if extra:
        print(f"\n(--set {' '.join(args.set)}: not the default config; result file not written)")
        return 0
    write_named(NAME, result, quick=args.quick)
    return 0
