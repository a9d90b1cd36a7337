"""A producer process writing a steady rate of events into ``herald_outbox``.

``python -m bench.producer --db-url URL --rate R --seconds S --start N`` inserts
event number ``start + i`` when its turn comes (``t0 + i / rate``), each in
its own transaction as a product would; when it falls behind (the database
was locked, the machine busy) it writes everything that is due in one
transaction, so the average rate stays ``R``. ``created_at`` is the wall clock
(microseconds) just before the insert. Prints one JSON line: how many rows,
when, and the worst lag behind the schedule.

SQLite connections use WAL's usual ``synchronous = NORMAL`` (the producer's
choice, not Herald's); PostgreSQL uses autocommit inserts.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import time
from typing import Any

from bench.common import EVENT_TYPE, TENANT, event_id, iso_us, payload

SQL = "INSERT INTO herald_outbox (id, tenant_id, type, data, created_at) VALUES (?, ?, ?, ?, ?)"


def _connect(url: str) -> tuple[Any, str]:
    if url.startswith("sqlite:///"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None, timeout=30)
        conn.execute("PRAGMA busy_timeout=30000")
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn, SQL
    import psycopg

    return psycopg.connect(url, autocommit=True), SQL.replace("?", "%s")


def produce(url: str, *, rate: float, seconds: float, start: int) -> dict[str, Any]:
    conn, sql = _connect(url)
    total = int(rate * seconds)
    datas = [payload(start + i).decode() for i in range(total)]
    sqlite = isinstance(conn, sqlite3.Connection)
    done = 0
    transactions = 0
    max_lag = 0.0
    t0 = time.perf_counter()
    wall0 = time.time()
    try:
        while done < total:
            elapsed = time.perf_counter() - t0
            due = min(total, int(elapsed * rate) + 1)
            if due <= done:
                time.sleep(max(0.0, (done / rate) - elapsed))
                continue
            max_lag = max(max_lag, elapsed - done / rate)
            stamp = iso_us(time.time())
            rows = [
                (event_id(start + i), TENANT, EVENT_TYPE, datas[i], stamp) for i in range(done, due)
            ]
            if len(rows) == 1:
                conn.execute(sql, rows[0])
            elif sqlite:
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany(sql, rows)
                conn.execute("COMMIT")
            else:
                with conn.transaction(), conn.cursor() as cur:
                    cur.executemany(sql, rows)
            transactions += 1
            done = due
    finally:
        conn.close()
    elapsed = time.perf_counter() - t0
    return {
        "inserted": done,
        "t0": wall0,
        "seconds": elapsed,
        "rate": done / elapsed if elapsed > 0 else 0.0,
        "transactions": transactions,
        "max_lag_ms": round(max_lag * 1000, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.producer")
    parser.add_argument("--db-url", required=True)
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--start", type=int, default=0)
    args = parser.parse_args()
    print(json.dumps(produce(args.db_url, rate=args.rate, seconds=args.seconds, start=args.start)))


if __name__ == "__main__":
    main()
