"""A million deliveries waiting to be retried: does new traffic still flow?

One SQLite Herald with two signed webhook destinations on nginx: ``live``
(subscribed to the workload's event type) and ``dead`` (subscribed to
``backlog.only``, which no new event has). Measured twice in the same run,
first on the empty database, then after bulk-inserting the backlog:

1. burst — N new events pre-loaded (100,000: with 20,000 the burst lasted two
   seconds, a quarter of them the daemon's start, and the ratio swung between
   0.90 and 1.04 from run to run), deliveries/s to ``live`` (as ``throughput``);
2. steady — the ``latency`` producer (1,000 events/s for 30 s), p50…max;
3. Herald's peak RSS (VmHWM) in both runs;
4. the scheduling queries timed on their own connection with no daemon
   running (``bench/querytime.py``: the workers' claim, the next-due lookup,
   the metrics counts), through Herald's own store code.

The backlog is inserted directly with SQL (far faster than failing real
attempts): per delivery one ``herald_events`` row (type ``backlog.only``)
and one ``herald_deliveries`` row for ``dead`` in scheduled-retry state —
``pending``, 3 attempts made, ``next_attempt_at`` spread over the next
1-5 hours — without attempt rows (the due, claim and count queries do not
read them). 1,000,000 by default; if the first chunk shows the insert would
take longer than ``--insert-budget`` seconds, 200,000, and the output says so.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import receiver
from bench.common import (
    DEFAULT_PHASE_TIMEOUT,
    EVENT_TYPE,
    REPO_ROOT,
    TENANT,
    Deadline,
    grid,
    iso_ms,
    iso_now,
    load_avg,
    log,
    machine,
    payload,
    run_cmd,
    write_named,
)
from bench.daemon import HeraldInstance
from bench.latency import steady_json
from bench.runs import Burst, Steady, burst_range, setup_webhooks, steady
from bench.throughput import SECRET

NAME = "retry_backlog"
HELP = "1,000,000 scheduled retries: new-event throughput, latency, RSS, due-query time"
BACKLOG, FALLBACK, QUICK_BACKLOG = 1_000_000, 200_000, 50_000
EVENTS, QUICK_EVENTS = 100_000, 2_000
RATE, SECONDS = 1000.0, 30.0
QUICK_RATE, QUICK_SECONDS = 200.0, 5.0
CHUNK = 50_000
INSERT_BUDGET = 300.0
BACKLOG_TYPE = "backlog.only"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backlog", type=int, default=None, help=f"deliveries ({BACKLOG:,})")
    parser.add_argument("--events", type=int, default=None, help=f"burst size ({EVENTS:,})")
    parser.add_argument(
        "--insert-budget",
        type=float,
        default=INSERT_BUDGET,
        help="seconds the backlog insert may take before falling back to 200,000 (%(default)s)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="50,000 backlog, 2,000 burst, 5 s flow"
    )
    parser.add_argument("--timeout", type=float, default=DEFAULT_PHASE_TIMEOUT)


def insert_backlog(
    db_path: Path, dest_id: str, wanted: int, *, budget: float, fallback: int
) -> tuple[int, float, str]:
    """Bulk-insert scheduled retries; returns (rows inserted, seconds, note)."""
    conn = sqlite3.connect(db_path, isolation_level=None, timeout=30)
    now = time.time()
    created = iso_ms(now - 3600)
    target = wanted
    note = ""
    done = 0
    t0 = time.perf_counter()
    try:
        conn.execute("PRAGMA synchronous=OFF")  # the bench's own bulk load, not Herald's
        while done < target:
            n = min(CHUNK, target - done)
            ids = range(done, done + n)
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(
                "INSERT INTO herald_events (id, tenant_id, type, data, created_at, created_ts,"
                " ingested_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    (
                        f"evt_backlog{i:010d}",
                        TENANT,
                        BACKLOG_TYPE,
                        payload(i).decode(),
                        created,
                        now - 3600,
                        now - 3600,
                    )
                    for i in ids
                ),
            )
            conn.executemany(
                "INSERT INTO herald_deliveries (id, tenant_id, event_id, event_type,"
                " destination_id, kind, status, attempt_count, max_attempts, next_attempt_at,"
                " held, created_at, updated_at) VALUES"
                " (?, ?, ?, ?, ?, 'event', 'pending', 3, 11, ?, 0, ?, ?)",
                (
                    (
                        f"dlv_backlog{i:010d}",
                        TENANT,
                        f"evt_backlog{i:010d}",
                        BACKLOG_TYPE,
                        dest_id,
                        now + 3600 + (i * 7919 % 14_400),
                        now - 3600,
                        now - 600,
                    )
                    for i in ids
                ),
            )
            conn.execute("COMMIT")
            done += n
            elapsed = time.perf_counter() - t0
            if done == n and target > fallback and elapsed * target / done > budget:
                note = (
                    f"inserting {target:,} rows would take about {elapsed * target / done:.0f} s"
                    f" here (budget {budget:g} s): used {fallback:,} instead"
                )
                log(note)
                target = fallback
            if done % (CHUNK * 4) == 0:
                log(f"backlog: {done:,}/{target:,} inserted ({elapsed:.0f} s)")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return done, time.perf_counter() - t0, note


def _querytime(inst: HeraldInstance) -> dict[str, dict[str, float]]:
    argv = [sys.executable, "-m", "bench.querytime", "--config", str(inst.config_path)]
    out = run_cmd(argv, timeout=300, what="bench.querytime", cwd=REPO_ROOT)
    result: dict[str, dict[str, float]] = json.loads(out.strip().splitlines()[-1])
    return result


def run(args: argparse.Namespace) -> int:
    quick = args.quick
    wanted = args.backlog or (QUICK_BACKLOG if quick else BACKLOG)
    events = args.events or (QUICK_EVENTS if quick else EVENTS)
    rate, seconds = (QUICK_RATE, QUICK_SECONDS) if quick else (RATE, SECONDS)
    load_before = load_avg()
    bursts: dict[str, Burst] = {}
    flows: dict[str, Steady] = {}
    queries: dict[str, dict[str, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="herald-bench-") as scratch:
        workdir = Path(scratch)
        with receiver.start("auto", workdir) as recv:
            inst = HeraldInstance(workdir)
            _live, dead = setup_webhooks(
                inst,
                [recv.base + "/live", recv.base + "/dead"],
                SECRET,
                Deadline("setup", args.timeout),
                [[EVENT_TYPE], [BACKLOG_TYPE]],
            )
            inserted, insert_s, note = 0, 0.0, ""
            for case, offset in (("empty", 0), ("backlog", 20_000_000)):
                if case == "backlog":
                    log(f"inserting {wanted:,} scheduled retries")
                    inserted, insert_s, note = insert_backlog(
                        inst.db_path, dead, wanted, budget=args.insert_budget, fallback=FALLBACK
                    )
                    log(f"backlog: {inserted:,} rows in {insert_s:.1f} s")
                queries[case] = _querytime(inst)
                log(f"{case}: queries {queries[case]}")
                inst.preload(events, start=offset)
                bursts[case] = burst_range(
                    inst,
                    start=offset,
                    events=events,
                    deliveries=events,
                    deadline=Deadline(f"burst {case}", args.timeout),
                )
                log(f"{case}: burst {bursts[case].per_s:,.0f}/s")
                flows[case] = steady(
                    [inst],
                    recv,
                    "/live",
                    rate=rate,
                    seconds=seconds,
                    start=offset + 10_000_000,
                    deadline=Deadline(f"steady {case}", seconds + args.timeout),
                )
                log(f"{case}: steady {flows[case].latency}")
            pending = inst.db.count(
                "SELECT COUNT(*) FROM herald_deliveries WHERE status = 'pending'"
                " AND destination_id = ?",
                (dead,),
            )
            db_mb = sum(p.stat().st_size for p in workdir.glob("herald.db*")) / 2**20
    load_after = load_avg()
    empty, full = bursts["empty"], bursts["backlog"]
    print(f"\nretry backlog, SQLite, {inserted:,} scheduled retries; {machine()}")
    if note:
        print(f"NOTE: {note}")
    print(f"load average (1 min) before/after: {load_before}/{load_after}")
    print(
        grid(
            [
                "case",
                "burst/s",
                "p50 ms",
                "p95 ms",
                "p99 ms",
                "max ms",
                "RSS MiB",
                "claim ms",
                "next_due ms",
                "counts ms",
            ],
            [
                [
                    case,
                    bursts[case].per_s,
                    flows[case].latency["p50_ms"],
                    flows[case].latency["p95_ms"],
                    flows[case].latency["p99_ms"],
                    flows[case].latency["max_ms"],
                    max(max(bursts[case].rss_mb), max(flows[case].rss_mb)),
                    queries[case]["claim_due"]["median_ms"],
                    queries[case]["next_due_at"]["median_ms"],
                    queries[case]["delivery_counts"]["median_ms"],
                ]
                for case in ("empty", "backlog")
            ],
        )
    )
    ratio = full.per_s / empty.per_s
    p99 = flows["backlog"].latency["p99_ms"] / flows["empty"].latency["p99_ms"]
    print(f"\nbacklog / empty: burst throughput {ratio:.3f}, steady p99 latency {p99:.2f}")
    result: dict[str, Any] = {
        "backlog_requested": wanted,
        "backlog_rows": inserted,
        "backlog_still_pending": pending,
        "backlog_insert_seconds": round(insert_s, 1),
        "backlog_note": note or None,
        "backlog_shape": "1 event + 1 pending delivery each (attempt_count 3, due in 1-5 h),"
        " no attempt rows",
        "database_mb": round(db_mb, 1),
        "burst_events": events,
        "steady_rate_per_s": rate,
        "steady_seconds": seconds,
        **{
            case: {
                "burst_per_s": round(bursts[case].per_s, 1),
                "steady": steady_json(flows[case]),
                "rss_peak_mb": max(max(bursts[case].rss_mb), max(flows[case].rss_mb)),
                "queries": queries[case],
            }
            for case in ("empty", "backlog")
        },
        "burst_ratio_backlog_over_empty": round(ratio, 3),
        "p99_ratio_backlog_over_empty": round(p99, 3),
        "date": iso_now(),
        "machine": machine(),
        "receiver": recv.kind,
        "load_avg_1m": [load_before, load_after],
    }
    if quick:
        result["quick"] = True
    write_named(NAME, result, quick=quick)
    return 0
