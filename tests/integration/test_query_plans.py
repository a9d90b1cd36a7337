"""The hot queries read their partial indexes, so their cost does not grow with history.

PostgreSQL: 200,000 deliveries, 95 % finished, analysed; the due-delivery
claim, the per-destination listing and retention must plan index scans.
SQLite: the same queries must name their indexes in EXPLAIN QUERY PLAN.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from herald.crypto import SecretBox
from herald.model import Event, OutboxRow, RelayPlan
from herald.store.postgres import PostgresStore
from herald.store.sqlite import SQLiteStore
from tests.support.databases import create_postgres_database, drop_postgres_database

DUE = (
    "SELECT id FROM herald_deliveries WHERE status = 'pending' AND held = 0"
    " AND next_attempt_at <= {now} ORDER BY next_attempt_at LIMIT 512"
)
LISTING = (
    "SELECT id FROM herald_deliveries d WHERE d.destination_id = 'evtd_7'"
    " AND d.id < 'dlv_5' ORDER BY d.id DESC LIMIT 21"
)
RETENTION = (
    "SELECT id FROM herald_deliveries WHERE status <> 'pending' AND updated_at < 100"
    " ORDER BY updated_at LIMIT 5000"
)


@pytest.fixture
async def pg() -> AsyncIterator[asyncpg.Connection]:
    url = await create_postgres_database()
    store = PostgresStore(url, box=SecretBox(b"k" * 32), pool_size=2)
    await store.open()
    await store.close()
    conn = await asyncpg.connect(url)
    try:
        yield conn
    finally:
        await conn.close()
        await drop_postgres_database(url)


async def test_postgres_plans_use_the_indexes(pg: asyncpg.Connection) -> None:
    await pg.execute(
        "INSERT INTO herald_deliveries (id, tenant_id, event_id, event_type, destination_id,"
        " kind, status, attempt_count, max_attempts, next_attempt_at, held, created_at,"
        " updated_at)"
        " SELECT 'dlv_' || lpad(g::text, 8, '0'), 't', 'evt_' || g, 'a.b',"
        " 'evtd_' || (g % 50), 'event',"
        " CASE WHEN g % 20 = 0 THEN 'pending' ELSE 'success' END, 1, 11,"
        " CASE WHEN g % 20 = 0 THEN g::float8 ELSE NULL END, 0, g, g"
        " FROM generate_series(1, 200000) g"
    )
    await pg.execute("ANALYZE herald_deliveries")
    plans = {}
    for name, sql in (
        ("due", DUE.format(now=5000)),
        ("listing", LISTING),
        ("retention", RETENTION),
    ):
        rows = await pg.fetch("EXPLAIN " + sql)
        plans[name] = "\n".join(r[0] for r in rows)
    assert "herald_deliveries_due" in plans["due"] or "herald_deliveries_pending" in plans["due"]
    # Either the (destination_id, id) index or a backward scan of the primary key
    # that stops after the page: both bounded, neither a full scan.
    assert "Index" in plans["listing"], plans["listing"]
    assert "herald_deliveries_finished" in plans["retention"], plans["retention"]
    for plan in plans.values():
        assert "Seq Scan" not in plan, plan


async def _events_scans(pg: asyncpg.Connection, store: PostgresStore) -> tuple[int, int]:
    """(sequential, index) scans of herald_events so far, the store's included."""
    async with store.pool.acquire() as own:
        await own.execute("SELECT pg_stat_force_next_flush()")  # flushed once it is idle
    await pg.execute("SELECT pg_stat_clear_snapshot()")
    row = await pg.fetchrow(
        "SELECT seq_scan, idx_scan FROM pg_stat_user_tables WHERE relname = 'herald_events'"
    )
    assert row is not None
    return int(row[0]), int(row[1] or 0)


async def test_postgres_statements_are_planned_for_the_table_as_it_is_now() -> None:
    """A statement the store ran while a table was nearly empty must not keep a plan
    made for that: the relay's existence check, run many times on a new database,
    still reads the index once herald_events holds 50,000 rows."""
    url = await create_postgres_database()
    store = PostgresStore(url, box=SecretBox(b"k" * 32), pool_size=1)
    await store.open()
    pg = await asyncpg.connect(url)

    def ingest(rows: list[OutboxRow], existing: set[str]) -> RelayPlan:
        return RelayPlan(
            events=[
                Event(r.id.decode(), "default", "a.b", "2026-11-22T10:00:00Z", 0.0, b"{}")
                for r in rows
                if r.id is not None
            ]
        )

    async def relay_batch(batch: int) -> None:
        await pg.execute(
            "INSERT INTO herald_outbox (id, type, data)"
            " SELECT 'evt_' || $1::int || '_' || g, 'a.b', '{}' FROM generate_series(1, 50) g",
            batch,
        )
        _, count = await store.relay(50, ingest)
        assert count == 50

    try:
        # A new database: PostgreSQL's own choice settles on a generic plan after five
        # runs, here a sequential scan, right for a table of a few hundred rows.
        for batch in range(10):
            await relay_batch(batch)
        await pg.execute(
            "INSERT INTO herald_events"
            " (id, tenant_id, type, data, created_at, created_ts, ingested_at)"
            " SELECT 'evt_old' || g, 'default', 'a.b', '{}', '2026-11-22T10:00:00Z', 0, 0"
            " FROM generate_series(1, 50000) g"
        )
        seq_before, idx_before = await _events_scans(pg, store)
        await relay_batch(10)
        seq_after, idx_after = await _events_scans(pg, store)
        assert seq_after == seq_before  # the 50,000 rows were not read
        assert idx_after > idx_before
    finally:
        await pg.close()
        await store.close()
        await drop_postgres_database(url)


async def test_sqlite_plans_use_the_indexes(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "h.db", box=SecretBox(b"k" * 32))
    await store.open()
    await store.close()
    conn = sqlite3.connect(tmp_path / "h.db")
    try:

        def plan(sql: str) -> str:
            return "\n".join(str(r[3]) for r in conn.execute("EXPLAIN QUERY PLAN " + sql))

        # Either partial index of pending rows serves the claim as a range scan.
        due = plan(DUE.format(now=5000))
        assert "herald_deliveries_due" in due or "herald_deliveries_pending" in due, due
        assert "herald_deliveries_destination" in plan(LISTING)
        assert "herald_deliveries_finished" in plan(RETENTION)
    finally:
        conn.close()
