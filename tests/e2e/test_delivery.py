"""The daemon as a user runs it: `herald run` in a subprocess, events written
into the outbox with plain SQL, webhooks received and verified on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import pytest
from aiohttp import web

from tests.e2e.conftest import SECRET, HeraldFactory
from tests.support.daemon import Herald, free_port
from tests.support.receiver import Behaviour, Received, Receiver, verification_ok_then

pytestmark = pytest.mark.e2e


def rows(
    n: int, *, prefix: str = "evt_e2e", type_: str = "task_run.completed", tenant: str = "default"
) -> list[tuple[str, str, str, str]]:
    return [
        (f"{prefix}{i:05d}", tenant, type_, json.dumps({"task_run_id": f"trun_{i}", "n": i}))
        for i in range(n)
    ]


def all_arrived(r: Receiver, n: int) -> Callable[[], bool]:
    return lambda: len(r.counts("task_run.completed")) == n


async def wait_active(h: Herald, dest_id: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (
            h.query("SELECT status FROM herald_destinations WHERE id = ?", (dest_id,))[0][0]
            == "active"
        ):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{dest_id} did not become active")


async def wait_deliveries(h: Herald, where: str, count: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        n = h.query(f"SELECT COUNT(*) FROM herald_deliveries WHERE {where}")[0][0]
        if n >= count:
            return
        await asyncio.sleep(0.05)
    n = h.query(f"SELECT COUNT(*) FROM herald_deliveries WHERE {where}")[0][0]
    raise AssertionError(f"only {n} of {count} deliveries with {where}\n{h.log()[-3000:]}")


async def test_event_reaches_a_verified_webhook_signed(
    herald_factory: HeraldFactory, receiver: Receiver
) -> None:
    h = herald_factory()
    dest = await h.acreate_webhook(receiver.url, secret=SECRET, events=["task_run.*"])
    assert dest["status"] == "pending_verification"
    assert dest["webhook"]["secret"] == "********"
    await wait_active(h, dest["id"])
    assert [r.type for r in receiver.received] == ["destination.verification"]

    h.insert_events(
        [
            (
                "evt_one",
                "default",
                "task_run.completed",
                '{"task_run_id": "trun_1", "status": "completed"}',
            ),
            ("evt_not_subscribed", "default", "credential.verified", "{}"),
        ]
    )
    await receiver.wait_for(
        lambda: len(receiver.events("task_run.completed")) == 1, what="delivery"
    )
    got = receiver.events("task_run.completed")[0]
    assert got.verified, receiver.errors
    assert got.headers["webhook-id"] == "evt_one"
    assert got.headers["content-type"] == "application/json"
    assert got.envelope == {
        "id": "evt_one",
        "type": "task_run.completed",
        "created_at": got.envelope["created_at"],
        "data": {"task_run_id": "trun_1", "status": "completed"},
    }
    assert got.envelope["created_at"].endswith("Z")
    await wait_deliveries(h, "status = 'success' AND kind = 'event'", 1)
    await asyncio.sleep(0.3)
    assert receiver.events("credential.verified") == []
    shown = await h.acli_json("deliveries", "list", "--status", "success")
    ids = {d["event_id"] for d in shown["data"]}
    assert "evt_one" in ids
    assert shown["object"] == "list"
    assert await h.astop() == 0


@pytest.mark.backend_neutral
async def test_exact_retry_schedule_then_failure(
    herald_factory: HeraldFactory, receiver: Receiver
) -> None:
    base = 0.01
    # An idle poll longer than the tolerance: a retry that waited for it shows.
    delivery = {"backoff_base_seconds": base, "max_retries": 10, "idle_poll_seconds": 1.5}
    h = herald_factory({"delivery": delivery})
    receiver.behaviour = verification_ok_then(lambda _: web.Response(status=500))
    dest = await h.acreate_webhook(receiver.url, secret=SECRET)
    await wait_active(h, dest["id"])
    h.insert_events([("evt_sched", "default", "task_run.failed", "{}")])
    await wait_deliveries(h, "status = 'failure' AND kind = 'event'", 1, timeout=60)

    arrivals = [r.at for r in receiver.events("task_run.failed")]
    assert len(arrivals) == 11
    delivery = h.query("SELECT id FROM herald_deliveries WHERE event_id = 'evt_sched'")[0][0]
    shown = await h.acli_json("deliveries", "show", delivery)
    assert shown["status"] == "failure"
    assert shown["attempt_count"] == 11
    assert shown["next_attempt_at"] is None
    attempts = shown["attempts"]
    assert [a["number"] for a in attempts] == list(range(1, 12))
    assert {a["outcome"] for a in attempts} == {"failure_retryable"}
    assert {a["response_status"] for a in attempts} == {500}
    starts = [
        h.query(
            "SELECT started_at FROM herald_attempts WHERE delivery_id = ? AND number = ?",
            (delivery, n),
        )[0][0]
        for n in range(1, 12)
    ]
    for k in range(1, 11):
        gap = starts[k] - starts[k - 1]
        expected = base * 2 ** (k - 1)
        # Never early; late only by the engine's wake-up latency.
        assert expected <= gap + 0.002, (k, gap, expected)
        assert gap < expected + 0.5, (k, gap, expected)
    # Exhausted retries end the delivery, never the destination: nothing disables it.
    assert (await h.acli_json("destinations", "show", dest["id"]))["status"] == "active"


async def test_herald_emit_writes_an_event_that_is_delivered_signed(
    herald_factory: HeraldFactory, receiver: Receiver
) -> None:
    """`herald emit` goes through the outbox like a producer's row: the event keeps the
    given id, type, time and data, reaches only its tenant's destinations, and a bad
    ``--data`` is a usage error that writes nothing."""
    h = herald_factory()
    dest = await h.acreate_webhook(receiver.url, secret=SECRET, events=["task_run.*"])
    await wait_active(h, dest["id"])
    data = '{"task_run_id": "trun_emit", "status": "completed"}'
    created = "2026-11-24T06:00:00.123456Z"
    out = await h.acli(
        "emit", "task_run.completed", "--data", data, "--id", "evt_cli_emit",
        "--created-at", created,
    )  # fmt: skip
    assert out.stdout.strip() == "evt_cli_emit"
    other = await h.acli_json("emit", "task_run.completed", "--data", data, "--tenant", "elsewhere")
    assert other["id"].startswith("evt_")
    bad = await h.acli("emit", "task_run.completed", "--data", "{not json", check=False)
    assert bad.returncode == 2, bad
    assert "data" in bad.stderr.lower()

    await receiver.wait_for(lambda: len(receiver.events("task_run.completed")) == 1, what="emit")
    got = receiver.events("task_run.completed")[0]
    assert got.verified, receiver.errors
    assert got.envelope == {
        "id": "evt_cli_emit",
        "type": "task_run.completed",
        "created_at": got.envelope["created_at"],
        "data": {"task_run_id": "trun_emit", "status": "completed"},
    }
    assert got.envelope["created_at"].startswith("2026-11-24T06:00:00.123456")
    await wait_deliveries(h, "kind = 'event'", 1)
    await asyncio.sleep(0.3)  # the other tenant's event had its chance to go astray
    assert len(receiver.events("task_run.completed")) == 1
    assert h.query("SELECT COUNT(*) FROM herald_events WHERE type = 'task_run.completed'") == [(2,)]


@pytest.mark.backend_neutral
async def test_attempt_log_lines_carry_their_ids_and_never_the_payload(
    herald_factory: HeraldFactory, receiver: Receiver
) -> None:
    """Each failed attempt is one log line naming its event, delivery, destination and
    attempt number; the event's data is in no line, even at debug level."""
    h = herald_factory(
        {"log": {"level": "debug"}, "delivery": {"max_retries": 2, "backoff_base_seconds": 0.05}}
    )
    receiver.behaviour = verification_ok_then(lambda _: web.Response(status=500))
    dest = await h.acreate_webhook(receiver.url, secret=SECRET)
    await wait_active(h, dest["id"])
    marker = "payload-marker-7f3a9c"
    h.insert_events([("evt_logged", "default", "a.b", json.dumps({"note": marker}))])
    await wait_deliveries(h, "status = 'failure' AND kind = 'event'", 1)
    delivery = h.query("SELECT id FROM herald_deliveries WHERE event_id = 'evt_logged'")[0][0]
    await h.astop()
    failed = [e for e in h.log_events() if e.get("event") == "attempt_failed"]
    assert [
        (e["event_id"], e["delivery_id"], e["destination_id"], e["attempt"], e["response_status"])
        for e in failed
    ] == [("evt_logged", delivery, dest["id"], n, 500) for n in (1, 2, 3)]
    assert all(e["tenant_id"] == "default" for e in failed)
    # At debug, a success has its one line too (the verification ping's).
    [verified] = [e for e in h.log_events() if e.get("event") == "attempt_succeeded"]
    assert (verified["kind"], verified["destination_id"]) == ("verification", dest["id"])
    assert marker not in h.log()


@pytest.mark.backend_neutral
async def test_each_kind_of_failure_counts_as_a_failed_attempt(
    herald_factory: HeraldFactory,
) -> None:
    h = herald_factory(
        {
            "delivery": {
                "max_retries": 1,
                "backoff_base_seconds": 0.05,
                "webhook_timeout_seconds": 0.5,
            }
        }
    )

    async def slow(_: Received) -> web.StreamResponse:
        await asyncio.sleep(2)
        return web.Response(status=200)

    behaviours: dict[str, Behaviour] = {
        "4xx": lambda _: web.Response(status=404),
        "5xx": lambda _: web.Response(status=503),
        "timeout": slow,
        "refused": lambda _: web.Response(status=204),
    }
    receivers: dict[str, Receiver] = {}
    for name, behaviour in behaviours.items():
        r = await Receiver(secrets=[SECRET], behaviour=verification_ok_then(behaviour)).start()
        receivers[name] = r
        dest = await h.acreate_webhook(r.url, secret=SECRET, events=[f"probe.{name}"], name=name)
        await wait_active(h, dest["id"])
    await receivers["refused"].stop()
    try:
        h.insert_events([(f"evt_{n}", "default", f"probe.{n}", "{}") for n in behaviours])
        await wait_deliveries(h, "status = 'failure' AND kind = 'event'", 4, timeout=30)
        outcomes = {}
        for name in behaviours:
            delivery = h.query(
                "SELECT id FROM herald_deliveries WHERE event_id = ?", (f"evt_{name}",)
            )
            shown = await h.acli_json("deliveries", "show", delivery[0][0])
            assert shown["attempt_count"] == 2, shown
            outcomes[name] = [(a["outcome"], a["response_status"]) for a in shown["attempts"]]
        assert outcomes["4xx"] == [("failure_permanent", 404)] * 2
        assert outcomes["5xx"] == [("failure_retryable", 503)] * 2
        assert outcomes["timeout"] == [("timeout", None)] * 2
        assert outcomes["refused"] == [("failure_retryable", None)] * 2
        listed = await h.acli_json("deliveries", "list", "--event-type", "probe.refused")
        refused = listed["data"][0]
        assert "connection" in refused["last_attempt"]["error"].lower()
    finally:
        for r in receivers.values():
            await r.stop()


async def test_held_deliveries_flow_after_activation(
    herald_factory: HeraldFactory, receiver: Receiver
) -> None:
    h = herald_factory({"delivery": {"backoff_base_seconds": 0.2, "max_retries": 10}})
    verifying = {"ok": False}

    def behaviour(item: Received) -> web.StreamResponse:
        if item.type == "destination.verification" and not verifying["ok"]:
            return web.Response(status=500)
        return web.Response(status=204)

    receiver.behaviour = behaviour
    dest = await h.acreate_webhook(receiver.url, secret=SECRET)
    h.insert_events(rows(5, prefix="evt_held"))
    await wait_deliveries(h, "kind = 'event' AND held = 1", 5)
    await asyncio.sleep(0.5)
    assert receiver.events("task_run.completed") == []
    held = h.query("SELECT attempt_count, status FROM herald_deliveries WHERE kind = 'event'")
    assert held == [(0, "pending")] * 5  # no attempt and no retry used up while held

    verifying["ok"] = True  # the next verification retry succeeds
    await wait_active(h, dest["id"], timeout=20)
    await receiver.wait_for(lambda: len(receiver.counts("task_run.completed")) == 5, what="held")

    # Inactive holds too, and activation releases.
    await h.acli("destinations", "update", dest["id"], "--data", '{"status": "inactive"}')
    h.insert_events(rows(3, prefix="evt_paused"))
    await wait_deliveries(h, "kind = 'event' AND held = 1", 3)
    await asyncio.sleep(0.5)
    assert not [r for r in receiver.received if r.event_id.startswith("evt_paused")]
    await h.acli("destinations", "update", dest["id"], "--data", '{"status": "active"}')
    await receiver.wait_for(
        lambda: len([r for r in receiver.received if r.event_id.startswith("evt_paused")]) == 3,
        what="released after re-activation",
    )
    assert all(r.verified for r in receiver.received), receiver.errors


async def test_thousand_events_to_three_destinations_exactly_once(
    herald_factory: HeraldFactory,
) -> None:
    h = herald_factory()
    receivers = [await Receiver(secrets=[SECRET]).start() for _ in range(3)]
    try:
        for i, r in enumerate(receivers):
            dest = await h.acreate_webhook(r.url, secret=SECRET, name=f"r{i}")
            await wait_active(h, dest["id"])
        n = 1000
        batch = rows(n, prefix="evt_load")
        for start in range(0, n, 250):
            h.insert_events(batch[start : start + 250])
        for r in receivers:
            await r.wait_for(
                all_arrived(r, n),
                timeout=60,
                what="1000 deliveries",
            )
        await wait_deliveries(h, "status = 'success' AND kind = 'event'", 3 * n)
        await asyncio.sleep(0.5)
        for r in receivers:
            counts = r.counts("task_run.completed")
            assert len(counts) == n
            assert max(counts.values()) == 1, "a delivery arrived twice without a crash"
            assert all(x.verified for x in r.received), r.errors[:3]
        assert h.proc is not None
        assert h.proc.poll() is None
        assert await h.astop() == 0
    finally:
        for r in receivers:
            await r.stop()


async def test_kill_9_mid_flight_loses_nothing(herald_factory: HeraldFactory) -> None:
    h = herald_factory()

    async def sluggish(_: Received) -> web.StreamResponse:
        await asyncio.sleep(0.02)
        return web.Response(status=204)

    receivers = [
        await Receiver(secrets=[SECRET], behaviour=verification_ok_then(sluggish)).start()
        for _ in range(2)
    ]
    try:
        for i, r in enumerate(receivers):
            dest = await h.acreate_webhook(r.url, secret=SECRET, name=f"r{i}")
            await wait_active(h, dest["id"])
        n = 600
        h.insert_events(rows(n, prefix="evt_crash"))
        await receivers[0].wait_for(
            lambda: len(receivers[0].counts("task_run.completed")) > 100,
            what="some deliveries before the crash",
        )
        h.kill()
        before = [len(r.counts("task_run.completed")) for r in receivers]
        assert min(before) < n, "the crash came too late to prove anything"
        await h.astart()
        for r in receivers:
            await r.wait_for(
                all_arrived(r, n),
                timeout=60,
                what="every event after restart",
            )
        await wait_deliveries(h, "status = 'success' AND kind = 'event'", 2 * n)
        pending = h.query("SELECT COUNT(*) FROM herald_deliveries WHERE status != 'success'")
        assert pending == [(0,)]
        assert await h.astop() == 0
    finally:
        for r in receivers:
            await r.stop()


async def test_poison_rows_are_rejected_and_good_rows_behind_them_delivered(
    herald_factory: HeraldFactory, receiver: Receiver
) -> None:
    h = herald_factory()
    dest = await h.acreate_webhook(receiver.url, secret=SECRET)
    await wait_active(h, dest["id"])
    insert = "INSERT INTO herald_outbox (id, type, data) VALUES (?, ?, ?)"
    poison: dict[str, tuple[str, str | bytes, str]] = {
        "evt_array": ("a.b", "[1]", "invalid_data"),
        "noprefix": ("a.b", "{}", "invalid_id"),
        "evt_notype": ("", "{}", "invalid_type"),
        "evt_badtype": ("Not A Type", "{}", "invalid_type"),
    }
    if h.backend == "sqlite":
        # PostgreSQL's jsonb and timestamptz refuse these at the producer's insert already.
        poison["evt_badjson"] = ("a.b", "{nope", "invalid_json")
        poison["evt_blob"] = ("a.b", b"\xff\xfe\x00{", "invalid_json")
    conn = h.connect()
    try:
        conn.execute("BEGIN")
        conn.execute(insert, ("evt_good1", "a.b", "{}"))
        for event_id, (type_, data, _) in poison.items():
            conn.execute(insert, (event_id, type_, data))
        if h.backend == "sqlite":
            conn.execute(
                "INSERT INTO herald_outbox (id, type, data, created_at)"
                " VALUES ('evt_when', 'a.b', '{}', 'last tuesday')"
            )
        conn.execute(insert, ("evt_good2", "a.b", '{"x": 1}'))
        conn.execute("COMMIT")
    finally:
        conn.close()
    if h.backend == "sqlite":
        poison["evt_when"] = ("a.b", "{}", "invalid_created_at")
    await receiver.wait_for(
        lambda: {"evt_good1", "evt_good2"} <= set(receiver.counts("a.b")), what="good rows"
    )
    rejected = dict(h.query("SELECT id, reason FROM herald_outbox_rejected"))
    assert set(rejected) == set(poison)
    for event_id, (_, _, code) in poison.items():
        assert rejected[event_id].startswith(f"{code}: "), rejected[event_id]
    assert h.query("SELECT COUNT(*) FROM herald_outbox") == [(0,)]
    listed = (await h.acli_json("outbox", "rejected"))["data"]
    assert {r["id"] for r in listed} == set(rejected)
    assert set(receiver.counts("a.b")) == {"evt_good1", "evt_good2"}


@pytest.mark.sqlite_only
async def test_second_instance_on_the_same_sqlite_file_refuses(
    herald_factory: HeraldFactory,
) -> None:
    h = herald_factory()
    second = Herald(h.workdir)
    second.config_path = h.config_path
    proc = await second.acli("run", check=False)
    assert proc.returncode == 2
    assert "already using" in proc.stderr


async def test_sigterm_drains_in_flight_and_leaves_the_rest_due(
    herald_factory: HeraldFactory,
) -> None:
    h = herald_factory({"delivery": {"max_per_destination": 4, "max_concurrency": 4}})

    async def slow(_: Received) -> web.StreamResponse:
        await asyncio.sleep(0.5)
        return web.Response(status=204)

    r = await Receiver(secrets=[SECRET], behaviour=verification_ok_then(slow)).start()
    try:
        dest = await h.acreate_webhook(r.url, secret=SECRET)
        await wait_active(h, dest["id"])
        h.insert_events(rows(40, prefix="evt_drain"))
        await r.wait_for(lambda: len(r.events("task_run.completed")) >= 4, what="in flight")
        assert await h.astop() == 0
        arrived = set(r.counts("task_run.completed"))
        done = {
            row[0]
            for row in h.query(
                "SELECT event_id FROM herald_deliveries WHERE status = 'success' AND kind = 'event'"
            )
        }
        # Every attempt that reached the receiver before SIGTERM was allowed to finish and
        # was recorded; nothing is left leased.
        assert arrived == done
        leased = h.query("SELECT COUNT(*) FROM herald_deliveries WHERE lease_owner IS NOT NULL")
        assert leased == [(0,)]
        due = h.query(
            "SELECT COUNT(*) FROM herald_deliveries WHERE status = 'pending'"
            " AND next_attempt_at <= ?",
            (time.time(),),
        )[0][0]
        assert due == 40 - len(done)
        await h.astart()
        await r.wait_for(
            lambda: len(r.counts("task_run.completed")) == 40, timeout=30, what="rest after restart"
        )
        assert max(r.counts("task_run.completed").values()) == 1  # graceful: no duplicates
    finally:
        await r.stop()


def test_free_port_helper_gives_a_bindable_port() -> None:
    assert 1024 < free_port() < 65536
