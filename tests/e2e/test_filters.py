"""Payload filters end to end: only the events that pass get a delivery, the rest no
delivery row and a count; an invalid filter is a 422 naming its path; a filter can
be tried on the tenant's newest events before it is saved."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from tests.e2e.conftest import SECRET, HeraldFactory
from tests.support.api import Api, base_url, error_of, eventually, open_api, wait_status
from tests.support.receiver import Receiver

pytestmark = [pytest.mark.e2e, pytest.mark.backend_neutral]

DESTS = "/v2/event-destinations"
OVER_100 = {"data": {"amount": {"$gte": 100}}, "created_at": {"$gte": "2020-01-01T00:00:00Z"}}


def hook(url: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": "orders",
        "type": "webhook",
        "webhook": {"url": url, "secret": SECRET},
        "events": ["order.*"],
        **extra,
    }


async def publish(api: Api, amount: Any, type_: str = "order.created") -> str:
    status, _, body = await api.post("/v2/events", json={"type": type_, "data": {"amount": amount}})
    assert status == 202, body
    return str(body["id"])


async def deliveries_of(api: Api, dest_id: str) -> list[dict[str, Any]]:
    status, _, body = await api.get(f"{DESTS}/{dest_id}/event-deliveries", params={"limit": 100})
    assert status == 200, body
    return [d for d in body["data"] if d["event_type"].startswith("order.")]


async def filtered_total(h: Any) -> float:
    async with (
        aiohttp.ClientSession() as s,
        s.get(f"{base_url(h)}/metrics") as r,
    ):
        text = await r.text()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("herald_events_filtered_total")
    )


async def test_only_matching_events_are_delivered(
    herald_factory: HeraldFactory, receiver: Receiver
) -> None:
    h = herald_factory({"metrics": {"per_destination": True}})
    async with open_api(h) as api:
        status, _, dest = await api.post(DESTS, json=hook(receiver.url, filter=OVER_100))
        assert status == 201, dest
        assert dest["filter"] == OVER_100
        await wait_status(api, dest["id"], "active")

        small = await publish(api, 50)
        wanted = [await publish(api, 150), await publish(api, 100.0)]
        await publish(api, "lots")  # a string is not a number: filtered out
        last = await publish(api, 999)  # the relay takes rows in order: the rest are done
        await receiver.wait_for(
            lambda: last in {e.event_id for e in receiver.events()}, what="the last event"
        )
        got = {e.event_id for e in receiver.events() if e.type.startswith("order.")}
        assert got == {*wanted, last}
        rows = await deliveries_of(api, dest["id"])
        assert {d["event_id"] for d in rows} == {*wanted, last}
        assert small not in {d["event_id"] for d in rows}
        assert await filtered_total(h) == 2

        # Tried before saving: the newest events of its types, and which would pass.
        status, _, tried = await api.post(
            f"{DESTS}/{dest['id']}/filter/test",
            json={"filter": {"data": {"amount": {"$lt": 100}}}},
        )
        assert status == 200, tried
        assert tried["tested"] == 5
        assert [e["id"] for e in tried["data"] if e["passes"]] == [small]
        status, _, own = await api.post(f"{DESTS}/{dest['id']}/filter/test")
        assert status == 200, own
        assert own["filter"] == OVER_100
        assert own["passed"] == 3

        by_cli = await h.acli_json("destinations", "test-filter", dest["id"])
        assert (by_cli["tested"], by_cli["passed"]) == (5, 3)

        # Cleared: every event of its types again.
        status, _, patched = await api.patch(f"{DESTS}/{dest['id']}", json={"filter": None})
        assert status == 200, patched
        assert patched["filter"] is None
        status, _, read = await api.get(f"{DESTS}/{dest['id']}")
        assert read["filter"] is None
        again = await publish(api, 1)

        async def arrived() -> bool:
            return again in {e.event_id for e in receiver.events()}

        await eventually(arrived, what="the event after the filter was cleared")


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"data": {"amount": {"$gte": "ten", "$near": 1}}}, "filter.data.amount.$near"),
        ({"data": {"amount": {"$gte": None}}}, "filter.data.amount.$gte"),
        (
            {"$or": [{"type": "a"}, {"data": {"x": {"$regex": "(a"}}}]},
            "filter.$or[1].data.x.$regex",
        ),
        ({"created_at": {"$gt": "last week"}}, "filter.created_at.$gt"),
    ],
)
async def test_invalid_filters_are_refused_with_their_path(
    api: Api, receiver: Receiver, spec: dict[str, Any], field: str
) -> None:
    status, _, body = await api.post(DESTS, json=hook(receiver.url, filter=spec))
    assert status == 422, body
    assert error_of(body)["field"] == field
    status, _, dest = await api.post(DESTS, json=hook(receiver.url))
    assert status == 201, dest
    status, _, body = await api.patch(f"{DESTS}/{dest['id']}", json={"filter": spec})
    assert status == 422, body
    assert error_of(body)["field"] == field
    status, _, body = await api.post(f"{DESTS}/{dest['id']}/filter/test", json={"filter": spec})
    assert status == 422, body
    assert error_of(body)["field"] == field
