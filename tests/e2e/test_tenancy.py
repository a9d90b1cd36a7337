"""Tenant isolation over real HTTP: a key sees and changes only its own tenant's objects,
and an event reaches only destinations of the tenant that published it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from standardwebhooks.webhooks import Webhook

from tests.e2e.conftest import SECRET, HeraldFactory
from tests.support.api import (
    Api,
    base_url,
    create_key,
    error_of,
    eventually,
    fresh_rate_window,
    wait_status,
)
from tests.support.daemon import Herald
from tests.support.receiver import Receiver

pytestmark = [pytest.mark.e2e, pytest.mark.backend_neutral]

DESTS = "/v2/event-destinations"
TENANT_A, TENANT_B = "tenant-a", "tenant-b"


def hook(url: str, *, name: str = "hook", events: list[str] | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "type": "webhook",
        "webhook": {"url": url, "secret": SECRET},
        "events": events or ["*"],
    }


async def clients(h: Herald) -> tuple[Api, Api]:
    key_a, key_b = await asyncio.gather(create_key(h, TENANT_A), create_key(h, TENANT_B))
    return Api(base_url(h), key_a), Api(base_url(h), key_b)


@pytest.fixture
async def tenants(herald: Herald) -> AsyncIterator[tuple[Api, Api]]:
    a, b = await clients(herald)
    async with a, b:
        yield a, b


@pytest.fixture
async def receiver_b() -> AsyncIterator[Receiver]:
    r = await Receiver(secrets=[SECRET]).start()
    yield r
    await r.stop()


async def create(api: Api, body: Any, **kwargs: Any) -> dict[str, Any]:
    status, _, created = await api.post(DESTS, json=body, **kwargs)
    assert status == 201, created
    assert isinstance(created, dict)
    return created


async def test_a_key_cannot_read_change_test_or_replay_another_tenants_objects(
    tenants: tuple[Api, Api], receiver: Receiver
) -> None:
    a, b = tenants
    dest = await create(a, hook(receiver.url, events=["task_run.*"]))
    dest_id = dest["id"]
    await wait_status(a, dest_id, "active")
    status, _, event = await a.post("/v2/events", json={"type": "task_run.completed", "data": {}})
    assert status == 202
    await receiver.wait_for(lambda: len(receiver.events("task_run.completed")) == 1, what="event")
    deliveries = f"{DESTS}/{dest_id}/event-deliveries"

    async def recorded() -> bool:
        _, _, page = await a.get(deliveries, params={"event_type": "task_run.completed"})
        return bool(page["data"]) and page["data"][0]["status"] == "success"

    await eventually(recorded, what="A's delivery recorded")
    delivery_id = (await a.get(deliveries, params={"event_type": "task_run.completed"}))[2]["data"][
        0
    ]["id"]
    before = (await a.get(f"{DESTS}/{dest_id}"))[2]
    received_before = len(receiver.received)

    path = f"{DESTS}/{dest_id}"
    attempts: list[tuple[str, str, dict[str, Any]]] = [
        ("GET", path, {}),
        ("PATCH", path, {"json": {"name": "stolen", "webhook": {"url": "http://127.0.0.1:9/x"}}}),
        ("PATCH", path, {"json": {"status": "inactive"}}),
        ("POST", f"{path}/test", {}),
        ("POST", f"{path}/verify", {}),
        ("POST", f"{path}/rotate-secret", {}),
        ("POST", f"{path}/rotate-secret", {"json": {"secret": SECRET}}),
        ("POST", f"{path}/replay", {}),
        ("POST", f"{path}/replay", {"json": {"dry_run": True}}),
        ("GET", deliveries, {}),
        ("GET", f"/v2/event-deliveries/{delivery_id}", {}),
        ("POST", f"/v2/event-deliveries/{delivery_id}/retry", {}),
        ("GET", f"/v2/events/{event['id']}", {}),
        ("DELETE", path, {}),
    ]
    problems = []
    for method, p, kwargs in attempts:
        status, _, body = await b.request(method, p, **kwargs)
        # Exactly what a nonexistent id answers: no hint that the object exists.
        absent = p.replace(dest_id, "evtd_01jz0000000000000000000000")
        absent = absent.replace(delivery_id, "dlv_01jz0000000000000000000000")
        absent = absent.replace(event["id"], "evt_01jz0000000000000000000000")
        want_status, _, want = await b.request(method, absent, **kwargs)
        if status != 404 or want_status != 404:
            problems.append(f"{method} {p}: {status} {body}")
            continue
        if error_of(body)["code"] != error_of(want)["code"]:
            problems.append(f"{method} {p}: {body} differs from an absent id's {want}")
        if dest_id in json.dumps(body["errors"]) and dest_id not in p:
            problems.append(f"{method} {p}: leaks the id")
    assert not problems, "\n".join(problems)

    # B's lists are empty, with or without filters.
    for params in ({}, {"status": "active"}, {"type": "webhook"}, {"limit": 100}):
        status, _, page = await b.get(DESTS, params=params)
        assert (status, page["data"], page["has_more"]) == (200, [], False), params

    # Nothing changed for A: same object, no extra request at A's receiver, nothing re-queued.
    await asyncio.sleep(0.5)
    assert (await a.get(path))[2] == before
    assert len(receiver.received) == received_before
    _, _, delivery = await a.get(f"/v2/event-deliveries/{delivery_id}")
    assert (delivery["status"], delivery["attempt_count"]) == ("success", 1)
    # The secret was not rotated: A's deliveries carry one signature, by the original secret.
    status, _, tested = await a.post(f"{path}/test")
    assert (status, tested["status"]) == (200, "success")
    ping = receiver.events("test.ping")[-1]
    assert len(ping.headers["webhook-signature"].split()) == 1
    Webhook(SECRET).verify(ping.body, ping.headers)

    # B cannot take over A's event id either: A's event stays A's.
    status, _, body = await b.post(
        "/v2/events", json={"id": event["id"], "type": "task_run.completed", "data": {"b": 1}}
    )
    assert status in (202, 409), body
    _, _, still = await a.get(f"/v2/events/{event['id']}")
    assert still == event
    await asyncio.sleep(0.3)
    assert all(r.envelope["data"] != {"b": 1} for r in receiver.received)


async def test_events_reach_only_destinations_of_their_own_tenant(
    herald: Herald, tenants: tuple[Api, Api], receiver: Receiver, receiver_b: Receiver
) -> None:
    a, b = tenants
    dest_a = await create(a, hook(receiver.url, name="a"))
    dest_b = await create(b, hook(receiver_b.url, name="b"))
    await wait_status(a, dest_a["id"], "active")
    await wait_status(b, dest_b["id"], "active")

    published: dict[str, set[str]] = {TENANT_A: set(), TENANT_B: set()}
    for i in range(5):
        for tenant, api in ((TENANT_A, a), (TENANT_B, b)):
            status, _, event = await api.post(
                "/v2/events", json={"type": "task_run.completed", "data": {"i": i, "t": tenant}}
            )
            assert status == 202, event
            published[tenant].add(event["id"])
    # Producers writing the outbox directly name the tenant too; the default tenant has no
    # destinations here, so its event goes nowhere.
    herald.insert_events(
        [
            ("evt_sql_b", TENANT_B, "task_run.failed", '{"t": "tenant-b"}'),
            ("evt_sql_a", TENANT_A, "task_run.failed", '{"t": "tenant-a"}'),
            ("evt_sql_default", "default", "task_run.failed", '{"t": "default"}'),
        ]
    )
    published[TENANT_A].add("evt_sql_a")
    published[TENANT_B].add("evt_sql_b")

    def ids(r: Receiver) -> set[str]:
        return {x.event_id for x in r.received if x.type.startswith("task_run.")}

    await receiver.wait_for(lambda: ids(receiver) >= published[TENANT_A], what="A's events")
    await receiver_b.wait_for(lambda: ids(receiver_b) >= published[TENANT_B], what="B's events")
    await asyncio.sleep(0.5)
    assert ids(receiver) == published[TENANT_A]
    assert ids(receiver_b) == published[TENANT_B]
    for r, tenant in ((receiver, TENANT_A), (receiver_b, TENANT_B)):
        assert {x.envelope["data"]["t"] for x in r.received if x.type.startswith("task_run.")} == {
            tenant
        }
        assert all(x.verified for x in r.received), r.errors
    # Each tenant's delivery list holds only its own events; B cannot read A's events.
    for api, dest, tenant, other in (
        (a, dest_a, TENANT_A, TENANT_B),
        (b, dest_b, TENANT_B, TENANT_A),
    ):
        listed = await api.pages(f"{DESTS}/{dest['id']}/event-deliveries", {"limit": 100})
        assert {d["event_id"] for d in listed if d["event_type"] != "destination.verification"} == (
            published[tenant]
        )
        for event_id in published[other]:
            status, _, body = await api.get(f"/v2/events/{event_id}")
            assert status == 404, body
            assert error_of(body)["code"] == "event_not_found"


async def test_two_tenants_publish_the_same_event_id_and_each_gets_its_own(
    herald: Herald, tenants: tuple[Api, Api], receiver: Receiver, receiver_b: Receiver
) -> None:
    """Event ids are unique per tenant: another tenant's id is neither refused (409) nor
    revealed, through POST /v2/events or the outbox; each event reaches its own tenant's
    destinations. The same tenant reusing its id is a 409."""
    a, b = tenants
    dest_a = await create(a, hook(receiver.url, name="a"))
    dest_b = await create(b, hook(receiver_b.url, name="b"))
    await wait_status(a, dest_a["id"], "active")
    await wait_status(b, dest_b["id"], "active")

    for api, tenant in ((a, TENANT_A), (b, TENANT_B)):
        status, _, event = await api.post(
            "/v2/events",
            json={"id": "evt_api", "type": "task_run.completed", "data": {"t": tenant}},
        )
        assert (status, event["id"]) == (202, "evt_api"), event
    herald.insert_events(
        [
            ("evt_sql", TENANT_A, "task_run.failed", json.dumps({"t": TENANT_A})),
            ("evt_sql", TENANT_B, "task_run.failed", json.dumps({"t": TENANT_B})),
        ]
    )

    def got(r: Receiver) -> dict[str, Any]:
        return {x.event_id: x.envelope["data"] for x in r.received if x.type.startswith("task_")}

    for r, tenant in ((receiver, TENANT_A), (receiver_b, TENANT_B)):

        def both_came(r: Receiver = r) -> bool:
            return len(got(r)) == 2

        await r.wait_for(both_came, what=f"{tenant}'s two events")
        assert got(r) == {"evt_api": {"t": tenant}, "evt_sql": {"t": tenant}}
        assert all(x.verified for x in r.received), r.errors
    for api, tenant in ((a, TENANT_A), (b, TENANT_B)):
        for event_id in ("evt_api", "evt_sql"):
            status, _, body = await api.get(f"/v2/events/{event_id}")
            assert (status, body["data"]) == (200, {"t": tenant}), body
        # The same tenant's id is taken, relayed or not.
        status, _, body = await api.post(
            "/v2/events", json={"id": "evt_sql", "type": "task_run.completed", "data": {}}
        )
        assert status == 409, body
        assert error_of(body)["code"] == "event_exists"
    assert herald.query("SELECT COUNT(*) FROM herald_outbox_rejected") == [(0,)]


async def test_idempotency_keys_and_rate_limits_are_per_tenant(
    herald_factory: HeraldFactory,
) -> None:
    # A long window, so a slow machine cannot roll it over mid-test.
    h = herald_factory(
        {"api": {"rate_limit_requests": 6, "rate_limit_window_seconds": 120}}, start=False
    )
    await h.astart()
    a, b = await clients(h)
    async with a, b:
        await fresh_rate_window(120, need=30)
        key = {"Idempotency-Key": "shared-key"}
        mine = await create(a, hook("http://127.0.0.1:9/a", name="a"), headers=key)
        status, headers, theirs = await b.post(
            DESTS, json=hook("http://127.0.0.1:9/b", name="b"), headers=key
        )
        assert status == 201, theirs
        assert "Idempotent-Replayed" not in headers
        assert theirs["id"] != mine["id"]
        assert theirs["name"] == "b"
        # Same key and same body as A's request: still B's own new object, not A's response.
        status, headers, copy = await b.post(
            DESTS, json=hook("http://127.0.0.1:9/a", name="a"), headers={"Idempotency-Key": "k2"}
        )
        assert status == 201
        status, headers, replay = await a.post(
            DESTS, json=hook("http://127.0.0.1:9/a", name="a"), headers=key
        )
        assert (status, headers["Idempotent-Replayed"], replay) == (201, "true", mine)
        # A has used 2 of 6 requests; use the rest and then some.
        for _ in range(4):
            assert (await a.get(DESTS))[0] == 200
        status, headers, body = await a.get(DESTS)
        assert status == 429
        assert error_of(body)["code"] == "rate_limit_exceeded"
        assert "Retry-After" in headers
        # B has its own budget (2 used).
        status, headers, page = await b.get(DESTS)
        assert status == 200
        assert headers["RateLimit"].split(";")[1] == "r=3"
        assert {d["id"] for d in page["data"]} == {theirs["id"], copy["id"]}


async def test_another_tenants_cursor_is_refused(tenants: tuple[Api, Api]) -> None:
    a, b = tenants
    for i in range(3):
        await create(a, hook(f"http://127.0.0.1:9/{i}", name=f"a{i}"))
        await create(b, hook(f"http://127.0.0.1:9/{i}", name=f"b{i}"))
    _, _, page = await a.get(DESTS, params={"limit": 1})
    assert page["next_cursor"]
    status, _, body = await b.get(DESTS, params={"limit": 1, "cursor": page["next_cursor"]})
    assert status == 400, body
    assert error_of(body)["code"] == "cursor_invalid"
