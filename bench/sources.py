"""Outbox sources: how fast Herald drains a producer's own database, and how soon it
picks a row up, for a MariaDB source (polled), an external PostgreSQL source
(notified) and the built-in outbox, in one run.

Drain: N rows pre-loaded in one transaction, then ``herald run`` (on SQLite, no
destination: the relay alone) until N events are stored; the rate is N over the
span of the events' ``ingested_at`` (start-up left out). Pickup: rows written one
per transaction at ``--rate`` rows/s for a few seconds; each row's latency is its
event's ``ingested_at`` minus the moment the producer's commit returned. A polled
source that was idle polls every ``relay.idle_poll_seconds``: the first second of the
trickle is reported apart (its longest wait), beside the steady p99 after it.

MariaDB is the machine's server at 127.0.0.1:3306 (root, no password: ``make
services``); PostgreSQL the test server (``bench/db.py``). Each run makes its own
databases and drops them.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.common import (
    DEFAULT_PHASE_TIMEOUT,
    BenchError,
    Deadline,
    event_id,
    grid,
    iso_ms,
    iso_now,
    latency_summary,
    load_avg,
    log,
    machine,
    payload,
    write_named,
)
from bench.daemon import HeraldInstance
from bench.db import admin_dsn
from herald.config import RelaySettings
from herald.sourcedb.schema import outbox_ddl

NAME = "sources"
HELP = "drain rate and pickup latency of MariaDB and PostgreSQL outbox sources vs the built-in"
ROWS, QUICK_ROWS = 100_000, 5_000
RATE, PICKUP_SECONDS, QUICK_PICKUP_SECONDS = 500.0, 10.0, 3.0
IDLE_POLL_SECONDS = RelaySettings().idle_poll_seconds
"""How long an idle polled source waits between reads (the default, which the bench's
Herald runs with): the trickle's first rows may wait that long."""
INSERT_CHUNK = 1000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, default=None, help=f"rows to drain ({ROWS})")
    parser.add_argument("--rate", type=float, default=RATE, help="pickup rows/s (%(default)s)")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_ROWS} rows, short pickup")
    parser.add_argument("--timeout", type=float, default=DEFAULT_PHASE_TIMEOUT)


class Outbox:
    """Where the rows go: ``insert(rows, one_each)`` writes them as a producer would."""

    def __init__(self, name: str, mark: str, connect: Callable[[], Any], source: str = "") -> None:
        self.name = name
        self.mark = mark
        self.connect = connect
        self.source = source  # the [[outbox.sources]] URL; "" for the built-in outbox

    def insert(
        self, rows: list[tuple[str, str]], *, one_each: bool = False, rate: float = 0.0
    ) -> list[float]:
        """Insert (id, data) rows on one connection, all in one transaction or (with
        ``one_each``) one transaction each, at most ``rate`` a second; the time each
        commit returned."""
        marks = ", ".join([self.mark] * 3)
        sql = f"INSERT INTO herald_outbox (id, type, data) VALUES ({marks})"
        conn = self.connect()
        committed: list[float] = []
        started = time.monotonic()
        try:
            cur = conn.cursor()
            chunk = 1 if one_each else INSERT_CHUNK
            for n, i in enumerate(range(0, len(rows), chunk)):
                cur.executemany(sql, [(r[0], "bench.source", r[1]) for r in rows[i : i + chunk]])
                if one_each:
                    conn.commit()
                    committed.append(time.time())
                    if rate and (ahead := started + (n + 1) / rate - time.monotonic()) > 0:
                        time.sleep(ahead)
            conn.commit()
        finally:
            conn.close()
        return committed


@contextmanager
def mariadb() -> Iterator[Outbox]:
    import pymysql

    name = f"herald_bench_{uuid.uuid4().hex[:10]}"
    opts: dict[str, Any] = {"host": "127.0.0.1", "port": 3306, "user": "root", "password": ""}
    try:
        admin = pymysql.connect(**opts, autocommit=True)
    except pymysql.err.OperationalError as exc:
        raise BenchError(f"MariaDB at 127.0.0.1:3306 is needed (make services): {exc}") from exc
    admin.cursor().execute(f"CREATE DATABASE `{name}`")
    try:
        conn = pymysql.connect(**opts, database=name, autocommit=True)
        conn.cursor().execute(outbox_ddl("mysql").strip().removesuffix(";"))
        conn.close()
        yield Outbox(
            "MariaDB source (polled)",
            "%s",
            lambda: pymysql.connect(**opts, database=name),
            f"mysql://root@127.0.0.1:3306/{name}",
        )
    finally:
        admin.cursor().execute(f"DROP DATABASE IF EXISTS `{name}`")
        admin.close()


@contextmanager
def postgres() -> Iterator[Outbox]:
    import psycopg

    admin_url = admin_dsn()
    name = f"herald_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = f"{admin_url.rpartition('/')[0]}/{name}"
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(outbox_ddl("postgresql"))
        yield Outbox("PostgreSQL source (notified)", "%s", lambda: psycopg.connect(url), url)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def builtin(path: Path) -> Outbox:
    return Outbox("built-in outbox (SQLite)", "?", lambda: sqlite3.connect(path, timeout=30))


def _herald(workdir: Path, outbox: Outbox) -> HeraldInstance:
    workdir.mkdir()
    inst = HeraldInstance(workdir)
    if outbox.source:
        with inst.config_path.open("a") as fh:
            fh.write(f'[[outbox.sources]]\nname = "bench"\nurl = {json.dumps(outbox.source)}\n')
    inst.migrate()
    return inst


def _events(inst: HeraldInstance) -> tuple[int, float, float]:
    conn = inst.reader()
    try:
        count, first, last = conn.execute(
            "SELECT COUNT(*), MIN(ingested_at), MAX(ingested_at) FROM herald_events"
        ).fetchone()
    finally:
        conn.close()
    return int(count), float(first or 0), float(last or 0)


def _run(
    workdir: Path, outbox: Outbox, rows: int, pickup: float, rate: float, timeout: float
) -> dict[str, Any]:
    inst = _herald(workdir, outbox)
    if not outbox.source:
        outbox = builtin(inst.db_path)
    data = [(event_id(i), payload(i).decode()) for i in range(rows)]
    outbox.insert(data)
    child = inst.start()
    try:
        deadline = Deadline(f"drain {outbox.name}", timeout)
        while (found := _events(inst))[0] < rows:
            if not child.alive():
                raise BenchError(f"herald run exited:\n{child.log_tail()}")
            deadline.check(f"{found[0]}/{rows} relayed")
            time.sleep(0.2)
        _, first, last = found
        drain = rows / max(last - first, 1e-6)
        log(f"{outbox.name}: {rows} rows drained at {drain:,.0f}/s")
        # Pickup: one row per transaction at ``rate``/s.
        n = int(pickup * rate)
        trickle = [(event_id(rows + i), payload(rows + i).decode()) for i in range(n)]
        committed = outbox.insert(trickle, one_each=True, rate=rate)
        deadline = Deadline(f"pickup {outbox.name}", timeout)
        while _events(inst)[0] < rows + n:
            deadline.check("pickup rows relayed")
            time.sleep(0.2)
        conn = inst.reader()
        try:
            ingested = dict(
                conn.execute(
                    "SELECT id, ingested_at FROM herald_events WHERE id >= ?", (event_id(rows),)
                ).fetchall()
            )
        finally:
            conn.close()
        lat = [ingested[r[0]] - t for r, t in zip(trickle, committed, strict=True)]
        # A polled source idle since the drain polls every relay.idle_poll_seconds: the
        # trickle's first rows wait for that poll. What the trickle's first second saw
        # is reported apart from the steady pickup after it.
        warm_until = committed[0] + IDLE_POLL_SECONDS
        steady = [x for x, t in zip(lat, committed, strict=True) if t >= warm_until]
        from_idle = [x for x, t in zip(lat, committed, strict=True) if t < warm_until]
        inst.stop(child)
    finally:
        if child.alive():
            child.stop()
    return {
        "outbox": outbox.name,
        "rows": rows,
        "drain_per_s": round(drain),
        **latency_summary(lat),
        "steady": latency_summary(steady),
        "first_second_max_ms": round(max(from_idle, default=0.0) * 1000, 1),
    }


def run(args: argparse.Namespace) -> int:
    rows = args.rows or (QUICK_ROWS if args.quick else ROWS)
    pickup = QUICK_PICKUP_SECONDS if args.quick else PICKUP_SECONDS
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="herald-bench-sources-") as tmp:
        work = Path(tmp)
        results.append(
            _run(
                work / "builtin",
                Outbox("built-in outbox (SQLite)", "?", lambda: None),
                rows,
                pickup,
                args.rate,
                args.timeout,
            )
        )
        with mariadb() as outbox:
            results.append(_run(work / "mariadb", outbox, rows, pickup, args.rate, args.timeout))
        with postgres() as outbox:
            results.append(_run(work / "postgres", outbox, rows, pickup, args.rate, args.timeout))
    base = results[0]["drain_per_s"]
    for r in results:
        r["drain_vs_builtin"] = round(r["drain_per_s"] / base, 2)
    print(
        grid(
            [
                "outbox",
                "drain/s",
                "vs built-in",
                "pickup p50 ms",
                "p99 ms",
                "steady p99 ms",
                "1st second max ms",
            ],
            [
                [
                    r["outbox"],
                    r["drain_per_s"],
                    r["drain_vs_builtin"],
                    r["p50_ms"],
                    r["p99_ms"],
                    r["steady"]["p99_ms"],
                    r["first_second_max_ms"],
                ]
                for r in results
            ],
        )
    )
    write_named(
        NAME,
        {
            "benchmark": NAME,
            "at": iso_now(),
            "machine": machine(),
            "load_avg": load_avg(),
            "pickup_rate_per_s": args.rate,
            "started": iso_ms(time.time()),
            "results": results,
        },
        quick=args.quick,
    )
    return 0
