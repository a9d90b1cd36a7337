"""The hot queries, as the stores send them, read their indexes, not every delivery.

The scenario of ``bench/query_plans.py`` (``docs/query-plans.md`` shows it at
10,000,000 deliveries) at 200,000, 95 % finished: Herald's own store and service
make the due-delivery claim (also with saturated destinations excluded),
``next_due_at``, page 2 of ``GET /v2/event-destinations/{id}/event-deliveries``
with a status filter, a replay dry run's count and the retention purge's
selection, the overview's last error of a failing destination and page 2 of the
portal's events list; the statements they send are recorded at the driver and explained with
the parameters they were sent with. PostgreSQL's tables are analysed; SQLite's are
not, as Herald runs no ``ANALYZE`` on it.
"""

from __future__ import annotations

import time
from itertools import chain

import asyncpg
from bench.query_plans import QUERIES, Explained, Shape, plans_for

from herald.crypto import SecretBox
from herald.model import Event, OutboxRow, RelayPlan
from herald.store.postgres import PostgresStore
from tests.support.databases import create_postgres_database, drop_postgres_database

ROWS = 200_000
PENDING = {"herald_deliveries_pending"}
"""The partial index of pending deliveries, in ``next_attempt_at`` order after ``held``."""
LISTING = {
    "herald_deliveries_destination",
    "herald_deliveries_tenant",
    "herald_deliveries_pkey",
    "sqlite_autoindex_herald_deliveries_1",
    "herald_deliveries_failed",
}
"""Indexes a backward walk from the cursor can read: (destination_id, id), (tenant_id, id), id,
and on SQLite (id, created_at) of the failed deliveries alone (the listing asks for
status=failure)."""
ATTEMPT_KEY = {"herald_attempts_pkey", "sqlite_autoindex_herald_attempts_1"}
EXPECTED: dict[str, set[str]] = {
    "claim_due": PENDING,
    "claim_due_excluding": PENDING,
    "next_due_at": PENDING,
    "list_deliveries": LISTING,
    "count_deliveries": {"herald_deliveries_destination", "herald_deliveries_tenant"},
    "purge_select": {"herald_deliveries_outcomes"},
    "last_failed_attempt": {"herald_deliveries_destination"},
    "list_events": {"herald_events_ingested"},
}


def _params(plan: Explained) -> list[object]:
    return list(
        chain.from_iterable(p if isinstance(p, list) else [p] for p in plan.statement.params)
    )


async def test_the_stores_statements_read_their_indexes(database_url: str) -> None:
    plans = await plans_for(database_url, Shape(rows=ROWS, now=time.time()))
    assert set(plans) == set(QUERIES)
    # The calls are the ones meant: the claim that skips saturated destinations, and
    # the listing with every filter the endpoint sets and a cursor.
    assert Shape.destination(0) in _params(plans["claim_due_excluding"])
    assert Shape.destination(0) not in _params(plans["claim_due"])
    listing = plans["list_deliveries"].statement.sql
    for clause in ("d.tenant_id =", "d.destination_id =", "d.status =", "d.id <", "LIMIT"):
        assert clause in listing, listing
    assert "COUNT(*)" in plans["count_deliveries"].statement.sql
    for name, plan in plans.items():
        shown = "\n".join([plan.statement.sql, *plan.plan])
        # herald_flow holds a row per destination under flow control (none here): read
        # whole, it is the claim's cheapest way to its gates (docs/flow-control.md).
        assert not [f for f in plan.full_scans if "herald_flow" not in f], shown
        assert set(plan.indexes) & EXPECTED[name], shown
    # Each listed delivery's last attempt: a primary-key probe, not a scan of attempts.
    assert set(plans["list_deliveries"].indexes) & ATTEMPT_KEY, plans["list_deliveries"].plan


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

    def ingest(rows: list[OutboxRow], existing: set[tuple[str, str]]) -> RelayPlan:
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
