"""Upgrading a database Herald has used: every row survives a migration, on both backends.

Each test makes a new database and applies the migrations up to the one before the
migration under test (the store, with its list of migrations cut short), fills it
the way an older Herald would have, then opens it with every migration shipped.
"""

from __future__ import annotations

import re
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from herald.crypto import SecretBox, generate_key, parse_key
from herald.ids import new_id
from herald.ingest import Reject, parse_row
from herald.model import (
    Attempt,
    AttemptRecord,
    DeliveryKind,
    DeliveryStatus,
    Event,
    NewDelivery,
    OutboxRow,
    Outcome,
    Rejection,
    RelayPlan,
)
from herald.store import Store
from herald.store import postgres as postgres_store
from herald.store import sqlite as sqlite_store
from herald.store.postgres import PostgresStore
from herald.store.sqlite import SQLiteStore
from tests.integration.test_store import destination
from tests.support.databases import BACKENDS, create_postgres_database, drop_postgres_database
from tests.support.sql import Db

UNIQUE_VIOLATION = (sqlite3.IntegrityError, psycopg.errors.UniqueViolation)


OldStore = Callable[[], AbstractAsyncContextManager[Store]]


def shipped_version() -> int:
    """The newest migration shipped."""
    return max(version for version, _, _ in sqlite_store.migrations())


OLD_RELAY_REJECT = {
    # Keyed by seq alone; the source ($9, always the built-in's here) is not stored.
    "sqlite": "INSERT OR REPLACE INTO herald_outbox_rejected (seq, id, tenant_id, type, data,"
    " created_at, reason, rejected_at) SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8 WHERE ?9 IS NOT NULL",
    "postgres": "INSERT INTO herald_outbox_rejected (seq, id, tenant_id, type, data, created_at,"
    " reason, rejected_at) SELECT $1, $2, $3, $4, $5, $6, $7, $8 WHERE $9::text IS NOT NULL"
    " ON CONFLICT (seq) DO UPDATE SET reason = EXCLUDED.reason,"
    " rejected_at = EXCLUDED.rejected_at",
}
"""``relay_reject`` as a Herald before 0015 (outbox sources) wrote it."""


@asynccontextmanager
async def database_at(
    version: int, backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Db, OldStore, Callable[[], Store]]]:
    """A new database migrated up to ``version`` only; a plain connection to it; an
    opened store on it that migrates no further (an older Herald); and a maker of
    (unopened) stores on it that apply every migration shipped."""
    box = SecretBox(parse_key(generate_key()))
    module: Any = sqlite_store if backend == "sqlite" else postgres_store
    if backend == "sqlite":
        path = tmp_path / "old.db"
        url = f"sqlite:///{path}"

        def make() -> Store:
            return SQLiteStore(path, box=box)
    else:
        url = await create_postgres_database()

        def make() -> Store:
            return PostgresStore(url, box=box, pool_size=2)

    shipped = module.migrations()

    @asynccontextmanager
    async def older() -> AsyncIterator[Store]:
        with monkeypatch.context() as m:  # the migrations it knows, while it opens
            m.setattr(module, "migrations", lambda: [s for s in shipped if s[0] <= version])
            store = make()
            if version < 20:
                unflowed(store)
            if version < 19:
                unordered(store)
            if version < 16:
                unrecorded(store)
            if version < 13:
                untraced(store)
            if version < 15:  # before 0015 a rejected row had no source: the built-in's
                queries = store.dialect._q
                store.dialect._q = {**queries, "relay_reject": OLD_RELAY_REJECT[backend]}
            if version < 10:  # the relay of a Herald before 0010 read no about_destination
                queries = store.dialect._q
                claim = queries["relay_claim"].replace("about_destination,", "NULL,")
                store.dialect._q = {**queries, "relay_claim": claim}
            await store.open()
        try:
            assert await store.schema_version() == version
            yield store
        finally:
            await store.close()

    db: Db | None = None
    try:
        async with older():
            pass
        db = Db(url, timeout=5.0)
        yield db, older, make
    finally:
        if db is not None:
            db.close()
        if backend == "postgres":
            await drop_postgres_database(url)


def trim_rows(store: Store, method: str, widths: dict[str, int]) -> None:
    """Make ``store``'s dialect send only the first ``widths[name]`` values of each row
    it writes with ``method`` (``insert_many``, ``executemany``) for statement ``name``:
    the columns an older Herald did not have."""
    inner = getattr(store.dialect, method)

    async def send(conn: Any, name: str, rows: Iterable[Sequence[Any]]) -> None:
        width = widths.get(name)
        await inner(conn, name, rows if width is None else [tuple(r)[:width] for r in rows])

    setattr(store.dialect, method, send)


def swap(store: Store, edits: dict[str, list[tuple[str, str]]]) -> None:
    """Make ``store`` send named queries as an older Herald did: in each, each ``(old,
    new)`` of ``edits[name]`` replaced (the pairs of both dialects: each finds its own)."""
    queries = dict(store.dialect._q)
    for name, pairs in edits.items():
        sql = queries[name]
        for before, after in pairs:
            sql = sql.replace(before, after)
        assert sql != queries[name], f"{name}: no edit applies"
        queries[name] = sql
    store.dialect._q = queries


def unflowed(store: Store) -> None:
    """Make ``store`` a Herald before 0020: its deliveries are stored without a lane
    (``flow``, the 14th value of each row, left out)."""
    swap(
        store,
        {
            "insert_deliveries": [
                (", order_seq, flow", ", order_seq"),
                (", ?13, ?14", ", ?13"),
                (", $13::int8[], $14::int[]", ", $13::int8[]"),
            ],
            "destination_statuses": [
                (
                    "EXISTS (SELECT 1 FROM herald_flow f"
                    " WHERE f.destination_id = herald_destinations.id)",
                    "0",
                )
            ],
        },
    )
    trim_rows(store, "insert_many", {"insert_deliveries": 13})


def unordered(store: Store) -> None:
    """Make ``store`` a Herald before 0019: no ordering key on outbox rows, events and
    deliveries, no ordering on destinations (the last values of their rows left out)."""
    dialect = store.dialect
    queries = dialect._q
    dialect._q = {
        **queries,
        "relay_claim": re.sub(
            r",\s*(CAST|convert_to)\(ordering_key[^)]*\)", "", queries["relay_claim"]
        ),
        "insert_events": queries["insert_events"]
        .replace(", ordering_key)", ")")
        .replace(", ?9)", ")")
        .replace(", $9::text[])", ")"),
        "insert_deliveries": queries["insert_deliveries"]
        .replace(", ordering_key, order_seq", "")
        .replace(", ?12, ?13", "")
        .replace(", $12::text[], $13::int8[]", ""),
        "destination_statuses": queries["destination_statuses"].replace(
            "id, status, ordering", "id, status, 'none'"
        ),
        "finish_attempts": queries["finish_attempts"]
        .replace("(ordering_key IS NULL OR lease_owner IS NULL OR lease_owner = ?7)", "?7 IS ?7")
        .replace(
            "(ordering_key IS NULL OR lease_owner IS NULL OR lease_owner = $7)",
            "($7::text IS NULL OR $7::text IS NOT NULL)",
        ),
    }
    trim_rows(store, "insert_many", {"insert_events": 8, "insert_deliveries": 11})


def untraced(store: Store) -> None:
    """Make ``store`` a Herald before 0013: its relay reads no ``traceparent`` and its
    events are stored without one (the 8th value of each row is left out)."""
    dialect = store.dialect
    queries = dialect._q
    dialect._q = {
        **queries,
        "relay_claim": re.sub(
            r"(CAST|convert_to)\(traceparent[^)]*\)", "NULL", queries["relay_claim"]
        ),
        "insert_events": queries["insert_events"]
        .replace(", traceparent)", ")")
        .replace(", ?8)", ")")
        .replace(", $8::text[])", ")"),
    }
    trim_rows(store, "insert_many", {"insert_events": 7})


def unrecorded(store: Store) -> None:
    """Make ``store`` a Herald before 0016: its attempts are stored without what they
    sent (``exchange``, the 10th value of each row, left out)."""
    swap(store, {"insert_attempts": [(", exchange)", ")"), (", ?10)", ")"), (", $10)", ")")]})
    trim_rows(store, "executemany", {"insert_attempts": 9})


def ingest(rows: list[OutboxRow], existing: set[tuple[str, str]]) -> RelayPlan:
    """A relay pass's plan: each row an event (no destinations), or a rejection."""
    plan = RelayPlan()
    for row in rows:
        try:
            event = parse_row(row, max_payload_bytes=1 << 20)
            if (event.tenant_id, event.id) in existing:
                raise Reject("duplicate_id", f"event {event.id} was already ingested")
            plan.events.append(event)
        except Reject as rej:
            plan.rejected.append(
                Rejection(
                    seq=row.seq,
                    id=None if row.id is None else row.id.decode(),
                    tenant_id=None,
                    type=None,
                    data=None,
                    created_at=None,
                    reason=str(rej),
                )
            )
    return plan


def produce(db: Db, rows: list[tuple[str, str, str]]) -> None:
    """Outbox rows (id, tenant_id, data) as a producer writes them."""
    db.executemany(
        "INSERT INTO herald_outbox (id, tenant_id, type, data, created_at)"
        " VALUES (?, ?, 'a.b', ?, '2026-11-22T10:00:00Z')",
        rows,
    )


def snapshot(db: Db, *, widths: dict[str, int] | None = None) -> dict[str, list[str]]:
    """Every row of every table but the migrations' own, in a comparable form. With
    ``widths`` (an earlier snapshot's :func:`widths_of`), only the tables and columns
    there were then: later migrations add tables, and columns at the end."""
    if db.backend == "sqlite":
        query = "SELECT name FROM sqlite_master WHERE type = 'table'"
    else:
        query = "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
    tables = sorted(r[0] for r in db.execute(query) if r[0] != "herald_schema_migrations")
    if widths is not None:
        tables = [t for t in tables if t in widths]
    return {
        t: sorted(
            repr(tuple(row)[: None if widths is None else widths.get(t)])
            for row in db.execute(f"SELECT * FROM {t}")
        )
        for t in tables
    }


def widths_of(db: Db) -> dict[str, int]:
    """How many columns each table has now."""
    if db.backend == "sqlite":
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {t: len(db.execute(f"PRAGMA table_info({t})")) for t in tables}
    rows = db.execute(
        "SELECT table_name, COUNT(*) FROM information_schema.columns"
        " WHERE table_schema = 'public' GROUP BY table_name"
    )
    return {str(t): int(n) for t, n in rows}


async def fill(store: Store, db: Db) -> None:
    """What a Herald at the older schema stores: a destination, events with deliveries
    and attempts, relayed and rejected outbox rows, keys, idempotency, rate windows."""
    now = time.time()
    dest = replace(destination(), tenant_id="acme")
    await store.create_destination(dest, verification=None)
    events = [
        Event(f"evt_old{i}", "acme", "a.b", "2026-11-22T10:00:00Z", now, b'{"i":%d}' % i)
        for i in range(3)
    ]
    deliveries = [
        NewDelivery(
            new_id("dlv_"), "acme", e.id, e.type, dest.id, DeliveryKind.EVENT, 3, now, False, now
        )
        for e in events
    ]
    await store.insert_deliveries(events, deliveries)
    attempt = Attempt(new_id("att_"), deliveries[0].id, 1, now, 2.0, Outcome.SUCCESS, 200)
    await store.record_attempts([AttemptRecord(attempt, DeliveryStatus.SUCCESS, None, None)])
    # As a schema-8 Herald wrote it (0012 adds the kind, 'tenant' for every older key).
    db.execute(
        "INSERT INTO herald_api_keys (hash, tenant_id, hint, created_at) VALUES (?, ?, ?, ?)",
        ("f" * 64, "acme", "ffff", now),
    )
    await store.idempotency_begin(tenant_id="acme", key="k", fingerprint="fp", now=now, ttl=60)
    await store.count_request(tenant_id="acme", window_no=7, expire=False)
    # Relayed rows (one of them rejected) leave the outbox; their seqs stay taken.
    produce(db, [("evt_r1", "acme", "{}"), ("bad_r2", "acme", "{}"), ("evt_r3", "globex", "{}")])
    _, count = await store.relay(100, ingest)
    assert count == 3


@pytest.mark.parametrize("backend", BACKENDS)
async def test_event_ids_per_tenant_keeps_every_row_of_a_schema_8_database(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """0009 (event ids unique per tenant) rebuilds SQLite's outbox and events tables
    and re-keys PostgreSQL's: every row of every table is still there, as it was, and
    the outbox's rows still waiting are relayed after it."""
    async with database_at(8, backend, tmp_path, monkeypatch) as (db, older, make):
        async with older() as old:
            await fill(old, db)
        # Rows waiting in the outbox through the upgrade, one of them invalid.
        produce(db, [("evt_w1", "acme", '{"w":1}'), ("evt_w2", "default", "[]")])
        before = snapshot(db)
        widths = widths_of(db)
        for table in ("herald_outbox", "herald_outbox_rejected", "herald_events"):
            assert before[table], table

        store = make()
        await store.open()
        try:
            assert await store.schema_version() == shipped_version()
            assert snapshot(db, widths=widths) == before
            key = await store.api_key("f" * 64)
            assert key is not None
            assert key.tenant_id == "acme"
            plan, count = await store.relay(100, ingest)
            assert count == 2
            assert [e.id for e in plan.events] == ["evt_w1"]
            assert [r.id for r in plan.rejected] == ["evt_w2"]
            # The new key: another tenant may use an id, the same tenant may not.
            produce(db, [("evt_old0", "globex", '{"t":"globex"}')])
            with pytest.raises(UNIQUE_VIOLATION):
                produce(db, [("evt_old0", "globex", "{}")])
            _, count = await store.relay(100, ingest)
            assert count == 1
            mine = await store.get_event("acme", "evt_old0")
            theirs = await store.get_event("globex", "evt_old0")
            assert mine is not None
            assert theirs is not None
            assert (orjson.loads(mine.data), orjson.loads(theirs.data)) == (
                {"i": 0},
                {"t": "globex"},
            )
        finally:
            await store.close()


@pytest.mark.parametrize("backend", BACKENDS)
async def test_the_rebuilt_outbox_never_gives_a_seq_out_twice(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The relay empties the outbox as it goes, so at the upgrade it often holds no row
    while herald_outbox_rejected keeps the seqs of rejected ones. A rebuilt SQLite table
    that started its sequence again would hand those seqs out anew, and the next
    rejection of such a row would overwrite the old one."""
    async with database_at(8, backend, tmp_path, monkeypatch) as (db, older, make):
        async with older() as old:
            produce(db, [("bad_1", "acme", "{}"), ("bad_2", "acme", "{}")])
            _, count = await old.relay(100, ingest)
            assert count == 2
        assert db.scalar("SELECT COUNT(*) FROM herald_outbox") == 0
        taken = db.scalar("SELECT MAX(seq) FROM herald_outbox_rejected")

        store = make()
        await store.open()
        try:
            produce(db, [("bad_3", "acme", "{}")])
            assert db.scalar("SELECT seq FROM herald_outbox") > taken
            _, count = await store.relay(100, ingest)
            assert count == 1
        finally:
            await store.close()
        rejected = db.execute("SELECT id FROM herald_outbox_rejected ORDER BY seq")
        assert [r[0] for r in rejected] == ["bad_1", "bad_2", "bad_3"]


@pytest.mark.parametrize("backend", BACKENDS)
async def test_replays_and_tokens_keep_every_row_of_a_schema_9_database(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """0011 adds herald_replays, herald_session_tokens and a replay_id (NULL) on every
    delivery: every row of every table is there as it was, and old deliveries replay."""
    async with database_at(9, backend, tmp_path, monkeypatch) as (db, older, make):
        async with older() as old:
            await fill(old, db)
        before, widths = snapshot(db), widths_of(db)
        assert before["herald_deliveries"]

        store = make()
        await store.open()
        try:
            assert await store.schema_version() == shipped_version()
            # The same rows; the deliveries' replay_id (NULL) is among the new columns.
            assert snapshot(db, widths=widths) == before
            assert db.scalar("SELECT COUNT(*) FROM herald_deliveries WHERE replay_id IS NULL") == (
                len(before["herald_deliveries"])
            )
            assert db.scalar("SELECT COUNT(*) FROM herald_replays") == 0
            assert db.scalar("SELECT COUNT(*) FROM herald_session_tokens") == 0
            ids = [r[0] for r in db.execute("SELECT id FROM herald_deliveries")]
            assert await store.requeue(ids, now=time.time(), replay_id="rpl_x") == len(ids)
            assert db.scalar(
                "SELECT COUNT(*) FROM herald_deliveries WHERE replay_id = 'rpl_x'"
            ) == len(ids)
        finally:
            await store.close()


@pytest.mark.parametrize("backend", BACKENDS)
async def test_operational_events_keep_every_row_of_a_schema_9_database(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """0010 (operational events) adds the destinations' signal state and the outbox's
    ``about_destination``: every row stays as it was, healthy, verified, not Herald's."""
    async with database_at(9, backend, tmp_path, monkeypatch) as (db, older, make):
        async with older() as old:
            await fill(old, db)
        produce(db, [("evt_w1", "acme", '{"w":1}')])
        before, widths = snapshot(db), widths_of(db)
        store = make()
        await store.open()
        try:
            assert await store.schema_version() == shipped_version()
            assert snapshot(db, widths=widths) == before
            assert db.execute(
                "SELECT consecutive_failures, failing_since, verification_failed_at,"
                " verification_error FROM herald_destinations"
            ) == [(0, None, None, None)]
            assert db.execute("SELECT about_destination FROM herald_outbox") == [(None,)]
            _, count = await store.relay(100, ingest)
            assert count == 1
        finally:
            await store.close()


@pytest.mark.parametrize("backend", BACKENDS)
async def test_the_flow_lane_takes_the_pending_deliveries_of_a_schema_19_database(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """0020 (the flow lane) puts the pending event deliveries of a destination under flow
    control in its lane: every row stays as it was, and the claim gives that backlog out
    at its rate while the other destination's comes out whole."""
    async with database_at(19, backend, tmp_path, monkeypatch) as (db, older, make):
        now = time.time()
        paced = replace(destination(), tenant_id="acme", rate_limit_per_second=1.0)
        free = replace(destination(), tenant_id="acme")
        events = [
            Event(f"evt_f{i}", "acme", "a.b", "2026-11-22T10:00:00Z", now, b"{}") for i in range(5)
        ]
        async with older() as old:
            await old.create_destination(paced, verification=None)
            await old.create_destination(free, verification=None)
            await old.insert_deliveries(
                events,
                [
                    NewDelivery(
                        new_id("dlv_"),
                        "acme",
                        e.id,
                        e.type,
                        d.id,
                        DeliveryKind.EVENT,
                        3,
                        now - 1,
                        False,
                        now,
                    )
                    for e in events
                    for d in (paced, free)
                ],
            )
        before, widths = snapshot(db), widths_of(db)
        store = make()
        await store.open()
        try:
            assert snapshot(db, widths=widths) == before
            lanes = db.execute(
                "SELECT destination_id, flow, COUNT(*) FROM herald_deliveries"
                " GROUP BY destination_id, flow ORDER BY flow"
            )
            assert [tuple(r) for r in lanes] == [(free.id, 0, 5), (paced.id, 1, 5)]
            due = await store.claim_due(
                now=time.time(), limit=100, owner="me", lease_until=time.time() + 60
            )
            taken = [d.destination_id for d in due]
            # 1/s: the bucket's one token (its tolerance is a second's worth: one).
            assert taken.count(free.id) == 5
            assert taken.count(paced.id) == 1, taken
            assert [d.flow_lane for d in due if d.destination_id == paced.id] == [True]
        finally:
            await store.close()


@pytest.mark.parametrize("backend", BACKENDS)
async def test_the_flow_rows_of_deleted_destinations_go_from_a_schema_21_database(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """0022 drops the flow rows that destinations deleted by an older Herald left (it
    kept them for good); a live destination's row stays as it was."""
    async with database_at(21, backend, tmp_path, monkeypatch) as (db, older, make):
        gone = replace(destination(), tenant_id="acme", rate_limit_per_second=5.0)
        live = replace(destination(), tenant_id="acme", circuit_breaker=True)
        async with older() as old:
            await old.create_destination(gone, verification=None)
            await old.create_destination(live, verification=None)
        # Deleted as an older Herald did: the destination only.
        db.execute("UPDATE herald_destinations SET deleted_at = ? WHERE id = ?", (1.0, gone.id))
        flows = "SELECT destination_id, rate, breaker FROM herald_flow ORDER BY destination_id"
        before = db.execute(flows)
        assert sorted(r[0] for r in before) == sorted([gone.id, live.id])
        store = make()
        await store.open()
        try:
            assert await store.schema_version() == shipped_version()
            assert db.execute(flows) == [r for r in before if r[0] == live.id]
        finally:
            await store.close()
