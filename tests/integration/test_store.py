"""The store contract against a real database, on SQLite and on PostgreSQL.

Schema and migrations, the relay transaction, leases, recording, requeue,
listing, retention and credentials at rest. Every test runs on both backends
through the harness; the few that test SQLite itself are marked ``sqlite_only``.
"""

from __future__ import annotations

import asyncio
import gc
import os
import sqlite3
import stat
import threading
import time
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, closing
from dataclasses import replace
from pathlib import Path

import orjson
import pytest

from herald.crypto import SecretBox, generate_key, parse_key
from herald.errors import CryptoError, StorageError
from herald.ids import new_id
from herald.model import (
    Attempt,
    AttemptRecord,
    DeliveryFilter,
    DeliveryKind,
    DeliveryStatus,
    Destination,
    DestinationStatus,
    Event,
    Instance,
    NewDelivery,
    OutboxRow,
    Outcome,
    RelayPlan,
)
from herald.store import Store
from herald.store import postgres as postgres_store
from herald.store import sqlite as sqlite_store
from herald.store.postgres import PostgresStore
from herald.store.sqlite import SQLiteStore
from tests.integration.conftest import SECRET, Harness, HarnessFactory, eventually
from tests.support.databases import BACKENDS, create_postgres_database, drop_postgres_database

FAR = 10**10  # a lease that never expires within a test


def record(
    delivery_id: str,
    number: int,
    *,
    status: DeliveryStatus,
    next_at: float | None,
    outcome: Outcome = Outcome.FAILURE_RETRYABLE,
    activates: str | None = None,
) -> AttemptRecord:
    attempt = Attempt(
        id=new_id("att_"),
        delivery_id=delivery_id,
        number=number,
        started_at=time.time(),
        duration_ms=1.5,
        outcome=outcome,
        response_status=500 if outcome is not Outcome.SUCCESS else 204,
        error=None if outcome is Outcome.SUCCESS else "HTTP 500",
        response_excerpt="oops",
    )
    return AttemptRecord(attempt, status, next_at, activates)


async def claim_all(h: Harness, *, owner: str = "w1", now: float | None = None) -> list[str]:
    now = time.time() if now is None else now
    due = await h.store.claim_due(now=now, limit=1000, owner=owner, lease_until=FAR)
    return sorted(d.id for d in due)


def destination(status: DestinationStatus = DestinationStatus.ACTIVE) -> Destination:
    now = time.time()
    return Destination(
        id=new_id("evtd_"),
        tenant_id="default",
        name="d",
        type="webhook",
        config={"url": "http://example.com/"},
        secrets={"secret": "whsec_c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0"},
        events=("*",),
        status=status,
        created_at=now,
        updated_at=now,
    )


def event(i: int = 0) -> Event:
    return Event(
        id=f"evt_{new_id('')}{i}",
        tenant_id="default",
        type="a.b",
        created_at="2026-11-22T10:00:00Z",
        created_ts=time.time(),
        data=orjson.dumps({"i": i}),
    )


def delivery(ev: Event, dest: Destination, *, at: float | None = None) -> NewDelivery:
    now = time.time()
    return NewDelivery(
        id=new_id("dlv_"),
        tenant_id="default",
        event_id=ev.id,
        event_type=ev.type,
        destination_id=dest.id,
        kind=DeliveryKind.EVENT,
        max_attempts=3,
        next_attempt_at=now if at is None else at,
        held=False,
        created_at=now,
    )


# --- schema ---------------------------------------------------------------------
def test_both_backends_ship_the_same_migrations() -> None:
    def names(found: list[tuple[int, str, str]]) -> list[tuple[int, str]]:
        return [(version, name) for version, name, _ in found]

    assert names(sqlite_store.migrations()) == names(postgres_store.migrations())


async def test_migrations_run_once_and_reopen_is_idempotent(harness: Harness) -> None:
    h = harness
    shipped = [(version, name) for version, name, _ in h.migrations()]
    assert shipped[0] == (1, "0001_initial.sql")
    newest = shipped[-1][0]
    assert await h.store.schema_version() == newest
    assert h.rows("SELECT version, name FROM herald_schema_migrations ORDER BY version") == shipped
    dest = await h.add_webhook("http://127.0.0.1:1/hook")
    version_before = await h.store.destinations_version()
    await h.store.close()

    again = h.new_store()
    await again.open()
    try:
        assert await again.schema_version() == newest
        assert (
            h.rows("SELECT version, name FROM herald_schema_migrations ORDER BY version") == shipped
        )
        # The migration's seed row was not re-inserted or reset.
        assert await again.destinations_version() == version_before
        got = await again.get_destination(None, dest.id)
        assert got is not None
        assert got.secrets == {"secret": SECRET}
    finally:
        await again.close()
    # The harness reopens cleanly too (its teardown closes it).
    await h.store.open()
    assert await h.store.schema_version() == newest


@pytest.mark.sqlite_only
async def test_database_is_in_wal_mode(harness: Harness) -> None:
    assert harness.scalar("PRAGMA journal_mode") == "wal"


async def test_a_new_sqlite_database_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    """Like the key file: the database holds every payload and the sealed credentials.
    Its -wal and -shm files, which SQLite creates with the main file's mode, too."""
    path = tmp_path / "data" / "herald.db"
    umask = os.umask(0o022)  # what most hosts have: without care, the file is 0644
    try:
        store = SQLiteStore(path, box=SecretBox(parse_key(generate_key())))
        await store.open()
    finally:
        os.umask(umask)
    try:
        await store.create_api_key(key_hash="f" * 64, tenant_id="t", hint="ffff", now=0.0)
        files = [path.with_name(path.name + suffix) for suffix in ("", "-wal", "-shm")]
        assert {f.name: stat.S_IMODE(f.stat().st_mode) for f in files} == {
            f.name: 0o600 for f in files
        }
    finally:
        await store.close()
    # An existing file keeps the mode its operator gave it.
    path.chmod(0o640)
    again = SQLiteStore(path, box=SecretBox(parse_key(generate_key())))
    await again.open()
    await again.close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o640


@pytest.mark.sqlite_only
async def test_a_write_cancelled_while_it_waits_for_the_lock_leaves_no_transaction_behind(
    harness: Harness,
) -> None:
    """A task cancelled in ``BEGIN IMMEDIATE`` (a stop, a timeout) does not stop the BEGIN:
    it still runs in the connection's thread once the lock frees. Nobody owns that
    transaction, and every later write failed with 'cannot start a transaction within a
    transaction' until the process restarted."""
    h = harness
    assert isinstance(h.store, SQLiteStore)
    dialect = h.store.dialect  # white box: the write lock and the writer connection
    with closing(sqlite3.connect(h.db_path, timeout=5.0, isolation_level=None)) as other:
        other.execute("BEGIN IMMEDIATE")  # a producer's transaction holds the write lock
        write = asyncio.create_task(h.store.release_leases(owner=None, now=time.time()))

        async def waiting_in_begin() -> bool:
            return dialect._write_lock.locked()  # held from the BEGIN to the COMMIT

        await eventually(waiting_in_begin, timeout=5, what="the write to wait for the lock")
        write.cancel()
        with pytest.raises(asyncio.CancelledError):
            await write
        other.execute("COMMIT")

    async def orphan_began() -> bool:
        return dialect._writer.in_transaction

    await eventually(orphan_began, timeout=5, what="the cancelled BEGIN to run")
    assert await h.store.release_leases(owner=None, now=time.time()) == 0
    await h.store.ping()


async def _open_concurrently(stores: list[Store]) -> list[BaseException]:
    try:
        results = await asyncio.gather(*(s.open() for s in stores), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        if not failures:
            newest = sqlite_store.migrations()[-1][0]
            assert [await s.schema_version() for s in stores] == [newest] * len(stores)
        return failures
    finally:
        for s in stores:
            await s.close()


async def test_concurrent_opens_of_an_existing_database_all_succeed(harness: Harness) -> None:
    box = SecretBox(parse_key(generate_key()))
    for _ in range(3):
        assert await _open_concurrently([harness.new_store(box=box) for _ in range(3)]) == []


@asynccontextmanager
async def _fresh_database(backend: str, tmp_path: Path, i: int) -> AsyncIterator[list[Store]]:
    """Three unopened stores on one new, empty database of ``backend``."""
    box = SecretBox(parse_key(generate_key()))
    if backend == "sqlite":
        path = tmp_path / f"fresh{i}.db"
        yield [SQLiteStore(path, box=box) for _ in range(3)]
        return
    url = await create_postgres_database()
    try:
        yield [PostgresStore(url, box=box, pool_size=2) for _ in range(3)]
    finally:
        await drop_postgres_database(url)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_concurrent_first_opens_of_a_new_database_all_succeed(
    backend: str, tmp_path: Path
) -> None:
    # Several processes starting at once on a new database (herald run + a CLI command):
    # on SQLite they race to switch the file to WAL and to migrate it, on PostgreSQL
    # to create the schema. Each SQLite round fails most of the time with the bug;
    # five rounds make it certain.
    failures: list[str] = []
    for i in range(5 if backend == "sqlite" else 2):
        async with _fresh_database(backend, tmp_path, i) as stores:
            failures += [repr(f) for f in await _open_concurrently(stores)]
    assert failures == []


async def test_a_newer_schema_is_refused(harness: Harness) -> None:
    h = harness
    with h.sql() as conn:
        conn.execute("INSERT INTO herald_schema_migrations VALUES (999, '0999_future.sql', 0)")
    newer = h.new_store()
    try:
        with pytest.raises(StorageError, match="newer than this Herald"):
            await newer.open()
    finally:
        await newer.close()


def _other_sessions(h: Harness) -> int:
    """PostgreSQL sessions on the test database besides the harness's own SQL connection."""
    return int(
        h.scalar(
            "SELECT COUNT(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    )


async def test_a_failed_open_leaves_no_connection_behind(harness: Harness) -> None:
    h = harness
    with h.sql() as conn:
        conn.execute("INSERT INTO herald_schema_migrations VALUES (999, '0999_future.sql', 0)")
    sessions = _other_sessions(h) if h.backend == "postgres" else 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        newer: Store | None = h.new_store()
        assert newer is not None
        failed = False
        try:
            await newer.open()
        except StorageError:
            failed = True
        assert failed
        # What herald.wiring.components() does when open() raises: drop the store.
        newer = None
        gc.collect()
        await asyncio.sleep(0.05)
    leaks = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert leaks == []
    if h.backend == "postgres":
        # A pool left open warns nobody: count the server's sessions instead.
        async def closed() -> bool:
            return _other_sessions(h) == sessions

        await eventually(closed, timeout=3, what="the failed store's sessions to end")


def _listener_pids(h: Harness) -> list[int]:
    return [
        int(pid)
        for (pid,) in h.rows(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND query LIKE 'LISTEN%'"
        )
    ]


async def test_the_outbox_watch_wakes_on_a_producers_commit_and_only_then(
    harness: Harness,
) -> None:
    h = harness
    wakes = 0
    woken = asyncio.Event()

    def wake() -> None:
        nonlocal wakes
        wakes += 1
        woken.set()

    assert await h.store.watch_outbox(wake, every=0.005) is True
    if h.backend == "sqlite":
        await asyncio.wait_for(woken.wait(), 5)  # the first look always wakes
        woken.clear()
    # Nothing committed: forty looks later, not one more wake-up.
    settled = wakes
    for _ in range(40):
        await asyncio.sleep(0.005)
    assert wakes == settled
    for n in range(3):
        h.produce("order.created", {"n": n})  # another process's transaction
        await asyncio.wait_for(woken.wait(), 5)
        woken.clear()
    assert wakes >= settled + 1


async def test_the_outbox_watch_looks_only_while_the_relay_listens(harness: Harness) -> None:
    """A relay running one full pass after another clears ``listening``: SQLite's
    watch then stops looking (Herald's own commits would have it wake the relay every
    poll for nothing), and looks again at once when the relay waits."""
    h = harness
    woken = asyncio.Event()
    listening = asyncio.Event()
    listening.set()
    assert await h.store.watch_outbox(woken.set, every=0.005, listening=listening) is True
    if h.backend == "sqlite":
        await asyncio.wait_for(woken.wait(), 5)  # the first look always wakes
    listening.clear()
    await asyncio.sleep(0.05)  # a look under way when it was cleared ends
    woken.clear()
    h.produce("order.created", {"n": 1})  # another process's transaction
    if h.backend == "sqlite":
        # Not looked at: forty polls later, still asleep.
        for _ in range(40):
            await asyncio.sleep(0.005)
        assert not woken.is_set()
        listening.set()
    # PostgreSQL notifies whatever ``listening`` says.
    await asyncio.wait_for(woken.wait(), 5)


async def test_the_outbox_has_one_watcher(harness: Harness) -> None:
    """A second watcher is refused: SQLite would have ignored its callback and
    PostgreSQL opened a second listening connection, forgetting the first."""
    h = harness
    woken = asyncio.Event()
    assert await h.store.watch_outbox(woken.set, every=0.01) is True
    with pytest.raises(RuntimeError, match="one watcher per store"):
        await h.store.watch_outbox(lambda: None, every=0.01)
    h.produce("order.created", {"n": 1})  # the first watcher still hears of it
    await asyncio.wait_for(woken.wait(), 5)


async def test_the_outbox_listener_comes_back_after_its_connection_is_lost(
    harness: Harness,
) -> None:
    h = harness
    woken = asyncio.Event()
    notified = await h.store.watch_outbox(woken.set, every=0.01)
    assert notified is True
    if h.backend == "sqlite":
        # No connection to lose: SQLite's watch is a look at the commit counter.
        return
    h.produce("order.created", {"n": 1})
    await asyncio.wait_for(woken.wait(), 5)

    # What a database restart or an operator's pg_terminate_backend does to it.
    [pid] = _listener_pids(h)
    h.scalar("SELECT pg_terminate_backend(?)", (pid,))
    woken.clear()

    async def relistening() -> bool:
        return len(_listener_pids(h)) == 1 and _listener_pids(h) != [pid]

    await eventually(relistening, timeout=10, what="a new LISTEN connection")
    # Rows inserted while nobody listened are not announced: the store wakes the
    # relay once when it is back.
    await asyncio.wait_for(woken.wait(), 5)
    woken.clear()
    h.produce("order.created", {"n": 2})
    await asyncio.wait_for(woken.wait(), 5)


# --- destinations ------------------------------------------------------------------


async def test_a_destination_round_trips_with_its_secrets(harness: Harness) -> None:
    store = harness.store
    # Every migration shipped, numbered without a gap.
    latest = harness.migrations()[-1][0]
    assert await store.schema_version() == latest == len(harness.migrations())
    dest = destination()
    await store.create_destination(dest, verification=None)
    got = await store.get_destination("default", dest.id)
    assert got == dest
    assert await store.get_destination("other", dest.id) is None


# --- relay transaction ---------------------------------------------------------------
def _raw_outbox(h: Harness, rows: list[tuple[str, str, str]]) -> None:
    with h.sql() as conn:
        conn.executemany(
            "INSERT INTO herald_outbox (id, type, data, created_at)"
            " VALUES (?, ?, ?, '2026-01-02T03:04:05Z')",
            rows,
        )


async def test_relay_writes_events_deliveries_and_rejections_and_empties_outbox(
    harness: Harness,
) -> None:
    h = harness
    a = await h.add_webhook("http://127.0.0.1:1/a", events=["order.created"])
    b = await h.add_webhook("http://127.0.0.1:1/b", events=["*"])
    # PostgreSQL's jsonb refuses text that is not JSON at the producer's insert already;
    # JSON that is not an object is the poison it lets through.
    bad, reason = ("{nope", "invalid_json") if h.backend == "sqlite" else ("[1]", "invalid_data")
    _raw_outbox(
        h,
        [
            ("evt_one", "order.created", '{"n": 1}'),
            ("evt_bad", "order.created", bad),
            ("evt_two", "order.paid", '{"n": 2}'),
        ],
    )
    await h.catalog.refresh()
    plan, count = await h.store.relay(100, h.relay.process)
    assert count == 3
    assert [e.id for e in plan.events] == ["evt_one", "evt_two"]
    assert h.scalar("SELECT COUNT(*) FROM herald_outbox") == 0
    assert h.rows("SELECT id, type, data FROM herald_events ORDER BY id") == [
        ("evt_one", "order.created", '{"n": 1}'),
        ("evt_two", "order.paid", '{"n": 2}'),
    ]
    assert sorted(
        h.rows("SELECT event_id, destination_id, status FROM herald_deliveries")
    ) == sorted(
        [
            ("evt_one", a.id, "pending"),
            ("evt_one", b.id, "pending"),
            ("evt_two", b.id, "pending"),
        ]
    )
    rejected = h.rows("SELECT seq, id, reason FROM herald_outbox_rejected")
    assert len(rejected) == 1
    assert rejected[0][1] == "evt_bad"
    assert rejected[0][2].startswith(f"{reason}:")


async def test_relay_takes_at_most_limit_rows_in_seq_order(harness: Harness) -> None:
    h = harness
    _raw_outbox(h, [(f"evt_{i}", "a.b", "{}") for i in range(5)])
    plan, count = await h.store.relay(3, h.relay.process)
    assert count == 3
    assert [e.id for e in plan.events] == ["evt_0", "evt_1", "evt_2"]
    assert [r[0] for r in h.rows("SELECT id FROM herald_outbox ORDER BY seq")] == ["evt_3", "evt_4"]


@pytest.mark.sqlite_only
async def test_an_idle_relay_does_not_take_the_write_lock(harness: Harness) -> None:
    """With the outbox empty, a relay pass only reads: a producer in the middle of a
    write transaction is neither waited for nor held up, and its rows are relayed by
    the first pass after it commits."""
    h = harness
    assert (await h.store.relay(10, h.relay.process))[1] == 0
    producer = sqlite3.connect(h.db_path, isolation_level=None, timeout=5)
    try:
        producer.execute("BEGIN IMMEDIATE")
        producer.execute(
            "INSERT INTO herald_outbox (id, type, data, created_at)"
            " VALUES ('evt_idle', 'a.b', '{}', '2026-01-02T03:04:05Z')"
        )
        started = time.monotonic()
        for _ in range(5):
            assert (await h.store.relay(10, h.relay.process))[1] == 0
        # Each pass would otherwise wait out the 5 s busy timeout for the lock.
        assert time.monotonic() - started < 1.0
        producer.execute("COMMIT")
    finally:
        producer.close()
    plan, count = await h.store.relay(10, h.relay.process)
    assert count == 1
    assert [e.id for e in plan.events] == ["evt_idle"]


async def test_relay_holds_by_the_committed_status_not_the_plan(harness: Harness) -> None:
    store = harness.store
    pending = destination(DestinationStatus.PENDING_VERIFICATION)
    active = destination()
    await store.create_destination(pending, verification=None)
    await store.create_destination(active, verification=None)
    await store.insert_outbox(
        id="evt_r1",
        tenant_id="default",
        type="a.b",
        data=b'{"x":1}',
        created_at="2026-11-22T10:00:00.5Z",
    )

    def plan(rows: list[OutboxRow], existing: set[tuple[str, str]]) -> RelayPlan:
        assert [r.id for r in rows] == [b"evt_r1"]
        assert rows[0].created_at is not None
        assert rows[0].created_at.startswith(b"2026-11-22T10:00:00.5")
        ev = Event("evt_r1", "default", "a.b", "2026-11-22T10:00:00.5Z", 0.0, b'{"x":1}')
        # The plan claims both unheld; the store corrects held from committed status.
        return RelayPlan(events=[ev], deliveries=[delivery(ev, pending), delivery(ev, active)])

    _, count = await store.relay(10, plan)
    assert count == 1
    rows = await store.list_deliveries(DeliveryFilter(), before_id=None, limit=10)
    held = {r.destination_id: r.held for r in rows}
    assert held == {pending.id: True, active.id: False}
    assert (await store.outbox_stats())[0] == 0


async def test_a_relay_batch_racing_an_activation_never_leaves_its_deliveries_held(
    harness: Harness,
) -> None:
    """An activation commits while the relay batch is writing: the batch waits for it
    and stores the delivery unheld (an activation's un-hold cannot see rows a batch
    has not committed, so a batch reading the old status would hold it for good)."""
    h = harness
    store = h.store
    dest = destination(DestinationStatus.PENDING_VERIFICATION)
    await store.create_destination(dest, verification=None)
    ev = Event("evt_race", "default", "a.b", "2026-11-22T10:00:00Z", 0.0, b"{}")
    h.produce("a.b", {}, id=ev.id)

    def plan(rows: list[OutboxRow], existing: set[tuple[str, str]]) -> RelayPlan:
        return RelayPlan(events=[ev], deliveries=[delivery(ev, dest)])

    with h.sql() as db:  # the activation, as the store runs it, left uncommitted
        db.execute("UPDATE herald_destinations SET status = 'active' WHERE id = ?", (dest.id,))
        relay = asyncio.create_task(store.relay(10, plan))
        await asyncio.sleep(0.5)
        assert not relay.done()  # waiting for the activation's lock
        db.execute(
            "UPDATE herald_deliveries SET held = 0 WHERE destination_id = ? AND held = 1",
            (dest.id,),
        )
    _, count = await asyncio.wait_for(relay, 10)
    assert count == 1
    [stored] = await store.list_deliveries(DeliveryFilter(), before_id=None, limit=10)
    assert stored.held is False


async def test_a_failing_process_leaves_the_outbox_untouched(harness: Harness) -> None:
    h = harness
    await h.add_webhook("http://127.0.0.1:1/a")
    _raw_outbox(h, [("evt_1", "a.b", "{}")])
    await h.store.insert_outbox(
        id="evt_2", tenant_id="default", type="a.b", data=b"{}", created_at="2026-11-22T10:00:00Z"
    )

    def explode(rows: list[OutboxRow], existing: set[tuple[str, str]]) -> RelayPlan:
        plan = h.relay.process(rows, existing)
        assert plan.events  # the plan was real; the failure comes after it
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        await h.store.relay(100, explode)
    assert (await h.store.outbox_stats())[0] == 2  # rolled back, nothing lost
    assert h.scalar("SELECT COUNT(*) FROM herald_outbox") == 2
    assert h.scalar("SELECT COUNT(*) FROM herald_events") == 0
    assert h.scalar("SELECT COUNT(*) FROM herald_deliveries") == 0
    assert h.scalar("SELECT COUNT(*) FROM herald_outbox_rejected") == 0
    # And the store is still usable: the next relay takes both rows.
    assert await h.relay.run_once() == 2
    assert h.scalar("SELECT COUNT(*) FROM herald_deliveries") == 2


# --- claiming -----------------------------------------------------------------------
async def test_claim_due_leases_rows_until_the_lease_passes(harness: Harness) -> None:
    h = harness
    await h.add_webhook("http://127.0.0.1:1/a")
    for _ in range(3):
        await h.emit("a.b")
    ids = sorted(d.id for d in await h.deliveries())
    now = time.time()
    first = await h.store.claim_due(now=now, limit=2, owner="w1", lease_until=now + 30)
    assert len(first) == 2
    assert all(d.event.type == "a.b" and d.attempt_count == 0 for d in first)
    assert all(d.max_attempts == 0 for d in first)
    second = await h.store.claim_due(now=now, limit=10, owner="w2", lease_until=now + 30)
    assert len(second) == 1
    assert sorted([*(d.id for d in first), second[0].id]) == ids
    assert await h.store.claim_due(now=now + 1, limit=10, owner="w3", lease_until=now + 60) == []
    # Once the lease time has passed, the rows are due again (a crashed worker's work).
    again = await h.store.claim_due(now=now + 31, limit=10, owner="w3", lease_until=now + 90)
    assert sorted(d.id for d in again) == ids
    owners = {r[0] for r in h.rows("SELECT lease_owner FROM herald_deliveries")}
    assert owners == {"w3"}


async def test_claim_due_excludes_destinations_and_never_claims_held(harness: Harness) -> None:
    h = harness
    a = await h.add_webhook("http://127.0.0.1:1/a")
    b = await h.add_webhook("http://127.0.0.1:1/b")
    c = await h.add_webhook("http://127.0.0.1:1/c", status=DestinationStatus.INACTIVE)
    d = await h.add_webhook("http://127.0.0.1:1/d", status=DestinationStatus.PENDING_VERIFICATION)
    await h.emit("a.b")
    held = {x.destination_id: x.held for x in await h.deliveries()}
    assert held == {a.id: False, b.id: False, c.id: True, d.id: True}
    now = time.time()
    got = await h.store.claim_due(
        now=now, limit=10, owner="w", lease_until=FAR, exclude_destinations=[a.id]
    )
    assert [x.destination_id for x in got] == [b.id]
    got = await h.store.claim_due(now=now + 10**6, limit=10, owner="w", lease_until=FAR)
    assert [x.destination_id for x in got] == [a.id]
    assert await h.store.next_due_at() == FAR  # only leased rows remain unheld


async def test_two_claimers_never_share_a_delivery(harness: Harness) -> None:
    store = harness.store
    dest = destination()
    await store.create_destination(dest, verification=None)
    events = [event(i) for i in range(200)]
    await store.insert_deliveries(events, [delivery(e, dest) for e in events])
    now = time.time()

    async def claim(owner: str) -> list[str]:
        got: list[str] = []
        while True:
            batch = await store.claim_due(
                now=time.time(), limit=7, owner=owner, lease_until=now + 60
            )
            if not batch:
                return got
            got.extend(d.id for d in batch)

    a, b = await asyncio.gather(claim("a"), claim("b"))
    assert len(a) + len(b) == 200
    assert not set(a) & set(b)


async def test_expired_lease_is_claimable_and_renewal_keeps_it(harness: Harness) -> None:
    store = harness.store
    dest = destination()
    await store.create_destination(dest, verification=None)
    ev = event()
    d = delivery(ev, dest)
    await store.insert_deliveries([ev], [d])
    now = time.time()
    first = await store.claim_due(now=now, limit=10, owner="a", lease_until=now + 0.2)
    assert [x.id for x in first] == [d.id]
    assert await store.claim_due(now=now + 0.1, limit=10, owner="b", lease_until=now + 60) == []
    assert await store.renew_leases([d.id], owner="a", until=now + 1) == 1
    assert await store.renew_leases([d.id], owner="b", until=now + 9) == 0
    assert await store.claim_due(now=now + 0.5, limit=10, owner="b", lease_until=now + 60) == []
    taken = await store.claim_due(now=now + 1.5, limit=10, owner="b", lease_until=now + 60)
    assert [x.id for x in taken] == [d.id]


# --- recording ----------------------------------------------------------------------
async def test_record_attempts_moves_deliveries_on(harness: Harness) -> None:
    h = harness
    await h.add_webhook("http://127.0.0.1:1/a")
    await h.emit("a.b")
    await h.emit("a.b")
    one, two = await claim_all(h)
    nxt = time.time() + 120
    await h.store.record_attempts(
        [
            record(one, 1, status=DeliveryStatus.PENDING, next_at=nxt),
            record(two, 1, status=DeliveryStatus.SUCCESS, next_at=None, outcome=Outcome.SUCCESS),
        ]
    )
    d1 = await h.delivery(one)
    assert (d1.status, d1.attempt_count, d1.next_attempt_at) == (DeliveryStatus.PENDING, 1, nxt)
    assert d1.last_attempt is not None
    assert d1.last_attempt.outcome is Outcome.FAILURE_RETRYABLE
    assert d1.last_attempt.response_excerpt == "oops"
    assert [a.number for a in d1.attempts] == [1]
    d2 = await h.delivery(two)
    assert (d2.status, d2.attempt_count, d2.next_attempt_at) == (DeliveryStatus.SUCCESS, 1, None)
    assert h.rows("SELECT lease_owner FROM herald_deliveries") == [(None,), (None,)]
    # Not due before its next attempt time, due after it.
    assert await claim_all(h, now=nxt - 1) == []
    assert await claim_all(h, now=nxt + 1) == [one]


async def test_record_attempts_ignores_deliveries_no_longer_pending_but_keeps_the_attempt(
    harness: Harness,
) -> None:
    h = harness
    dest = await h.add_webhook("http://127.0.0.1:1/a")
    await h.emit("a.b")
    [dlv] = await claim_all(h)
    assert await h.store.delete_destination("default", dest.id, now=time.time())
    rec = record(dlv, 1, status=DeliveryStatus.PENDING, next_at=time.time() + 30)
    await h.store.record_attempts([rec])
    d = await h.delivery(dlv)
    assert d.status is DeliveryStatus.FAILURE
    assert d.attempt_count == 0
    assert d.next_attempt_at is None
    assert [a.id for a in d.attempts] == [rec.attempt.id]


async def test_successful_verification_activates_and_releases_held_deliveries(
    harness: Harness,
) -> None:
    h = harness
    dest = await h.service.create(
        "default",
        {
            "name": "v",
            "type": "webhook",
            "events": ["*"],
            "webhook": {"url": "http://127.0.0.1:1/"},
        },
    )
    await h.catalog.refresh()
    await h.emit("a.b")
    [event_dlv] = await h.deliveries(event_types=("a.b",))
    assert event_dlv.held
    due = await h.store.claim_due(now=time.time(), limit=10, owner="w", lease_until=FAR)
    assert [(d.kind, d.destination_id) for d in due] == [(DeliveryKind.VERIFICATION, dest.id)]
    version = await h.store.destinations_version()
    await h.store.record_attempts(
        [
            record(
                due[0].id,
                1,
                status=DeliveryStatus.SUCCESS,
                next_at=None,
                outcome=Outcome.SUCCESS,
                activates=dest.id,
            )
        ]
    )
    got = await h.store.get_destination("default", dest.id)
    assert got is not None
    assert got.status is DestinationStatus.ACTIVE
    assert await h.store.destinations_version() == version + 1
    released = await h.delivery(event_dlv.id)
    assert not released.held
    assert await claim_all(h) == [event_dlv.id]


async def test_a_superseded_verification_success_does_not_activate(harness: Harness) -> None:
    h = harness
    dest = await h.service.create(
        "default",
        {
            "name": "v",
            "type": "webhook",
            "events": ["*"],
            "webhook": {"url": "http://127.0.0.1:1/"},
        },
    )
    [old_ping] = await h.store.claim_due(now=time.time(), limit=10, owner="w", lease_until=FAR)
    # While the ping to the old URL is in flight, the URL changes: a new ping supersedes it.
    await h.service.update("default", dest.id, {"webhook": {"url": "http://127.0.0.1:2/"}})
    old = await h.delivery(old_ping.id)
    assert old.status is DeliveryStatus.FAILURE
    # The old URL answers 2xx: that says nothing about the new URL.
    await h.store.record_attempts(
        [
            record(
                old_ping.id,
                1,
                status=DeliveryStatus.SUCCESS,
                next_at=None,
                outcome=Outcome.SUCCESS,
                activates=dest.id,
            )
        ]
    )
    got = await h.store.get_destination("default", dest.id)
    assert got is not None
    assert got.status is DestinationStatus.PENDING_VERIFICATION


async def test_activation_racing_a_delete_never_deadlocks(harness: Harness) -> None:
    """A verification's success (deliveries, then its destination) against a delete of
    the same destination (destination, then its deliveries): PostgreSQL once found a
    deadlock here and failed the delete with a 500."""
    h = harness
    for i in range(25):
        dest = await h.service.create(
            "default",
            {
                "name": f"r{i}",
                "type": "webhook",
                "events": ["*"],
                "webhook": {"url": f"http://127.0.0.1:1/{i}"},
            },
        )
        [ping] = await h.store.claim_due(now=time.time(), limit=10, owner="w", lease_until=FAR)
        success = record(
            ping.id,
            1,
            status=DeliveryStatus.SUCCESS,
            next_at=None,
            outcome=Outcome.SUCCESS,
            activates=dest.id,
        )
        await asyncio.gather(
            h.store.record_attempts([success]),
            h.store.delete_destination("default", dest.id, now=time.time()),
        )
        got = await h.store.get_destination("default", dest.id)
        assert got is not None
        assert got.deleted_at is not None


async def test_release_leases_makes_leased_deliveries_due_now(harness: Harness) -> None:
    h = harness
    await h.add_webhook("http://127.0.0.1:1/a")
    for _ in range(3):
        await h.emit("a.b")
    ids = sorted(d.id for d in await h.deliveries())
    now = time.time()
    mine = await h.store.claim_due(now=now, limit=2, owner="me", lease_until=FAR)
    theirs = await h.store.claim_due(now=now, limit=2, owner="them", lease_until=FAR)
    assert len(mine) == 2
    assert len(theirs) == 1
    assert await h.store.release_leases(owner="me", now=now + 1) == 2
    assert sorted(await claim_all(h, owner="x", now=now + 1)) == sorted(d.id for d in mine)
    assert await h.store.release_leases(owner=None, now=now + 2) == 3
    assert await claim_all(h, owner="y", now=now + 2) == ids
    assert await h.store.release_leases(owner="nobody", now=now) == 0


@pytest.mark.sqlite_only
async def test_releasing_leases_reads_only_the_leased_deliveries(harness: Harness) -> None:
    """At start, at stop and when reaping, releases look up the leased deliveries in
    their own partial index: walking every pending delivery took 1.1 s at a million
    scheduled retries."""
    with harness.sqlite() as db:
        for where in ("lease_owner IS NOT NULL", "lease_owner = 'x'"):
            plan = db.execute(
                "EXPLAIN QUERY PLAN UPDATE herald_deliveries SET lease_owner = NULL"
                f" WHERE status = 'pending' AND {where}"
            ).fetchall()
            assert "USING INDEX herald_deliveries_leased" in str(plan), plan


@pytest.mark.sqlite_only
async def test_a_slow_gauge_count_never_holds_up_claims_or_catalog_checks(
    harness: Harness,
) -> None:
    """The metrics' counts take 0.1 s at a million scheduled retries; the relay's
    catalog check and the claims must not queue behind them (they did, on one
    shared reading connection: p99 latency x3 in the retry-backlog benchmark)."""
    store = harness.store
    assert isinstance(store, SQLiteStore)
    entered, release = threading.Event(), threading.Event()

    def stall() -> int:  # SQLite's progress handler: runs inside the count
        entered.set()
        release.wait(10)
        return 0

    gauges = store.dialect._gauges  # white box: hold the count inside SQLite
    await gauges.set_progress_handler(stall, 1)
    counting = asyncio.create_task(store.delivery_counts(now=time.time()))
    try:
        assert await asyncio.to_thread(entered.wait, 5)
        now = time.time()
        await asyncio.wait_for(store.destinations_version(), 5)
        await asyncio.wait_for(
            store.claim_due(now=now, limit=10, owner="w", lease_until=now + 30), 5
        )
        await asyncio.wait_for(store.next_due_at(), 5)
        assert not counting.done()
    finally:
        release.set()
        await counting


# --- instances and heartbeats ------------------------------------------------------------
def instance(name: str, started: float) -> Instance:
    return Instance(name, "host-a", 4242, "0.1.0", started, started)


async def test_heartbeat_registers_then_refreshes_and_lists(harness: Harness) -> None:
    store = harness.store
    t = time.time()
    assert await store.heartbeat(instance("i-1", t), now=t) is False  # new
    assert await store.heartbeat(instance("i-1", t), now=t + 5) is True
    assert await store.heartbeat(instance("i-2", t + 1), now=t + 1) is False
    got = await store.list_instances()
    assert [(i.id, i.started_at, i.heartbeat_at) for i in got] == [
        ("i-1", t, t + 5),
        ("i-2", t + 1, t + 1),
    ]
    assert (got[0].hostname, got[0].pid, got[0].version) == ("host-a", 4242, "0.1.0")
    await store.remove_instance("i-1")
    assert [i.id for i in await store.list_instances()] == ["i-2"]
    await store.remove_instance("i-unknown")  # nothing to remove is not an error


async def test_reaping_a_silent_instance_releases_only_its_leases(harness: Harness) -> None:
    h = harness
    await h.add_webhook("http://127.0.0.1:1/a")
    for _ in range(5):
        await h.emit("a.b")
    t = time.time()
    await h.store.heartbeat(instance("dead", t - 100), now=t - 100)
    await h.store.heartbeat(instance("alive", t - 100), now=t)
    dead = await h.store.claim_due(now=t, limit=2, owner="dead", lease_until=FAR)
    alive = await h.store.claim_due(now=t, limit=2, owner="alive", lease_until=FAR)
    assert await h.store.claim_due(now=t, limit=10, owner="x", lease_until=FAR) != []  # 1 left

    assert await h.store.reap_instances(stale_before=t - 30, now=t + 1) == {"dead": 2}
    assert [i.id for i in await h.store.list_instances()] == ["alive"]
    # The dead instance's deliveries are due at once; the live one keeps its leases.
    again = await h.store.claim_due(now=t + 1, limit=10, owner="y", lease_until=FAR)
    assert sorted(d.id for d in again) == sorted(d.id for d in dead)
    assert not {d.id for d in alive} & {d.id for d in again}
    # A second reap finds nothing: reaping is idempotent.
    assert await h.store.reap_instances(stale_before=t - 30, now=t + 2) == {}


async def test_a_reaped_instance_that_beats_again_is_told_so(harness: Harness) -> None:
    store = harness.store
    t = time.time()
    await store.heartbeat(instance("slow", t), now=t)
    assert await store.reap_instances(stale_before=t + 1, now=t + 1) == {"slow": 0}
    assert await store.heartbeat(instance("slow", t), now=t + 2) is False


async def test_concurrent_reapers_release_each_lease_once(harness: Harness) -> None:
    h = harness
    await h.add_webhook("http://127.0.0.1:1/a")
    for _ in range(4):
        await h.emit("a.b")
    t = time.time()
    await h.store.heartbeat(instance("dead", t - 100), now=t - 100)
    await h.store.claim_due(now=t, limit=10, owner="dead", lease_until=FAR)
    results = await asyncio.gather(
        *(h.store.reap_instances(stale_before=t - 30, now=t) for _ in range(4))
    )
    assert sorted(r.get("dead", -1) for r in results) == [-1, -1, -1, 4]


async def test_delivery_counts_split_pending_by_state(harness: Harness) -> None:
    h = harness
    live = await h.add_webhook("http://127.0.0.1:1/live")
    await h.add_webhook("http://127.0.0.1:1/paused", status=DestinationStatus.INACTIVE)
    for _ in range(4):
        await h.emit("a.b")
    now = time.time()
    # live: 4 due; paused: 4 held. Then one of live's fails and waits for its retry.
    assert await h.store.delivery_counts(now=now) == {"due": 4, "scheduled_retry": 0, "held": 4}
    [first] = await h.store.claim_due(
        now=now, limit=1, owner="w", lease_until=FAR, exclude_destinations=()
    )
    assert first.destination_id == live.id
    await h.store.record_attempts(
        [record(first.id, 1, status=DeliveryStatus.PENDING, next_at=now + 600)]
    )
    assert await h.store.delivery_counts(now=now) == {"due": 3, "scheduled_retry": 1, "held": 4}
    assert await h.store.delivery_counts(now=now + 601) == {
        "due": 4,
        "scheduled_retry": 0,
        "held": 4,
    }


# --- requeue ------------------------------------------------------------------------
async def test_requeue_semantics(harness_factory: HarnessFactory) -> None:
    h = await harness_factory(delivery={"max_retries": 2})
    live = await h.add_webhook("http://127.0.0.1:1/live")
    gone = await h.add_webhook("http://127.0.0.1:1/gone")
    for _ in range(3):
        await h.emit("a.b")
    live_ids = sorted(d.id for d in await h.deliveries(destination_id=live.id))
    gone_ids = sorted(d.id for d in await h.deliveries(destination_id=gone.id))
    failed, succeeded, scheduled = live_ids
    # failed: 3 attempts (exhausted); succeeded: 1 attempt; scheduled: pending far out.
    await claim_all(h)
    await h.store.record_attempts(
        [record(failed, 1, status=DeliveryStatus.PENDING, next_at=time.time())]
    )
    await claim_all(h)
    await h.store.record_attempts(
        [
            record(failed, 2, status=DeliveryStatus.PENDING, next_at=time.time()),
            record(
                succeeded, 1, status=DeliveryStatus.SUCCESS, next_at=None, outcome=Outcome.SUCCESS
            ),
            record(scheduled, 1, status=DeliveryStatus.PENDING, next_at=time.time() + 10**6),
        ]
    )
    await claim_all(h)
    await h.store.record_attempts([record(failed, 3, status=DeliveryStatus.FAILURE, next_at=None)])
    await h.store.release_leases(owner=None, now=time.time())  # gone's deliveries are idle
    await h.store.delete_destination("default", gone.id, now=time.time())
    test_dlv = new_id("dlv_")
    ev = Event(new_id("evt_"), "default", "test.ping", "2026-01-01T00:00:00Z", 0.0, b'{"ok":true}')
    await h.store.insert_deliveries(
        [ev],
        [
            NewDelivery(
                test_dlv, "default", ev.id, ev.type, live.id, DeliveryKind.TEST, 1, None, False, 1.0
            )
        ],
    )
    await h.store.record_attempts(
        [record(test_dlv, 1, status=DeliveryStatus.FAILURE, next_at=None)]
    )
    verification_id = new_id("dlv_")
    vev = replace(ev, id=new_id("evt_"), type="destination.verification")
    await h.store.insert_deliveries(
        [vev],
        [
            NewDelivery(
                verification_id,
                "default",
                vev.id,
                vev.type,
                live.id,
                DeliveryKind.VERIFICATION,
                3,
                None,
                False,
                1.0,
            )
        ],
    )
    await h.store.record_attempts(
        [record(verification_id, 1, status=DeliveryStatus.FAILURE, next_at=None)]
    )

    now = time.time()
    n = await h.store.requeue([*live_ids, *gone_ids, test_dlv, verification_id], now=now)
    assert n == 3
    f = await h.delivery(failed)
    assert (f.status, f.attempt_count, f.max_attempts, f.next_attempt_at) == (
        DeliveryStatus.PENDING,
        3,
        3,  # a new round starts after its 3 attempts
        now,
    )
    s = await h.delivery(succeeded)
    assert (s.status, s.attempt_count, s.max_attempts, s.next_attempt_at) == (
        DeliveryStatus.PENDING,
        1,
        1,
        now,
    )
    p = await h.delivery(scheduled)
    # A pending delivery keeps its round (the first) and simply becomes due now.
    assert (p.status, p.attempt_count, p.max_attempts, p.next_attempt_at) == (
        DeliveryStatus.PENDING,
        1,
        0,
        now,
    )
    for untouched in (*gone_ids, test_dlv, verification_id):
        u = await h.delivery(untouched)
        assert u.status is DeliveryStatus.FAILURE, untouched
        assert u.next_attempt_at is None
    assert await claim_all(h, now=now) == live_ids


async def test_requeue_of_an_inactive_destination_stays_held(harness: Harness) -> None:
    h = harness
    dest = await h.add_webhook("http://127.0.0.1:1/a")
    await h.emit("a.b")
    [dlv] = await claim_all(h)
    await h.store.record_attempts([record(dlv, 1, status=DeliveryStatus.FAILURE, next_at=None)])
    await h.store.update_destination(
        replace(dest, status=DestinationStatus.INACTIVE, updated_at=time.time())
    )
    assert await h.store.requeue([dlv], now=time.time()) == 1
    d = await h.delivery(dlv)
    assert d.status is DeliveryStatus.PENDING
    assert d.held
    assert await claim_all(h) == []


# --- listing --------------------------------------------------------------------------
async def test_list_deliveries_filters_and_pages_newest_first(harness: Harness) -> None:
    h = harness
    a = await h.add_webhook("http://127.0.0.1:1/a")
    b = await h.add_webhook("http://127.0.0.1:1/b", events=["order.*"])
    t0 = time.time()
    await h.emit("order.created")  # a, b
    await h.emit("invoice.paid")  # a
    t1 = time.time()
    await h.emit("order.paid")  # a, b
    everything = await h.deliveries()
    assert len(everything) == 5
    ids = [d.id for d in everything]
    assert ids == sorted(ids, reverse=True)
    assert [d.event_type for d in everything] == [
        "order.paid",
        "order.paid",
        "invoice.paid",
        "order.created",
        "order.created",
    ]

    # One success and one failure to filter on.
    [first_a] = [
        d.id for d in everything if d.destination_id == a.id and d.event_type == "order.created"
    ]
    [first_b] = [
        d.id for d in everything if d.destination_id == b.id and d.event_type == "order.created"
    ]
    await claim_all(h)
    await h.store.record_attempts(
        [
            record(
                first_a, 1, status=DeliveryStatus.SUCCESS, next_at=None, outcome=Outcome.SUCCESS
            ),
            record(first_b, 1, status=DeliveryStatus.FAILURE, next_at=None),
        ]
    )

    async def ids_for(**flt: object) -> list[str]:
        return [d.id for d in await h.deliveries(**flt)]

    assert await ids_for(status=DeliveryStatus.SUCCESS) == [first_a]
    assert await ids_for(status=DeliveryStatus.FAILURE) == [first_b]
    assert len(await ids_for(status=DeliveryStatus.PENDING)) == 3
    assert len(await ids_for(destination_id=b.id)) == 2
    assert len(await ids_for(event_types=("order.created", "order.paid"))) == 4
    assert len(await ids_for(event_types=("invoice.paid",), destination_id=a.id)) == 1
    assert len(await ids_for(since=t1)) == 2
    assert len(await ids_for(until=t1)) == 3
    assert len(await ids_for(since=t0, until=t1)) == 3
    assert await ids_for(tenant_id="other") == []
    assert await h.store.count_deliveries(DeliveryFilter(destination_id=a.id)) == 3

    # Paging with before_id returns each record exactly once, in order.
    seen: list[str] = []
    before: str | None = None
    while True:
        page = await h.store.list_deliveries(DeliveryFilter(), before_id=before, limit=2)
        if not page:
            break
        assert len(page) <= 2
        seen.extend(d.id for d in page)
        before = page[-1].id
    assert seen == ids


# --- retention ------------------------------------------------------------------------
async def test_retention_purges_only_old_finished_history(harness: Harness) -> None:
    store = harness.store
    dest = destination()
    await store.create_destination(dest, verification=None)
    evs = [event(i) for i in range(4)]
    ds = [delivery(e, dest) for e in evs]
    await store.insert_deliveries(evs, ds)
    unsubscribed = event(9)  # an event no destination wanted: no delivery at all
    await store.insert_deliveries([unsubscribed], [])
    await store.record_attempts(
        [
            record(
                ds[0].id, 1, status=DeliveryStatus.SUCCESS, next_at=None, outcome=Outcome.SUCCESS
            ),
            record(ds[1].id, 1, status=DeliveryStatus.FAILURE, next_at=None),
            record(ds[2].id, 1, status=DeliveryStatus.PENDING, next_at=time.time() + 60),
        ]
    )
    assert await store.purge(before=time.time() - 3600, limit=10) == 0
    assert await store.purge(before=time.time() + 1, limit=1) == 1
    assert await store.purge(before=time.time() + 1, limit=10) == 1
    left = {d.id for d in await store.list_deliveries(DeliveryFilter(), before_id=None, limit=10)}
    assert left == {ds[2].id, ds[3].id}
    assert await store.get_event(None, evs[0].id) is None
    assert await store.get_event(None, evs[1].id) is None
    assert await store.get_event(None, unsubscribed.id) is None
    assert await store.get_event(None, evs[2].id) is not None
    assert await store.get_event(None, evs[3].id) is not None
    kept = await store.get_delivery(None, ds[2].id, with_attempts=True)
    assert kept is not None
    assert kept.attempts


async def test_retention_tells_apart_two_tenants_events_of_one_id(harness: Harness) -> None:
    """An event id is unique per tenant only: purging one tenant's old event never takes
    another tenant's event of the same id that still has deliveries."""
    store = harness.store
    mine, theirs = destination(), replace(destination(), tenant_id="acme")
    for dest in (mine, theirs):
        await store.create_destination(dest, verification=None)

    def of(tenant: str, event_id: str) -> Event:
        return replace(event(), id=event_id, tenant_id=tenant, data=orjson.dumps({"t": tenant}))

    delivered, unsubscribed = of("default", "evt_x"), of("default", "evt_y")
    pending = [of("acme", "evt_x"), of("acme", "evt_y")]
    done = delivery(delivered, mine)
    waiting = [replace(delivery(e, theirs), tenant_id="acme") for e in pending]
    await store.insert_deliveries([delivered, unsubscribed, *pending], [done, *waiting])
    await store.record_attempts(
        [record(done.id, 1, status=DeliveryStatus.SUCCESS, next_at=None, outcome=Outcome.SUCCESS)]
    )
    assert await store.purge(before=time.time() + 1, limit=10) == 1
    assert await store.get_event("default", "evt_x") is None
    assert await store.get_event("default", "evt_y") is None
    for e in pending:
        assert await store.get_event("acme", e.id) == e
    # The pending deliveries are claimed with their own tenant's events.
    due = await store.claim_due(now=time.time() + 1, limit=10, owner="w1", lease_until=FAR)
    assert sorted((d.id, d.event) for d in due) == sorted(
        (d.id, e) for d, e in zip(waiting, pending, strict=True)
    )


# --- credentials at rest ---------------------------------------------------------------
WHSEC = "whsec_" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVphYmNkZWY="


async def _webhook_with_secret(h: Harness) -> Destination:
    return await h.service.create(
        "default",
        {
            "name": "enc",
            "type": "webhook",
            "events": ["*"],
            "webhook": {"url": "http://127.0.0.1:1/", "secret": WHSEC},
        },
    )


async def test_credentials_are_encrypted_at_rest(harness: Harness) -> None:
    h = harness
    dest = await _webhook_with_secret(h)
    raw_secrets, raw_config = h.rows(
        "SELECT secrets, config FROM herald_destinations WHERE id = ?", (dest.id,)
    )[0]
    assert raw_secrets.startswith("v1.")
    assert WHSEC not in raw_secrets
    assert WHSEC not in raw_config
    # No column of the stored row holds the key, in any encoding the database shows.
    key_part = WHSEC.removeprefix("whsec_")
    [row] = h.rows("SELECT * FROM herald_destinations WHERE id = ?", (dest.id,))
    assert not any(key_part in str(value) for value in row)
    # The right key reads it back.
    got = await h.store.get_destination("default", dest.id)
    assert got is not None
    assert got.secrets == {"secret": WHSEC}
    # Another key cannot.
    other = h.new_store(box=SecretBox(parse_key(generate_key())))
    await other.open()
    try:
        with pytest.raises(CryptoError):
            await other.get_destination("default", dest.id)
    finally:
        await other.close()
    # Nor can the right key for another row (the ciphertext is bound to the destination id).
    twin = await h.add_webhook("http://127.0.0.1:1/", secret=None)
    with h.sql() as conn:
        conn.execute(
            "UPDATE herald_destinations SET secrets = ? WHERE id = ?", (raw_secrets, twin.id)
        )
    with pytest.raises(CryptoError):
        await h.store.get_destination("default", twin.id)


@pytest.mark.sqlite_only
async def test_credentials_never_reach_the_database_files_in_clear(harness: Harness) -> None:
    h = harness
    await _webhook_with_secret(h)
    key_part = WHSEC.removeprefix("whsec_")
    checked = 0
    for suffix in ("", "-wal"):
        path = h.db_path.with_name(h.db_path.name + suffix)
        if path.exists():
            checked += 1
            blob = path.read_bytes()
            assert key_part.encode() not in blob, path
    assert checked
