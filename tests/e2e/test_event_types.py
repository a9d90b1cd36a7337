"""The event-type catalog end to end: a tenant registers a type with a JSON Schema,
a bad payload is refused at the door with the path of what is wrong (the API) or
moved to the rejected rows (the outbox) without blocking the rows behind it, and
tenants' catalogs are their own."""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from typing import Any

import pytest

from tests.e2e.conftest import SECRET, HeraldFactory
from tests.support.api import Api, create_key, error_of, eventually, open_api, wait_status
from tests.support.api import base_url as api_url
from tests.support.daemon import Herald
from tests.support.receiver import Receiver

pytestmark = [pytest.mark.e2e, pytest.mark.backend_neutral]

TYPES = "/v2/event-types"
TASK_RUN = {
    "type": "object",
    "required": ["task_run_id", "status"],
    "properties": {
        "task_run_id": {"type": "string"},
        "status": {"enum": ["queued", "running", "done"]},
    },
}


async def subscribe(api: Api, receiver: Receiver) -> str:
    status, _, dest = await api.post(
        "/v2/event-destinations",
        json={
            "name": "runs",
            "type": "webhook",
            "webhook": {"url": receiver.url, "secret": SECRET},
            "events": ["task_run.*"],
        },
    )
    assert status == 201, dest
    await wait_status(api, dest["id"], "active")
    return str(dest["id"])


async def test_a_schema_is_enforced_at_the_api_and_in_the_outbox(
    herald: Herald, receiver: Receiver
) -> None:
    async with open_api(herald, "tenant-a") as a, open_api(herald, "tenant-b") as b:
        status, _, put = await a.put(
            f"{TYPES}/task_run.completed",
            json={"description": "A task run ended.", "schema": TASK_RUN},
        )
        assert status == 200, put
        assert put["schema"] == TASK_RUN
        assert put["builtin"] is False
        status, _, got = await a.get(f"{TYPES}/task_run.completed")
        assert (status, got["description"]) == (200, "A task run ended.")
        await subscribe(a, receiver)

        good = {"task_run_id": "tr_1", "status": "done"}
        status, _, event = await a.post(
            "/v2/events", json={"type": "task_run.completed", "data": good}
        )
        assert status == 202, event
        status, _, body = await a.post(
            "/v2/events", json={"type": "task_run.completed", "data": {"status": "lost"}}
        )
        assert status == 422, body
        assert {e["code"] for e in body["errors"]} == {"schema_mismatch"}
        assert [e["field"] for e in body["errors"]] == ["data.task_run_id", "data.status"]

        # The outbox: the bad row is rejected with its reason, the rows behind it delivered.
        herald.insert_events(
            [
                ("evt_bad", "tenant-a", "task_run.completed", json.dumps({"task_run_id": 7})),
                ("evt_after", "tenant-a", "task_run.completed", json.dumps(good)),
                ("evt_other", "tenant-a", "task_run.started", json.dumps({"any": 1})),
            ]
        )
        await receiver.wait_for(
            lambda: (
                {"evt_after", "evt_other", event["id"]} <= {e.event_id for e in receiver.events()}
            ),
            what="the matching events",
        )
        assert "evt_bad" not in {e.event_id for e in receiver.events()}
        [(reason,)] = herald.query(
            "SELECT reason FROM herald_outbox_rejected WHERE id = ?", ("evt_bad",)
        )
        assert reason.startswith("schema_mismatch: data.status ") or reason.startswith(
            "schema_mismatch: data.task_run_id "
        ), reason

        # Another tenant's catalog is its own: no schema there.
        status, _, other = await b.post(
            "/v2/events", json={"type": "task_run.completed", "data": {"status": "lost"}}
        )
        assert status == 202, other
        status, _, body = await b.get(f"{TYPES}/task_run.completed")
        assert status == 404, body

        # Deleted: any payload again.
        status, _, gone = await a.delete(f"{TYPES}/task_run.completed")
        assert status == 200, gone
        status, _, event = await a.post(
            "/v2/events", json={"type": "task_run.completed", "data": {"status": "lost"}}
        )
        assert status == 202, event


async def test_the_catalog_lists_pages_and_refuses_bad_entries(api: Api) -> None:
    for name in ("a.one", "b.two", "c.three"):
        status, _, body = await api.put(f"{TYPES}/{name}", json={"description": name})
        assert status == 200, body
    seen: list[str] = []
    params: dict[str, str | int] = {"limit": 2}
    while True:
        status, _, page = await api.get(TYPES, params=params)
        assert status == 200, page
        assert len(page["data"]) <= 2
        seen += [e["type"] for e in page["data"]]
        if not page["has_more"]:
            break
        params = {"limit": 2, "cursor": page["next_cursor"]}
    assert seen == sorted(seen)
    assert {"a.one", "b.two", "c.three", "herald.delivery.exhausted"} <= set(seen)

    status, _, builtin = await api.get(f"{TYPES}/herald.destination.failing")
    assert status == 200, builtin
    assert builtin["builtin"] is True
    assert "consecutive_failures" in builtin["schema"]["properties"]
    for method in (api.put, api.delete):
        kwargs: dict[str, Any] = {"json": {"description": "x"}} if method == api.put else {}
        status, _, body = await method(f"{TYPES}/herald.destination.failing", **kwargs)
        assert status == 422, body
        assert error_of(body)["code"] == "event_type_reserved"

    status, _, body = await api.put(f"{TYPES}/a.one", json={"schema": {"type": "strin"}})
    assert status == 422, body
    assert error_of(body)["field"] == "schema.type"
    status, _, body = await api.put(f"{TYPES}/a.one", json={"schema": [1]})
    assert status in (400, 422), body
    assert error_of(body)["field"] == "schema"
    status, _, body = await api.put(f"{TYPES}/Not A Type", json={})
    assert status == 422, body
    assert error_of(body)["field"] == "type"


async def test_require_known_types_refuses_the_rest(
    herald_factory: HeraldFactory, receiver: Receiver
) -> None:
    h = herald_factory({"catalog": {"require_known_types": True}})
    key = await create_key(h, "default")
    async with Api(api_url(h), key) as api:
        status, _, body = await api.post("/v2/events", json={"type": "x.unknown", "data": {}})
        assert status == 422, body
        assert (error_of(body)["code"], error_of(body)["field"]) == ("event_type_unknown", "type")
        status, _, body = await api.put(f"{TYPES}/x.known", json={"description": "known"})
        assert status == 200, body
        status, _, body = await api.post("/v2/events", json={"type": "x.known", "data": {}})
        assert status == 202, body
        h.insert_events([("evt_unknown", "default", "x.unknown", "{}")])

        async def rejected() -> bool:
            rows = await asyncio.to_thread(
                h.query, "SELECT reason FROM herald_outbox_rejected WHERE id = 'evt_unknown'"
            )
            return bool(rows) and str(rows[0][0]).startswith("unknown_type: ")

        await eventually(rejected, what="the unknown type's row to be rejected")


async def test_the_cli_manages_the_catalog(herald: Herald) -> None:
    body = json.dumps({"description": "An order was paid.", "schema": TASK_RUN})
    put = await herald.acli_json("event-types", "put", "order.paid", "--data", body)
    assert put["schema"] == TASK_RUN
    listed = await herald.acli_json("event-types", "list", "--json")
    assert "order.paid" in [e["type"] for e in listed["data"]]
    shown = await herald.acli_json("event-types", "show", "order.paid")
    assert shown["description"] == "An order was paid."
    refused = await herald.acli("emit", "order.paid", "--data", '{"status": "x"}', check=False)
    assert refused.returncode == 2
    assert "data.task_run_id" in refused.stderr
    bad = await herald.acli(
        "event-types", "put", "order.paid", "--data", '{"schema": {"type": 1}}', check=False
    )
    assert (bad.returncode, "schema.type" in bad.stderr) == (2, True)
    await herald.acli("event-types", "delete", "order.paid")
    gone = await herald.acli("event-types", "show", "order.paid", check=False)
    assert gone.returncode == 1


async def test_the_portal_and_the_console_list_the_catalog(herald: Herald) -> None:
    from tests.e2e.test_console_http import Client

    schema = {**TASK_RUN, "examples": [{"task_run_id": "tr_42", "status": "done"}]}
    async with open_api(herald, "acme") as acme:
        status, _, body = await acme.put(
            f"{TYPES}/task_run.completed",
            json={"description": "A <b>run</b> ended.", "schema": schema},
        )
        assert status == 200, body

    def pages() -> tuple[str, str, str]:
        portal = Client(herald)
        token = herald.portal_token("acme")
        opened, _ = portal.request(f"/portal/?token={token}")
        assert opened in (302, 303), opened
        code, own = portal.request("/portal/event-types?tenant=default")  # its own, whatever asked
        assert code == 200, own
        console = Client(herald)
        assert console.sign_in(herald.cli("keys", "create", "--operator").stdout.strip()) == 303
        code, acme_page = console.request("/console/event-types?tenant=acme")
        assert code == 200, acme_page
        code, default_page = console.request("/console/event-types")
        assert code == 200, default_page
        return own, acme_page, default_page

    own, acme_page, default_page = await asyncio.to_thread(pages)
    for page in (own, acme_page):
        assert "task_run.completed" in page
        assert "A &lt;b&gt;run&lt;/b&gt; ended." in page  # text, never markup
        assert "tr_42" in page  # the schema's example
        assert "herald.destination.failing" in page
    assert "task_run.completed" not in default_page
    assert "herald.destination.failing" in default_page


async def test_the_portal_tries_a_destinations_filter(herald: Herald, receiver: Receiver) -> None:
    from tests.e2e.test_console_http import Client

    async with open_api(herald, "acme") as acme:
        dest_id = await subscribe(acme, receiver)
        status, _, body = await acme.patch(
            f"/v2/event-destinations/{dest_id}", json={"filter": {"data": {"n": {"$gte": 2}}}}
        )
        assert status == 200, body
        for n in (1, 2, 3):
            status, _, body = await acme.post(
                "/v2/events", json={"type": "task_run.completed", "data": {"n": n}}
            )
            assert status == 202, body
        await receiver.wait_for(lambda: len(receiver.events("task_run.completed")) == 2, what="2")

    def pages() -> tuple[str, str, tuple[int, str]]:
        portal = Client(herald)
        portal.request(f"/portal/?token={herald.portal_token('acme')}")
        code, page = portal.request(f"/portal/destinations/{dest_id}")
        assert code == 200, page
        code, own = portal.request(f"/portal/destinations/{dest_id}/filter")
        assert code == 200, own
        other = urllib.parse.quote('{"data": {"n": {"$lt": 2}}}')
        code, tried = portal.request(f"/portal/destinations/{dest_id}/filter?filter={other}")
        assert code == 200, tried
        bad = urllib.parse.quote('{"data": {"n": {"$lt": null}}}')
        return (
            page,
            own + tried,
            portal.request(f"/portal/destinations/{dest_id}/filter?filter={bad}"),
        )

    page, tried, (bad_status, bad_page) = await asyncio.to_thread(pages)
    assert "Test filter" in page
    assert "2 of 3 would pass." in tried
    assert "1 of 3 would pass." in tried
    assert bad_status == 422
    assert "filter.data.n.$lt" in bad_page
