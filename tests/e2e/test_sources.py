"""Outbox sources end to end: a producer writes its business row and its event in one
transaction of its own database (SQLite, MariaDB, PostgreSQL), and ``herald run``
(on its embedded SQLite), configured with one ``[[outbox.sources]]`` entry, delivers
the event to a webhook that verifies its signature."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from herald.outbox import publish
from herald.sourcedb.schema import outbox_ddl
from tests.e2e.conftest import SECRET
from tests.e2e.test_console_http import Client
from tests.support.daemon import Herald
from tests.support.databases import create_postgres_database, drop_postgres_database
from tests.support.receiver import Receiver
from tests.support.sources import DIALECTS, Producer, ThrowawayMariaDB, producer_database

pytestmark = pytest.mark.e2e

SOURCE = "shop"


@pytest.fixture(params=DIALECTS)
async def producer(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Producer]:
    async with producer_database(request.param, tmp_path) as p:
        yield p


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Callable[..., Herald]]:
    """``herald run`` on its embedded SQLite, reading one outbox source."""
    made: list[Herald] = []

    def make(producer: Producer, *more: dict[str, Any], **relay: Any) -> Herald:
        h = Herald(tmp_path, {"relay": relay} if relay else None)
        # The config writer knows plain sections only: the sources go in as TOML.
        with h.config_path.open("a") as fh:
            for source in ({"name": SOURCE, "url": producer.url}, *more):
                fh.write("[[outbox.sources]]\n")
                fh.writelines(f"{k} = {toml(v)}\n" for k, v in source.items())
        made.append(h)
        return h

    yield make
    for h in made:
        h.discard()


def toml(value: object) -> str:
    """A string, or a table of strings inline (``columns``), as TOML."""
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in value.items()) + " }"
    return json.dumps(value)


START_TIMEOUT = 60.0
"""A daemon's start-up on a machine that runs eight suites at once can pass 20 s."""


async def launch(h: Herald) -> Herald:
    return await asyncio.to_thread(h.start, timeout=START_TIMEOUT)


async def started(h: Herald, receiver: Receiver) -> Herald:
    await launch(h)
    await h.acreate_webhook(receiver.url, secret=SECRET, events=["order.*"])
    return h


async def until(predicate: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.05)


def place_order(producer: Producer, total: int, *, commit: bool = True) -> str:
    """The producer's transaction: a business row and its event, committed or not."""
    conn = producer.connect()
    try:
        if producer.dialect == "sqlite":
            conn.execute("BEGIN IMMEDIATE")
        cur = conn.cursor()
        mark = "?" if producer.dialect == "sqlite" else "%s"
        cur.execute(f"INSERT INTO orders (total) VALUES ({mark})", (total,))
        cur.close()
        event_id = publish(conn, "order.placed", {"total": total})
        if commit:
            conn.commit()
        else:
            conn.rollback()
        return event_id
    finally:
        conn.close()


async def test_committed_delivered_rolled_back_not_bad_row_rejected(
    daemon: Callable[..., Herald], producer: Producer, receiver: Receiver
) -> None:
    h = await started(daemon(producer), receiver)
    kept = await asyncio.to_thread(place_order, producer, 10)
    dropped = await asyncio.to_thread(place_order, producer, 20, commit=False)
    await receiver.wait_for(lambda: kept in receiver.counts(), what="the committed event")
    [got] = receiver.events("order.placed")
    assert got.verified, receiver.errors
    assert got.envelope["data"] == {"total": 10}

    # A bad row (an id that is no event id) is rejected naming its source, and the row
    # behind it is delivered all the same.
    mark = "?" if producer.dialect == "sqlite" else "%s"
    await asyncio.to_thread(
        producer.run,
        f"INSERT INTO herald_outbox (id, type, data) VALUES ({mark}, {mark}, {mark})",
        ("not-an-event-id", "order.placed", "{}"),
    )
    behind = await asyncio.to_thread(place_order, producer, 30)
    await receiver.wait_for(lambda: behind in receiver.counts(), what="the row behind")
    rejected = (await h.acli_json("outbox", "rejected", "--all-tenants"))["data"]
    assert [(r["source"], r["id"], r["reason"].split(":")[0]) for r in rejected] == [
        (SOURCE, "not-an-event-id", "invalid_id")
    ]
    table = (await h.acli("outbox", "rejected", "--all-tenants")).stdout
    assert SOURCE in table
    assert "not-an-event-id" in table
    await until(lambda: producer.count() == 0, "the source table to empty")
    assert dropped not in receiver.counts()
    assert h.query("SELECT COUNT(*) FROM herald_events WHERE type = 'order.placed'")[0][0] == 2
    sources = (await h.acli_json("outbox", "sources"))["data"]
    assert [(s["name"], s["dialect"], s["state"], s["pending"]) for s in sources] == [
        (SOURCE, producer.dialect, "up", 0)
    ]
    assert await h.astop() == 0


@pytest.mark.parametrize("producer", ["mysql", "postgresql"], indirect=True)
async def test_a_lower_seq_committed_last_is_delivered(
    daemon: Callable[..., Herald], producer: Producer, receiver: Receiver
) -> None:
    """Sequence values are taken before commit: the transaction that took the lower one
    commits after the higher one was relayed, and its event is delivered too."""
    await started(daemon(producer), receiver)
    first, second = producer.connect(), producer.connect()
    try:
        early = publish(first, "order.placed", {"total": 1})  # the lower seq, held open
        late = publish(second, "order.placed", {"total": 2})
        second.commit()
        await receiver.wait_for(lambda: late in receiver.counts(), what="the higher seq")
        first.commit()
        await receiver.wait_for(lambda: early in receiver.counts(), what="the lower seq")
    finally:
        first.close()
        second.close()
    await until(lambda: producer.count() == 0, "the source table to empty")


async def test_kill_9_mid_drain_loses_and_duplicates_nothing(
    daemon: Callable[..., Herald], producer: Producer, receiver: Receiver
) -> None:
    total = 2000
    # Small batches: the drain takes long enough to be cut in the middle.
    h = await started(daemon(producer, batch_size=10), receiver)
    with producer.transaction() as conn:
        ids = [publish(conn, "order.placed", {"n": i}) for i in range(total)]
    await until(lambda: producer.count() < total, "the drain to begin", timeout=30)
    h.kill()
    assert producer.count() > 0, "killed too late: the drain had ended"
    await launch(h)
    await receiver.wait_for(lambda: set(receiver.counts()) >= set(ids), timeout=120, what="all")
    await until(lambda: producer.count() == 0, "the source table to empty")
    # One event and one delivery each: a re-read row is known, never a new event.
    assert h.query("SELECT COUNT(*) FROM herald_events WHERE type = 'order.placed'")[0][0] == total
    assert (
        h.query("SELECT COUNT(*) FROM herald_deliveries WHERE event_type = 'order.placed'")[0][0]
        == total
    )
    assert h.query("SELECT COUNT(*) FROM herald_outbox_rejected")[0][0] == 0
    assert all(r.verified for r in receiver.events()), receiver.errors
    assert await h.astop() == 0


def scrape(h: Herald) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{h.port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


@pytest.mark.parametrize("producer", ["mysql"], indirect=True)
async def test_a_source_down_or_wrong_never_stops_the_daemon(
    daemon: Callable[..., Herald], producer: Producer, receiver: Receiver
) -> None:
    """A source whose table is missing, and one whose password is wrong: the daemon is
    ready and delivers from the good one; each says why once; the missing table, once
    created, is read."""
    base = producer.url.rpartition("/")[0]
    late = {"name": "late", "url": producer.url, "table": "late_outbox"}
    wrong = {"name": "wrong", "url": base.replace("root@", "nobody:hunter2@") + "/nowhere"}
    h = await started(daemon(producer, late, wrong), receiver)
    assert h.get("/readyz")[0] == 200

    def source_up(name: str) -> float | None:
        return scrape(h).get(f'herald_source_up{{source="{name}"}}')

    await until(lambda: source_up("late") == 0 and source_up("wrong") == 0, "both down")
    await until(lambda: source_up(SOURCE) == 1, "the good source up")
    assert scrape(h)['herald_storage_errors_total{component="source"}'] >= 2
    # The good source delivers meanwhile.
    kept = await asyncio.to_thread(place_order, producer, 5)
    await receiver.wait_for(lambda: kept in receiver.counts(), what="the good source's event")
    shown = await h.acli("outbox", "sources", "--json", check=False)
    assert shown.returncode == 1  # a source is down
    listed = {s["name"]: s for s in json.loads(shown.stdout)["data"]}
    assert (listed[SOURCE]["state"], listed["late"]["state"]) == ("up", "down")
    assert "late_outbox" in str(listed["late"]["error"])
    assert listed["wrong"]["state"] == "down"
    check = await h.acli("check-config", "--check-db", check=False)
    assert check.returncode == 1, check.stdout
    assert "outbox source late" in check.stdout
    # The console's overview says which source is down and why; its rejected rows page
    # names each row's source.
    console = Client(h)
    assert console.sign_in((await h.acli("keys", "create", "--operator")).stdout.strip()) == 303
    status, page = await asyncio.to_thread(console.request, "/console/")
    assert status == 200
    assert 'id="sources"' in page
    assert "late_outbox" in page
    assert "down" in page
    for text in (check.stdout, json.dumps(listed), h.log(), page):
        assert "hunter2" not in text

    # The missing table appears: the source comes up and its rows are delivered.
    ddl = outbox_ddl("mysql", "late_outbox")
    await asyncio.to_thread(producer.run, ddl.strip().removesuffix(";"))
    with producer.transaction() as conn:
        event_id = publish(conn, "order.placed", {"total": 7}, table="late_outbox")
    await receiver.wait_for(lambda: event_id in receiver.counts(), what="the late source's event")
    await until(lambda: source_up("late") == 1, "the late source up")
    assert h.get("/readyz")[0] == 200
    events = [e for e in h.log_events() if e.get("source") == "late"]
    assert [e["event"] for e in events if e["event"].startswith("source_")][:2] == [
        "source_down",
        "source_up",
    ], "one line per change of state, not one per retry"
    assert await h.astop() == 0


@pytest.mark.parametrize("producer", ["mysql"], indirect=True)
async def test_one_instance_relays_a_source_and_another_takes_it_over(
    tmp_path: Path, producer: Producer, receiver: Receiver
) -> None:
    """Two instances on PostgreSQL share one MariaDB source: one relays it under the
    lease; kill -9 that one and the other takes the source over, nothing lost."""
    url = await create_postgres_database()
    instances = []
    try:
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            h = Herald(tmp_path / name, {"relay": {"batch_size": 10}}, database_url=url)
            with h.config_path.open("a") as fh:
                fh.write(f'[[outbox.sources]]\nname = "{SOURCE}"\nurl = "{producer.url}"\n')
            if name == "b":  # one encryption key for both: they share the credentials
                (tmp_path / "b" / "herald.key").write_bytes(
                    (tmp_path / "a" / "herald.key").read_bytes()
                )
            await launch(h)
            instances.append(h)
        a, b = instances
        await a.acreate_webhook(receiver.url, secret=SECRET, events=["order.*"])

        def holder() -> Herald | None:
            rows = a.query("SELECT owner FROM herald_source_leases WHERE source = ?", (SOURCE,))
            pid = int(str(rows[0][0]).split(":")[1]) if rows else None
            return next((h for h in instances if h.proc is not None and h.proc.pid == pid), None)

        await until(lambda: holder() is not None, "a lease holder")
        first = await asyncio.to_thread(place_order, producer, 1)
        await receiver.wait_for(lambda: first in receiver.counts(), what="the first event")
        relaying = holder()
        assert relaying is not None
        other = b if relaying is a else a
        total = 500
        with producer.transaction() as conn:
            ids = [publish(conn, "order.placed", {"n": i}) for i in range(total)]
        await until(lambda: producer.count() < total, "the drain to begin", timeout=30)
        relaying.kill()
        await receiver.wait_for(
            lambda: set(receiver.counts()) >= set(ids), timeout=90, what="every event"
        )
        await until(lambda: producer.count() == 0, "the source table to empty")
        assert holder() is other
        assert (
            other.query("SELECT COUNT(*) FROM herald_events WHERE type = 'order.placed'")[0][0]
            == total + 1
        )
        assert await other.astop() == 0
    finally:
        for h in instances:
            if h.proc is not None and h.proc.poll() is None:
                h.kill()
        await drop_postgres_database(url)


async def test_a_source_outage_loses_nothing(
    tmp_path: Path, daemon: Callable[..., Herald], receiver: Receiver
) -> None:
    """A throwaway MariaDB server stops in the middle of a drain and comes back: every
    event is delivered once, ``herald_source_up`` goes 0 then 1."""
    server = ThrowawayMariaDB(tmp_path / "mariadb")
    (tmp_path / "mariadb").mkdir()
    await asyncio.to_thread(server.install)
    await asyncio.to_thread(server.start)
    try:
        producer = await asyncio.to_thread(server.producer)
        h = await started(daemon(producer, batch_size=10), receiver)

        def source_up() -> float | None:
            return scrape(h).get(f'herald_source_up{{source="{SOURCE}"}}')

        await until(lambda: source_up() == 1, "the source up")
        total = 1000
        with producer.transaction() as conn:
            before = [publish(conn, "order.placed", {"n": i}) for i in range(total)]
        await until(lambda: producer.count() < total, "the drain to begin", timeout=30)
        await asyncio.to_thread(server.stop)
        await until(lambda: source_up() == 0, "the source down")
        errors = scrape(h)['herald_storage_errors_total{component="source"}']
        await until(
            lambda: scrape(h)['herald_storage_errors_total{component="source"}'] > errors,
            "a retry while it is down",
        )
        assert h.get("/readyz")[0] == 200
        await asyncio.to_thread(server.start)
        with producer.transaction() as conn:
            after = [publish(conn, "order.placed", {"n": total + i}) for i in range(10)]
        await receiver.wait_for(
            lambda: set(receiver.counts()) >= {*before, *after}, timeout=120, what="every event"
        )
        await until(lambda: source_up() == 1, "the source up again")
        await until(lambda: producer.count() == 0, "the source table to empty")
        assert (
            h.query("SELECT COUNT(*) FROM herald_events WHERE type = 'order.placed'")[0][0]
            == total + 10
        )
        assert h.query("SELECT COUNT(*) FROM herald_outbox_rejected")[0][0] == 0
        assert await h.astop() == 0
    finally:
        await asyncio.to_thread(server.stop)


def test_the_schema_command_prints_the_ddl(tmp_path: Path) -> None:
    h = Herald(tmp_path)
    for dialect in ("postgresql", "mysql", "sqlite"):
        out = h.cli("outbox", "schema", "--dialect", dialect, "--table", "shop_outbox").stdout
        assert out == outbox_ddl(dialect, "shop_outbox")
    bad = h.cli("outbox", "schema", "--dialect", "oracle", check=False)
    assert bad.returncode == 2
    assert "unknown value 'oracle'" in bad.stderr


@pytest.mark.parametrize("producer", ["postgresql"], indirect=True)
async def test_two_sources_and_the_built_in_outbox_at_once(
    tmp_path: Path, daemon: Callable[..., Herald], producer: Producer, receiver: Receiver
) -> None:
    """A PostgreSQL source, a MariaDB source and Herald's own outbox, written at the
    same time: every event of each is delivered once."""
    async with producer_database("mysql", tmp_path) as mysql:
        h = await started(daemon(producer, {"name": "billing", "url": mysql.url}), receiver)
        per = 200

        def write(p: Producer, start: int) -> list[str]:
            with p.transaction() as conn:
                return [publish(conn, "order.placed", {"n": start + i}) for i in range(per)]

        builtin = [(f"evt_own{i:04d}", "default", "order.placed", "{}") for i in range(per)]
        pg_ids, my_ids, _ = await asyncio.gather(
            asyncio.to_thread(write, producer, 0),
            asyncio.to_thread(write, mysql, per),
            asyncio.to_thread(h.insert_events, builtin),
        )
        wanted = {*pg_ids, *my_ids, *(r[0] for r in builtin)}
        await receiver.wait_for(lambda: set(receiver.counts()) >= wanted, what="every event")
        # One event and one delivery each (a receiver may see a retried one twice).
        for table, column in (("herald_events", "type"), ("herald_deliveries", "event_type")):
            sql = f"SELECT COUNT(*) FROM {table} WHERE {column} = 'order.placed'"
            assert h.query(sql)[0][0] == 3 * per
        await until(lambda: producer.count() == 0 and mysql.count() == 0, "the sources empty")
        samples = scrape(h)
        for source in (SOURCE, "billing"):
            assert samples[f'herald_source_up{{source="{source}"}}'] == 1
        assert await h.astop() == 0


LEGACY_DDL = """CREATE TABLE event_outbox (
    seq BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    event_id VARCHAR(255) NOT NULL,
    tenant_id VARCHAR(255) NOT NULL DEFAULT 'default',
    event_type VARCHAR(255) NOT NULL,
    payload LONGTEXT NOT NULL,
    created_at DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    traceparent VARCHAR(55)
) ENGINE=InnoDB"""
DEBEZIUM_DDL = """CREATE TABLE outboxevent (
    id VARCHAR(255) NOT NULL PRIMARY KEY,
    aggregatetype VARCHAR(255) NOT NULL,
    aggregateid VARCHAR(255) NOT NULL,
    type VARCHAR(255) NOT NULL,
    payload JSON NOT NULL,
    seq BIGINT NOT NULL AUTO_INCREMENT UNIQUE
) ENGINE=InnoDB"""


@pytest.mark.parametrize("producer", ["mysql"], indirect=True)
async def test_tables_with_other_column_names_and_debeziums_shape(
    daemon: Callable[..., Herald], producer: Producer, receiver: Receiver
) -> None:
    """``columns`` reads an outbox table with other names, and Debezium's outbox table
    (``id``/``aggregatetype``/``aggregateid``/``type``/``payload``, with the ``seq``
    column docs/sources.md has it add) with the mapping docs/sources.md gives."""
    await asyncio.to_thread(producer.run, LEGACY_DDL)
    await asyncio.to_thread(producer.run, DEBEZIUM_DDL)
    legacy = {
        "name": "legacy",
        "url": producer.url,
        "table": "event_outbox",
        "columns": {"id": "event_id", "type": "event_type", "data": "payload"},
    }
    debezium = {
        "name": "debezium",
        "url": producer.url,
        "table": "outboxevent",
        "columns": {"data": "payload", "tenant_id": "", "created_at": "", "traceparent": ""},
    }
    await started(daemon(producer, legacy, debezium), receiver)
    await asyncio.to_thread(
        producer.run,
        "INSERT INTO event_outbox (event_id, event_type, payload) VALUES (%s, %s, %s)",
        ("evt_legacy_1", "order.placed", '{"total": 1}'),
    )
    await asyncio.to_thread(
        producer.run,
        "INSERT INTO outboxevent (id, aggregatetype, aggregateid, type, payload)"
        " VALUES (%s, %s, %s, %s, %s)",
        ("evt_9f1c2a4e-1b7d-4c55-9a0e-0d5f3c1e2b6a", "order", "42", "order.shipped", '{"n": 2}'),
    )
    wanted = {"evt_legacy_1", "evt_9f1c2a4e-1b7d-4c55-9a0e-0d5f3c1e2b6a"}
    await receiver.wait_for(
        lambda: set(receiver.counts()) >= wanted, timeout=90, what="both events"
    )
    got = {e.envelope["id"]: e for e in receiver.events()}
    assert all(e.verified for e in got.values()), receiver.errors
    assert got["evt_legacy_1"].envelope["type"] == "order.placed"
    assert got["evt_legacy_1"].envelope["data"] == {"total": 1}
    shipped = got["evt_9f1c2a4e-1b7d-4c55-9a0e-0d5f3c1e2b6a"].envelope
    assert (shipped["type"], shipped["data"]) == ("order.shipped", {"n": 2})
    await until(
        lambda: producer.count("event_outbox") == 0 and producer.count("outboxevent") == 0,
        "both tables to empty",
    )
