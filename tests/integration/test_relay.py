"""The outbox relay over a real database: poison rows, fan-out, producers' transactions.

Every test runs on SQLite and on PostgreSQL; the ones about what only SQLite's
untyped columns admit (invalid UTF-8, BLOBs, text that is not JSON) and about
the sqlite3 producer helper are marked ``sqlite_only``.
"""

from __future__ import annotations

import asyncio
import json
import math
import sqlite3
import time
from typing import Any

import orjson
import pytest

from herald.model import DeliveryKind, DeliveryStatus, DestinationStatus
from herald.outbox import publish
from herald.timeutil import parse_timestamp
from tests.integration.conftest import (
    Harness,
    HarnessFactory,
    ReceiverFactory,
    eventually,
    running,
)
from tests.support.sql import Db

GOOD_TS = "2026-03-04T05:06:07.123456Z"


def insert_raw(
    conn: Db | sqlite3.Connection, id_: Any, type_: Any, data: Any, created_at: Any
) -> None:
    conn.execute(
        "INSERT INTO herald_outbox (id, type, data, created_at) VALUES (?, ?, ?, ?)",
        (id_, type_, data, created_at),
    )


@pytest.mark.sqlite_only
async def test_poison_rows_are_rejected_with_reasons_and_never_block_good_rows(
    harness: Harness,
) -> None:
    h = harness
    dest = await h.add_webhook("http://127.0.0.1:1/hook")
    # An event ingested earlier, whose id a producer then reuses.
    await h.emit("order.created", {"n": 0}, id="evt_dup")

    poison: list[tuple[Any, Any, Any, Any, str]] = [
        ("evt_p1", "order.created", "{nope", GOOD_TS, "invalid_json"),
        ("evt_p2", "order.created", "[1, 2]", GOOD_TS, "invalid_data"),
        ("evt_p3", "", "{}", GOOD_TS, "invalid_type"),
        ("abc_p4", "order.created", "{}", GOOD_TS, "invalid_id"),
        ("evt_p5", "order.created", sqlite3.Binary(b'{"a": "\xff\xfe"}'), GOOD_TS, "invalid_json"),
        ("evt_p6", sqlite3.Binary(b"order.\xffcreated"), "{}", GOOD_TS, "invalid_type"),
        ("evt_p7\x00x", "order.created", "{}", GOOD_TS, "invalid_id"),
        ("evt_p8", "order.created", "{}", "yesterday at noon", "invalid_created_at"),
        ("evt_p9", "order.created", "{}", "2026-02-30T00:00:00Z", "invalid_created_at"),
        ("evt_dup", "order.created", '{"n": 1}', GOOD_TS, "duplicate_id"),
    ]
    good: list[str] = []
    with h.sqlite() as conn:
        for i, (id_, type_, data, created_at, _) in enumerate(poison):
            good_id = f"evt_good{i}"
            insert_raw(conn, good_id, "order.created", f'{{"i": {i}}}', GOOD_TS)
            good.append(good_id)
            insert_raw(conn, id_, type_, data, created_at)
        insert_raw(conn, "evt_last", "order.created", "{}", GOOD_TS)
        good.append("evt_last")
        # Invalid UTF-8 stored as TEXT, as a producer in another language can write it.
        conn.execute(
            "INSERT INTO herald_outbox (id, type, data, created_at)"
            " VALUES ('evt_p10', CAST(X'6F726465722E6372656174FF' AS TEXT), '{}', ?)",
            (GOOD_TS,),
        )
    poison_ids = [p[0] for p in poison]

    assert await h.relay.run_once() == len(poison) + len(good) + 1
    assert h.scalar("SELECT COUNT(*) FROM herald_outbox") == 0

    # Every good row became an event with one delivery.
    events = {r[0]: r[1] for r in h.rows("SELECT id, data FROM herald_events")}
    assert set(events) == {"evt_dup", *good}
    assert events["evt_good3"] == '{"i": 3}'
    assert events["evt_dup"] == '{"n":0}'  # the original, not the duplicate's payload
    deliveries = await h.deliveries(destination_id=dest.id)
    assert sorted(d.event_id for d in deliveries) == sorted(["evt_dup", *good])

    rejected = h.rows(
        "SELECT seq, id, type, data, created_at, reason FROM herald_outbox_rejected ORDER BY seq"
    )
    assert len(rejected) == len(poison) + 1
    reasons = [r[5].split(":")[0] for r in rejected]
    assert reasons == [p[4] for p in poison] + ["invalid_type"]
    by_reason = {r[1]: r for r in rejected}
    # Kept for the operator, readable: undecodable bytes as U+FFFD, NUL made visible.
    assert by_reason["evt_p5"][3] == '{"a": "\ufffd\ufffd"}'
    assert by_reason["evt_p6"][2] == "order.\ufffdcreated"
    assert "evt_p7\\u0000x" in by_reason
    assert by_reason["evt_p8"][4] == "yesterday at noon"
    assert "NUL" in by_reason["evt_p7\\u0000x"][5]
    assert "UTF-8" in by_reason["evt_p6"][5]
    assert "already ingested" in by_reason["evt_dup"][5]
    assert rejected[-1][2] == "order.creat\ufffd"
    # Rejected rows keep their outbox seq, and list_rejected shows them newest first.
    listed = await h.store.list_rejected(limit=100)
    assert [r["seq"] for r in listed] == [r[0] for r in reversed(rejected)]
    assert [r[1] for r in rejected] == [
        *(str(p) for p in poison_ids[:6]),
        "evt_p7\\u0000x",
        *poison_ids[7:],
        "evt_p10",
    ]


async def test_poison_rows_a_typed_outbox_admits_are_rejected_too(harness: Harness) -> None:
    # PostgreSQL's jsonb and timestamptz columns refuse much of the above at the
    # producer's insert; these rows get through on both backends.
    h = harness
    dest = await h.add_webhook("http://127.0.0.1:1/hook")
    await h.emit("order.created", {"n": 0}, id="evt_dup")
    poison: list[tuple[str, str, str, str, str]] = [
        ("evt_q1", "order.created", "[1, 2]", GOOD_TS, "invalid_data"),
        ("evt_q2", "order.created", '"just text"', GOOD_TS, "invalid_data"),
        ("evt_q3", "order.created", "null", GOOD_TS, "invalid_data"),
        ("evt_q4", "", "{}", GOOD_TS, "invalid_type"),
        ("evt_q5", "Not A Type", "{}", GOOD_TS, "invalid_type"),
        ("abc_q6", "order.created", "{}", GOOD_TS, "invalid_id"),
        ("evt_", "order.created", "{}", GOOD_TS, "invalid_id"),
        ("evt_" + "x" * 300, "order.created", "{}", GOOD_TS, "invalid_id"),
        # Control characters: a header injection, a terminal escape, a C1 control.
        ("evt_q11\r\nX-Injected: yes", "order.created", "{}", GOOD_TS, "invalid_id"),
        ("evt_q12\x1b]0;PWNED\x07", "order.created", "{}", GOOD_TS, "invalid_id"),
        ("evt_q13\u0085", "order.created", "{}", GOOD_TS, "invalid_id"),
        ("evt_q14", "order.created\r\nX: y", "{}", GOOD_TS, "invalid_type"),
        ("evt_dup", "order.created", '{"n": 1}', GOOD_TS, "duplicate_id"),
        # Instants a timestamptz holds that are no RFC 3339 time: never shifted or dropped.
        ("evt_q7", "order.created", "{}", "infinity", "invalid_created_at"),
        ("evt_q8", "order.created", "{}", "-infinity", "invalid_created_at"),
        ("evt_q9", "order.created", "{}", "0044-03-15 12:00:00+00 BC", "invalid_created_at"),
        ("evt_q10", "order.created", "{}", "10000-01-01T00:00:00Z", "invalid_created_at"),
    ]
    good: list[str] = []
    with h.sql() as conn:
        for i, (id_, type_, data, created_at, _) in enumerate(poison):
            insert_raw(conn, f"evt_good{i}", "order.created", f'{{"i": {i}}}', GOOD_TS)
            good.append(f"evt_good{i}")
            insert_raw(conn, id_, type_, data, created_at)
    count, oldest = await h.store.outbox_stats()
    assert count == 2 * len(poison)
    assert oldest is None or math.isfinite(oldest)

    assert await h.relay.run_once() == 2 * len(poison)
    assert h.scalar("SELECT COUNT(*) FROM herald_outbox") == 0
    events = {r[0]: r[1] for r in h.rows("SELECT id, data FROM herald_events")}
    assert set(events) == {"evt_dup", *good}
    assert orjson.loads(events["evt_dup"]) == {"n": 0}  # the original, not the duplicate's
    deliveries = await h.deliveries(destination_id=dest.id)
    assert sorted(d.event_id for d in deliveries) == sorted(["evt_dup", *good])
    rejected = h.rows("SELECT seq, id, reason FROM herald_outbox_rejected ORDER BY seq")
    assert [(r[1], r[2].split(":")[0]) for r in rejected] == [(p[0], p[4]) for p in poison]
    by_id = {r[1]: r[2] for r in rejected}
    assert "already ingested" in by_id["evt_dup"]
    assert "must be a JSON object" in by_id["evt_q1"]
    assert "control character" in by_id["evt_q11\r\nX-Injected: yes"]
    for id_ in ("evt_q7", "evt_q8", "evt_q9", "evt_q10"):
        assert "invalid timestamp" in by_id[id_], by_id[id_]
    listed = await h.store.list_rejected(limit=100)
    assert [r["seq"] for r in listed] == [r[0] for r in reversed(rejected)]


async def test_oversized_payload_is_rejected(harness_factory: HarnessFactory) -> None:
    h = await harness_factory(relay={"max_payload_bytes": 1024})
    with h.sql() as conn:
        insert_raw(conn, "evt_big", "a.b", orjson.dumps({"x": "y" * 2000}).decode(), GOOD_TS)
        insert_raw(conn, "evt_small", "a.b", "{}", GOOD_TS)
    assert await h.relay.run_once() == 2
    [(reason,)] = h.rows("SELECT reason FROM herald_outbox_rejected")
    assert reason.startswith("payload_too_large:")
    assert [r[0] for r in h.rows("SELECT id FROM herald_events")] == ["evt_small"]


async def test_fan_out_follows_tenant_subscriptions_and_holds_unverified(
    harness: Harness,
) -> None:
    h = harness
    url = "http://127.0.0.1:1/hook"
    exact = await h.add_webhook(url, events=["workflow_run.completed"])
    star = await h.add_webhook(url, events=["*"])
    family = await h.add_webhook(url, events=["workflow_run.*"])
    other_family = await h.add_webhook(url, events=["invoice.*", "order.created"])
    inactive = await h.add_webhook(url, events=["*"], status=DestinationStatus.INACTIVE)
    pending = await h.add_webhook(
        url, events=["workflow_run.*"], status=DestinationStatus.PENDING_VERIFICATION
    )
    acme = await h.add_webhook(url, events=["*"], tenant="acme")
    deleted = await h.add_webhook(url, events=["*"])
    await h.store.delete_destination("default", deleted.id, now=time.time())

    e1 = await h.emit("workflow_run.completed")
    e2 = await h.emit("workflow_run.step.failed")
    e3 = await h.emit("workflow_run")  # no dot: not in the workflow_run.* family
    e4 = await h.emit("workflow_runs.completed")  # another family
    e5 = await h.emit("order.created", tenant_id="acme")
    e6 = await h.emit("order.created")
    e7 = await h.emit("order.created", tenant_id="nobody")

    async def fanned(event_id: str) -> dict[str, bool]:
        ds = await h.deliveries()
        return {d.destination_id: d.held for d in ds if d.event_id == event_id}

    live = {star.id: False, inactive.id: True}
    assert await fanned(e1) == {**live, exact.id: False, family.id: False, pending.id: True}
    assert await fanned(e2) == {**live, family.id: False, pending.id: True}
    assert await fanned(e3) == live
    assert await fanned(e4) == live
    assert await fanned(e5) == {acme.id: False}
    assert await fanned(e6) == {**live, other_family.id: False}
    assert await fanned(e7) == {}
    assert h.scalar("SELECT COUNT(*) FROM herald_events WHERE id = ?", (e7,)) == 1
    for d in await h.deliveries():
        assert d.status is DeliveryStatus.PENDING
        assert d.kind is DeliveryKind.EVENT
        assert d.attempt_count == 0
        assert d.max_attempts == 0  # its first round; the budget is the daemon's
        assert d.tenant_id == ("acme" if d.event_id == e5 else "default")


async def test_two_tenants_may_use_the_same_event_id_in_the_outbox(
    harness: Harness, receivers: ReceiverFactory
) -> None:
    """An event id is unique per tenant: another tenant's event of the same id neither
    fails the producer's INSERT nor is rejected by the relay, and each event reaches
    its own tenant's destinations with its own payload. Within a tenant the id stays
    taken."""
    h = harness
    tenants = ("acme", "globex", "initech")
    rx = {t: await receivers() for t in tenants}
    for t in tenants:
        await h.add_webhook(rx[t].url, tenant=t)
    # Two tenants' rows of one id wait in the outbox together: one relay batch.
    with h.sql() as db:
        for t in tenants[:2]:
            h.produce("order.created", {"t": t}, db=db, tenant_id=t, id="evt_same")
    assert await h.relay.run_once() == 2
    # A third tenant's row of that id arrives after the first two were stored, and
    # the first tenant reuses its own id.
    h.produce("order.created", {"t": "initech"}, tenant_id="initech", id="evt_same")
    h.produce("order.created", {"t": "acme", "again": True}, tenant_id="acme", id="evt_same")
    assert await h.relay.run_once() == 2

    rejected = h.rows("SELECT id, tenant_id, reason FROM herald_outbox_rejected")
    assert [(r[0], r[1], r[2].split(":")[0]) for r in rejected] == [
        ("evt_same", "acme", "duplicate_id")
    ]
    stored = h.rows("SELECT tenant_id, id, data FROM herald_events ORDER BY tenant_id")
    assert [(r[0], r[1], orjson.loads(r[2])) for r in stored] == [
        (t, "evt_same", {"t": t}) for t in tenants
    ]
    for t in tenants:
        event = await h.store.get_event(t, "evt_same")
        assert event is not None
        assert orjson.loads(event.data) == {"t": t}

    async def all_delivered() -> bool:
        done = await h.deliveries(status=DeliveryStatus.SUCCESS)
        return len(done) == len(tenants)

    async with running(h.dispatcher()):
        await eventually(all_delivered, what="each tenant's event delivered")
    for t in tenants:
        [got] = rx[t].received
        assert (got.event_id, got.envelope["data"]) == ("evt_same", {"t": t})
        assert got.verified
    assert len(await h.deliveries()) == len(tenants)


@pytest.mark.sqlite_only
async def test_publish_helper_writes_a_row_the_relay_picks_up(harness: Harness) -> None:
    h = harness
    dest = await h.add_webhook("http://127.0.0.1:1/hook", tenant="t1", events=["task_run.*"])
    with h.sqlite() as conn:
        # In the producer's own transaction, next to its business write.
        conn.execute("CREATE TABLE IF NOT EXISTS tasks (id TEXT)")
        conn.execute("INSERT INTO tasks VALUES ('t1')")
        event_id = publish(
            conn,
            "task_run.completed",
            {"task": "t1", "ok": True},
            tenant_id="t1",
            created_at="2026-01-02T03:04:05.5+01:00",
        )
    assert event_id.startswith("evt_")
    # A rolled-back producer transaction publishes nothing.
    with sqlite3.connect(h.db_path) as conn:
        publish(conn, "task_run.completed", {"task": "t2"}, tenant_id="t1")
        conn.rollback()
    conn.close()
    assert h.rows("SELECT id, tenant_id, type FROM herald_outbox") == [
        (event_id, "t1", "task_run.completed")
    ]
    assert await h.relay.run_once() == 1
    event = await h.store.get_event("t1", event_id)
    assert event is not None
    assert event.type == "task_run.completed"
    assert event.created_at == "2026-01-02T02:04:05.5Z"
    assert event.data == b'{"task":"t1","ok":true}'
    assert await h.store.get_event("default", event_id) is None
    [d] = await h.deliveries()
    assert (d.event_id, d.destination_id, d.held) == (event_id, dest.id, False)

    with h.sqlite() as conn:
        with pytest.raises(ValueError, match="evt_"):
            publish(conn, "a.b", {}, id="nope_1")
        with pytest.raises(ValueError, match="event type"):
            publish(conn, "Not A Type", {})


async def test_a_producer_transaction_publishes_on_commit_only(harness: Harness) -> None:
    # The producer's contract in plain SQL: the outbox row commits with its business write.
    h = harness
    dest = await h.add_webhook("http://127.0.0.1:1/hook", tenant="t1", events=["task_run.*"])
    insert = (
        "INSERT INTO herald_outbox (id, tenant_id, type, data, created_at) VALUES (?, ?, ?, ?, ?)"
    )
    with h.sql() as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS tasks (id TEXT)")
        conn.execute("INSERT INTO tasks VALUES ('t1')")
        conn.execute(
            insert,
            (
                "evt_task1",
                "t1",
                "task_run.completed",
                '{"task": "t1", "ok": true}',
                "2026-01-02T03:04:05.5+01:00",
            ),
        )

    # A rolled-back producer transaction publishes nothing, and writes nothing else either.
    def failing_producer() -> None:
        with h.sql() as conn:
            conn.execute("INSERT INTO tasks VALUES ('t2')")
            conn.execute(insert, ("evt_task2", "t1", "task_run.completed", "{}", GOOD_TS))
            raise RuntimeError("business rule failed")

    with pytest.raises(RuntimeError, match="business rule"):
        failing_producer()
    assert h.rows("SELECT id FROM tasks") == [("t1",)]
    assert h.rows("SELECT id, tenant_id, type FROM herald_outbox") == [
        ("evt_task1", "t1", "task_run.completed")
    ]
    # Visible right away, before the relay has taken it.
    waiting = await h.store.get_outbox_event("t1", "evt_task1")
    assert waiting is not None
    assert waiting.type == "task_run.completed"
    assert await h.relay.run_once() == 1
    event = await h.store.get_event("t1", "evt_task1")
    assert event is not None
    assert event.type == "task_run.completed"
    assert (
        parse_timestamp(event.created_at).epoch == parse_timestamp("2026-01-02T02:04:05.5Z").epoch
    )
    assert event.created_at.startswith("2026-01-02T02:04:05.5")
    assert event.created_at.endswith("Z")
    assert orjson.loads(event.data) == {"task": "t1", "ok": True}
    assert await h.store.get_event("default", "evt_task1") is None
    [d] = await h.deliveries()
    assert (d.event_id, d.destination_id, d.held) == ("evt_task1", dest.id, False)


async def test_relay_loop_drains_batches_in_background(harness_factory: HarnessFactory) -> None:
    h = await harness_factory(relay={"batch_size": 100, "poll_interval_seconds": 0.02})
    await h.add_webhook("http://127.0.0.1:1/hook")
    h.produce_many("a.b", [{"i": i} for i in range(250)])
    stop = asyncio.Event()
    task = asyncio.create_task(h.relay.run(stop))
    try:

        async def drained() -> bool:
            return int(h.scalar("SELECT COUNT(*) FROM herald_deliveries")) == 250

        await eventually(drained, timeout=10, what="250 deliveries")
        seen_running = h.relay.running
        assert seen_running
        # A row written later is picked up by the poll.
        late = h.produce("a.b", {"late": True})

        async def late_seen() -> bool:
            return await h.store.get_event(None, late) is not None

        await eventually(late_seen, timeout=5, what="the late event")
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
    assert not h.relay.running
    assert h.scalar("SELECT COUNT(*) FROM herald_outbox") == 0


@pytest.mark.sqlite_only
async def test_outbox_stats_survive_an_undecodable_row(harness: Harness) -> None:
    h = harness
    with h.sqlite() as conn:
        conn.execute(
            "INSERT INTO herald_outbox (id, type, data, created_at)"
            " VALUES ('evt_x', 'a.b', '{}', CAST(X'FF' AS TEXT))"
        )
        publish(conn, "a.b", {})
    count, oldest = await h.store.outbox_stats()
    assert count == 2
    assert oldest is None


async def test_outbox_stats_count_rows_and_date_the_oldest(harness: Harness) -> None:
    h = harness
    assert await h.store.outbox_stats() == (0, None)
    with h.sql() as conn:
        insert_raw(conn, "evt_s1", "a.b", "{}", "2026-01-02T03:04:05.25Z")
        insert_raw(conn, "evt_s2", "a.b", "{}", "2026-01-02T03:04:06Z")
    count, oldest = await h.store.outbox_stats()
    assert count == 2
    assert oldest == parse_timestamp("2026-01-02T03:04:05.25Z").epoch


async def test_timestamps_are_normalized_but_keep_their_precision(harness: Harness) -> None:
    h = harness
    with h.sql() as conn:
        if h.backend == "postgres":
            # A timestamptz without a zone is read in the producer's session time zone.
            conn.execute("SET LOCAL TIME ZONE 'UTC'")
        insert_raw(conn, "evt_nano", "a.b", "{}", "2026-01-02T03:04:05.123456789Z")
        insert_raw(conn, "evt_space", "a.b", "{}", "2026-01-02 03:04:05.5")
        insert_raw(conn, "evt_offset", "a.b", "{}", "2026-01-02T03:04:05-02:30")
    assert await h.relay.run_once() == 3
    got = dict(h.rows("SELECT id, created_at FROM herald_events"))
    if h.backend == "sqlite":
        # The producer's text, normalized to UTC: every digit it gave is kept.
        assert got == {
            "evt_nano": "2026-01-02T03:04:05.123456789Z",
            "evt_space": "2026-01-02T03:04:05.5Z",
            "evt_offset": "2026-01-02T05:34:05Z",
        }
    else:
        # A timestamptz holds microseconds (rounded on insert), and shows all six.
        assert got == {
            "evt_nano": "2026-01-02T03:04:05.123457Z",
            "evt_space": "2026-01-02T03:04:05.500000Z",
            "evt_offset": "2026-01-02T05:34:05.000000Z",
        }


async def test_an_empty_tenant_is_rejected(harness: Harness) -> None:
    h = harness
    with h.sql() as conn:
        conn.execute(
            "INSERT INTO herald_outbox (id, tenant_id, type, data, created_at)"
            " VALUES ('evt_t', '', 'a.b', '{}', ?)",
            (GOOD_TS,),
        )
    assert await h.relay.run_once() == 1
    [(reason,)] = h.rows("SELECT reason FROM herald_outbox_rejected")
    assert reason.startswith("invalid_tenant_id:")


async def test_payload_numbers_reach_receivers_unaltered(harness: Harness) -> None:
    h = harness
    raw = '{"amount":123456789012345678901234567890,"ratio":0.1}'
    with h.sql() as conn:
        insert_raw(conn, "evt_big", "a.b", raw, GOOD_TS)
    assert await h.relay.run_once() == 1
    assert h.rows("SELECT COUNT(*) FROM herald_outbox_rejected") == [(0,)]
    event = await h.store.get_event(None, "evt_big")
    assert event is not None
    if h.backend == "sqlite":
        assert event.data.decode() == raw  # the producer's bytes
    else:
        # jsonb keeps every digit (numeric) but not the producer's layout or key order.
        assert "123456789012345678901234567890" in event.data.decode()
        assert json.loads(event.data) == {"amount": 123456789012345678901234567890, "ratio": 0.1}
