"""The /v2 REST API over real HTTP against `herald run`: every endpoint, every error code,
cursor pagination across 250 records, idempotent replays, rate limits, write-only secrets.

Webhook receivers run in the test's event loop, so everything here talks to the daemon
with aiohttp (tests.support.api) or the async CLI helpers and never blocks the loop.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Awaitable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from standardwebhooks.webhooks import Webhook

from tests.e2e.conftest import SECRET, HeraldFactory
from tests.e2e.test_ops import database_outage
from tests.support.api import (
    Api,
    Headers,
    base_url,
    create_key,
    error_of,
    eventually,
    fresh_rate_window,
    open_api,
    wait_status,
)
from tests.support.daemon import Herald
from tests.support.receiver import Receiver

pytestmark = [pytest.mark.e2e, pytest.mark.backend_neutral]

DOCS_OPENAPI = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"
DESTS = "/v2/event-destinations"
MASK = "********"
Params = dict[str, str | int]
OTHER_SECRET = "whsec_" + base64.b64encode(b"another-secret-of-32-bytes-long!").decode()


def hook(url: str, *, events: list[str] | None = None, name: str = "hook", **webhook: str) -> Any:
    return {
        "name": name,
        "type": "webhook",
        "webhook": {"url": url, **webhook},
        "events": events or ["*"],
    }


def dead_url() -> str:
    """A loopback URL where nothing listens (the discard port): verification fails, so the
    destination stays pending."""
    return "http://127.0.0.1:9/hook"


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def ratelimit_fields(value: str) -> dict[str, str]:
    """``"default";r=3;t=9`` → {"r": "3", "t": "9"} (IETF structured-field parameters)."""
    name, *params = value.split(";")
    assert name == '"default"', value
    return dict(p.split("=", 1) for p in params)


async def create(api: Api, body: Any, **kwargs: Any) -> dict[str, Any]:
    status, _, created = await api.post(DESTS, json=body, **kwargs)
    assert status == 201, created
    assert isinstance(created, dict)
    return created


async def expect_error(
    reply: Awaitable[tuple[int, Headers, Any]],
    status: int,
    code: str,
    field: str | None = None,
) -> dict[str, Any]:
    got_status, headers, body = await reply
    assert got_status == status, body
    item = error_of(body)
    assert item["code"] == code, body
    if field is not None:
        assert item.get("field") == field, body
    assert headers["X-Request-Id"] == body["request_id"]
    return item


Case = tuple[str, str, dict[str, Any], str, str | None]
"""(method, path, request kwargs, expected code, expected field)."""


async def check_cases(api: Api, status: int, cases: list[Case]) -> None:
    """Run every case and report all mismatches at once."""
    problems = []
    for method, path, kwargs, code, field in cases:
        got, headers, body = await api.request(method, path, **kwargs)
        try:
            item = error_of(body)
            ok = (
                got == status
                and item["code"] == code
                and (field is None or item.get("field") == field)
                and headers.get("X-Request-Id") == body["request_id"]
            )
        except AssertionError:
            ok = False
        if not ok:
            problems.append(
                f"{method} {path} {kwargs}: want {status} {code} {field}, got {got} {body}"
            )
    assert not problems, "\n".join(problems)


# --- the OpenAPI document -----------------------------------------------------------------


async def test_openapi_is_served_without_auth_and_equals_the_committed_file(
    herald: Herald,
) -> None:
    async with Api(base_url(herald), None) as anonymous:
        status, headers, served = await anonymous.get("/v2/openapi.json")
    assert status == 200
    assert headers["Content-Type"].startswith("application/json")
    assert served["openapi"].startswith("3.1")
    committed = json.loads(DOCS_OPENAPI.read_text())
    assert served == committed, "docs/openapi.json is stale: run python -m herald.api.openapi"
    operations = {(method.upper(), path) for path, ops in served["paths"].items() for method in ops}
    assert operations >= {
        ("POST", "/v2/event-destinations"),
        ("GET", "/v2/event-destinations"),
        ("GET", "/v2/event-destinations/{id}"),
        ("PATCH", "/v2/event-destinations/{id}"),
        ("DELETE", "/v2/event-destinations/{id}"),
        ("POST", "/v2/event-destinations/{id}/test"),
        ("POST", "/v2/event-destinations/{id}/verify"),
        ("POST", "/v2/event-destinations/{id}/rotate-secret"),
        ("GET", "/v2/event-destinations/{id}/event-deliveries"),
        ("POST", "/v2/event-destinations/{id}/replay"),
        ("GET", "/v2/event-deliveries/{id}"),
        ("POST", "/v2/event-deliveries/{id}/retry"),
        ("POST", "/v2/events"),
        ("GET", "/v2/events/{id}"),
    }


async def test_openapi_declares_response_headers_and_request_media_types(
    api: Api, herald: Herald
) -> None:
    """Every response names the headers it carries, by reference to components.headers;
    every request body lists the JSON media types spec 000 accepts. The live answers
    carry what the document promises."""
    status, _, doc = await api.get("/v2/openapi.json")
    assert status == 200
    declared = doc["components"]["headers"]
    assert set(declared) >= {
        "X-Request-Id",
        "RateLimit",
        "RateLimit-Policy",
        "Retry-After",
        "Idempotent-Replayed",
    }
    assert declared["X-Request-Id"]["required"] is True
    assert declared["Retry-After"]["required"] is True

    def refs(response: dict[str, Any]) -> set[str]:
        names = set()
        for name, header in response.get("headers", {}).items():
            assert header == {"$ref": f"#/components/headers/{name}"}, (name, header)
            names.add(name)
        return names

    problems = []
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            where = f"{method.upper()} {path}"
            idempotent = any(p["name"] == "Idempotency-Key" for p in op["parameters"])
            for code, response in op["responses"].items():
                want = {"X-Request-Id"}
                if code != "401":  # refused before the rate limiter counts it
                    want |= {"RateLimit", "RateLimit-Policy"}
                if code == "429":
                    want.add("Retry-After")
                if idempotent and code.startswith("2"):
                    want.add("Idempotent-Replayed")
                if not want <= refs(response):
                    problems.append(f"{where} {code}: {sorted(refs(response))}")
            if "requestBody" in op:
                media = set(op["requestBody"]["content"])
                if media != {"application/json", "text/json", "application/*+json"}:
                    problems.append(f"{where} request body: {sorted(media)}")
    assert not problems, "\n".join(problems)

    # What the document says a response carries, it carries.
    def assert_carries(headers: Headers, names: set[str]) -> None:
        assert [n for n in names if n not in headers] == [], dict(headers)

    _, headers, _ = await api.get(DESTS)
    assert_carries(headers, {"X-Request-Id", "RateLimit", "RateLimit-Policy"})
    _, headers, _ = await api.get(f"{DESTS}/evtd_absent")
    assert_carries(headers, {"X-Request-Id", "RateLimit", "RateLimit-Policy"})
    key = {"Idempotency-Key": "documented-replay"}
    await api.post(DESTS, json=hook(dead_url()), headers=key)
    _, headers, _ = await api.post(DESTS, json=hook(dead_url()), headers=key)
    assert_carries(
        headers, {"X-Request-Id", "RateLimit", "RateLimit-Policy", "Idempotent-Replayed"}
    )


# --- endpoints ------------------------------------------------------------------------------


async def test_destination_lifecycle(api: Api, receiver: Receiver) -> None:
    status, headers, dest = await api.post(DESTS, json=hook(receiver.url, secret=SECRET))
    assert status == 201, dest
    assert headers["X-Request-Id"].startswith("req_")
    assert set(dest) == {
        "id",
        "object",
        "name",
        "type",
        "webhook",
        "events",
        "filter",
        "status",
        "verification",
        "rate_limit_per_second",
        "circuit_breaker",
        "circuit",
        "ordering",
        "created_at",
        "updated_at",
    }
    assert dest["verification"] == {
        "state": "pending",
        "failed_at": None,
        "last_error": None,
        "reverify": f"POST /v2/event-destinations/{dest['id']}/verify",
    }
    assert dest["id"].startswith("evtd_")
    assert dest["object"] == "event_destination"
    assert (dest["name"], dest["type"], dest["events"]) == ("hook", "webhook", ["*"])
    assert dest["status"] == "pending_verification"
    assert dest["webhook"]["url"] == receiver.url
    assert dest["webhook"].get("secret", MASK) == MASK
    dest_id = dest["id"]
    path = f"{DESTS}/{dest_id}"

    # The verification ping makes it active.
    await wait_status(api, dest_id, "active")
    verification = receiver.events("destination.verification")
    assert len(verification) == 1
    assert verification[0].verified, receiver.errors

    status, _, got = await api.get(path)
    assert status == 200
    verified = {"state": "verified", "failed_at": None, "last_error": None, "reverify": None}
    assert got == {
        **dest,
        "status": "active",
        "verification": verified,
        "updated_at": got["updated_at"],
        "health": got["health"],
    }
    # A read says how it has been answering: the verification ping succeeded.
    assert got["health"]["last_success_at"] is not None
    assert got["health"]["last_failure_at"] is None
    assert (got["health"]["attempts_24h"], got["health"]["failed_24h"]) == (1, 0)
    assert got["health"]["failure_rate"] == 0.0
    assert "health" not in dest  # a write answers without it
    status, _, listed = await api.get(DESTS)
    assert status == 200
    assert [d["id"] for d in listed["data"]] == [dest_id]
    assert listed["data"][0]["health"] == got["health"]

    status, _, patched = await api.patch(path, json={"name": "renamed", "events": ["task_run.*"]})
    assert status == 200, patched
    assert (patched["name"], patched["events"], patched["status"]) == (
        "renamed",
        ["task_run.*"],
        "active",
    )
    assert patched["updated_at"] > patched["created_at"]
    assert (await api.get(path))[2]["name"] == "renamed"

    # inactive → test refused with 409; active again → test delivered once.
    status, _, paused = await api.patch(path, json={"status": "inactive"})
    assert (status, paused["status"]) == (200, "inactive")
    await expect_error(api.post(f"{path}/test"), 409, "destination_not_active")
    status, _, resumed = await api.patch(path, json={"status": "active"})
    assert (status, resumed["status"]) == (200, "active")

    status, _, tested = await api.post(f"{path}/test")
    assert status == 200, tested
    assert tested["object"] == "event_delivery"
    assert tested["id"].startswith("dlv_")
    assert (tested["event_type"], tested["destination_id"]) == ("test.ping", dest_id)
    assert (tested["status"], tested["attempt_count"]) == ("success", 1)
    assert [(a["number"], a["outcome"], a["response_status"]) for a in tested["attempts"]] == [
        (1, "success", 204)
    ]
    pings = receiver.events("test.ping")
    assert len(pings) == 1
    assert pings[0].envelope["data"] == {"ok": True}
    assert pings[0].envelope["id"] == tested["event_id"]
    assert pings[0].verified, receiver.errors

    # verify sends a fresh verification ping.
    status, _, verified = await api.post(f"{path}/verify")
    assert (status, verified["id"]) == (202, dest_id), verified
    await receiver.wait_for(
        lambda: len(receiver.events("destination.verification")) == 2, timeout=15, what="re-verify"
    )

    # rotate-secret: a new secret, and the old one keeps verifying for 24 h.
    status, _, rotated = await api.post(f"{path}/rotate-secret")
    assert status == 200, rotated
    new_secret = rotated["secret"]
    assert new_secret.startswith("whsec_")
    assert new_secret != SECRET
    assert rotated["webhook"].get("secret", MASK) == MASK
    status, _, _ = await api.post(f"{path}/test")
    assert status == 200
    ping = receiver.events("test.ping")[-1]
    assert len(ping.headers["webhook-signature"].split()) == 2
    Webhook(new_secret).verify(ping.body, ping.headers)
    Webhook(SECRET).verify(ping.body, ping.headers)

    status, _, deleted = await api.delete(path)
    assert status == 200, deleted
    assert deleted["id"] == dest_id
    assert deleted.get("deleted") is True
    await expect_error(api.get(path), 404, "destination_not_found")
    await expect_error(api.delete(path), 404, "destination_not_found")
    assert (await api.get(DESTS))[2]["data"] == []


async def test_events_deliveries_retry_and_replay(api: Api, receiver: Receiver) -> None:
    dest = await create(api, hook(receiver.url, secret=SECRET, events=["task_run.*"]))
    dest_id = dest["id"]
    await wait_status(api, dest_id, "active")

    status, _, event = await api.post(
        "/v2/events",
        json={"type": "task_run.completed", "data": {"task_run_id": "trun_1", "status": "done"}},
    )
    assert status == 202, event
    assert set(event) == {"id", "object", "type", "created_at", "data", "ordering_key"}
    assert event["ordering_key"] is None
    assert event["id"].startswith("evt_")
    assert event["object"] == "event"
    assert event["data"] == {"task_run_id": "trun_1", "status": "done"}
    status, _, fetched = await api.get(f"/v2/events/{event['id']}")
    assert (status, fetched) == (200, event)

    # Caller-chosen id and created_at are kept.
    status, _, explicit = await api.post(
        "/v2/events",
        json={
            "id": "evt_explicit_1",
            "type": "credential.verified",
            "data": {},
            "created_at": "2026-01-02T03:04:05Z",
        },
    )
    assert status == 202, explicit
    assert explicit["id"] == "evt_explicit_1"
    assert explicit["created_at"].startswith("2026-01-02T03:04:05")

    await receiver.wait_for(lambda: len(receiver.events("task_run.completed")) == 1, what="event")
    got = receiver.events("task_run.completed")[0]
    assert got.verified, receiver.errors
    assert got.headers["webhook-id"] == event["id"]
    assert got.envelope == {k: event[k] for k in ("id", "type", "created_at", "data")}

    deliveries = f"{DESTS}/{dest_id}/event-deliveries"

    async def delivered() -> bool:
        _, _, page = await api.get(deliveries, params={"event_type": "task_run.completed"})
        return bool(page["data"]) and page["data"][0]["status"] == "success"

    await eventually(delivered, what="the delivery to be recorded as success")
    status, _, page = await api.get(deliveries, params={"event_type": "task_run.completed"})
    assert status == 200
    assert (page["object"], page["has_more"], page["next_cursor"]) == ("list", False, None)
    [delivery] = page["data"]
    assert delivery["object"] == "event_delivery"
    assert delivery["id"].startswith("dlv_")
    assert (delivery["event_id"], delivery["destination_id"]) == (event["id"], dest_id)
    assert (delivery["status"], delivery["attempt_count"]) == ("success", 1)
    assert delivery["next_attempt_at"] is None
    assert delivery["last_attempt"]["outcome"] == "success"
    # credential.verified is not subscribed: no delivery for it.
    all_types = {d["event_type"] for d in (await api.pages(deliveries))}
    assert all_types == {"destination.verification", "task_run.completed"}
    assert [d["id"] for d in (await api.get(deliveries, params={"status": "success"}))[2]["data"]]
    assert (await api.get(deliveries, params={"status": "failure"}))[2]["data"] == []

    status, _, one = await api.get(f"/v2/event-deliveries/{delivery['id']}")
    assert status == 200
    assert [(a["number"], a["outcome"], a["response_status"]) for a in one["attempts"]] == [
        (1, "success", 204)
    ]
    assert one["attempts"][0]["id"].startswith("att_")

    # retry: one more attempt of the same event.
    status, _, retried = await api.post(f"/v2/event-deliveries/{delivery['id']}/retry")
    assert status == 202, retried
    assert retried["id"] == delivery["id"]
    await receiver.wait_for(lambda: len(receiver.events("task_run.completed")) == 2, what="retry")
    assert {r.event_id for r in receiver.events("task_run.completed")} == {event["id"]}

    # replay: dry run counts, the real run re-queues.
    replay = f"{DESTS}/{dest_id}/replay"
    status, _, dry = await api.post(
        replay, json={"event_types": ["task_run.completed"], "dry_run": True}
    )
    assert status == 200, dry
    assert (dry["object"], dry["dry_run"], dry["matched"], dry["requeued"]) == (
        "replay",
        True,
        1,
        0,
    )
    await asyncio.sleep(0.3)
    assert len(receiver.events("task_run.completed")) == 2
    status, _, done = await api.post(replay, json={"event_types": ["task_run.completed"]})
    assert status == 202, done
    assert (done["matched"], done["requeued"]) == (1, 1)
    await receiver.wait_for(lambda: len(receiver.events("task_run.completed")) == 3, what="replay")

    async def attempts_recorded() -> bool:
        _, _, d = await api.get(f"/v2/event-deliveries/{delivery['id']}")
        return bool(d["status"] == "success" and d["attempt_count"] == 3)

    await eventually(attempts_recorded, what="three recorded attempts")
    assert receiver.events("credential.verified") == []


async def test_changing_the_webhook_url_sends_it_back_to_verification(
    api: Api, receiver: Receiver
) -> None:
    dest = await create(api, hook(receiver.url, secret=SECRET))
    path = f"{DESTS}/{dest['id']}"
    await wait_status(api, dest["id"], "active")
    # Another name is not another target: still active.
    status, _, renamed = await api.patch(path, json={"name": "same target"})
    assert (status, renamed["status"]) == (200, "active"), renamed
    status, _, moved = await api.patch(path, json={"webhook": {"url": dead_url()}})
    assert status == 200, moved
    assert (moved["status"], moved["webhook"]["url"]) == ("pending_verification", dead_url())
    await asyncio.sleep(0.5)  # the new target never answers: it stays unverified
    _, _, got = await api.get(path)
    assert got["status"] == "pending_verification"
    await expect_error(api.post(f"{path}/test"), 409, "destination_not_active")


async def test_a_pending_delivery_ends_as_failure_when_its_destination_is_deleted(
    api: Api,
) -> None:
    dest = await create(api, hook(dead_url(), events=["task_run.*"]))
    path = f"{DESTS}/{dest['id']}"
    status, _, _ = await api.post("/v2/events", json={"type": "task_run.failed", "data": {}})
    assert status == 202
    held = await held_delivery(api, dest["id"], "task_run.failed")
    assert (await api.delete(path))[0] == 200
    status, _, after = await api.get(f"/v2/event-deliveries/{held['id']}")
    assert status == 200, after
    assert (after["id"], after["destination_id"]) == (held["id"], dest["id"])
    assert after["status"] == "failure"
    assert after["next_attempt_at"] is None
    # The history of the deleted destination stays listable too, with nothing pending.
    _, _, page = await api.get(f"{path}/event-deliveries", params={"status": "pending"})
    assert page["data"] == []


async def held_delivery(api: Api, dest_id: str, event_type: str) -> dict[str, Any]:
    """The one delivery of ``event_type`` to ``dest_id``, once the relay has fanned it out."""
    deliveries = f"{DESTS}/{dest_id}/event-deliveries"

    async def fanned_out() -> bool:
        _, _, page = await api.get(deliveries, params={"event_type": event_type})
        return bool(page["data"])

    await eventually(fanned_out, what=f"the {event_type} delivery")
    _, _, page = await api.get(deliveries, params={"event_type": event_type})
    [delivery] = page["data"]
    assert (delivery["status"], delivery["held"]) == ("pending", True), delivery
    return dict(delivery)


async def test_status_pending_lists_held_deliveries_only(api: Api, receiver: Receiver) -> None:
    dest = await create(api, hook(receiver.url, secret=SECRET, events=["task_run.*"]))
    path = f"{DESTS}/{dest['id']}"
    deliveries = f"{path}/event-deliveries"
    await wait_status(api, dest["id"], "active")
    await api.post("/v2/events", json={"type": "task_run.completed", "data": {}})
    await receiver.wait_for(lambda: bool(receiver.events("task_run.completed")), what="delivery")

    async def recorded() -> bool:
        _, _, page = await api.get(deliveries, params={"status": "success"})
        return len(page["data"]) == 2  # the verification ping and the event

    await eventually(recorded, what="two successful deliveries")
    # An inactive destination holds what it is sent: pending, not attempted.
    assert (await api.patch(path, json={"status": "inactive"}))[0] == 200
    await api.post("/v2/events", json={"type": "task_run.failed", "data": {}})
    held = await held_delivery(api, dest["id"], "task_run.failed")

    status, _, pending = await api.get(deliveries, params={"status": "pending"})
    assert status == 200
    assert [(d["id"], d["status"], d["held"]) for d in pending["data"]] == [
        (held["id"], "pending", True)
    ]
    _, _, done = await api.get(deliveries, params={"status": "success"})
    assert held["id"] not in {d["id"] for d in done["data"]}
    assert {d["event_type"] for d in done["data"]} == {
        "destination.verification",
        "task_run.completed",
    }
    assert len((await api.get(deliveries))[2]["data"]) == 3


async def test_json_media_types_spec_000_accepts(api: Api) -> None:
    """text/json and any application/*+json carry a JSON body as application/json does."""
    body = json.dumps(hook(dead_url(), name="sent as text/json"))
    status, _, dest = await api.post(DESTS, data=body, content_type="text/json")
    assert status == 201, dest
    path = f"{DESTS}/{dest['id']}"
    for content_type, name in [
        ("application/merge-patch+json", "merge patch"),
        ("application/json; charset=utf-8", "with a charset"),
        ("application/vnd.herald+json", "vendor type"),
    ]:
        status, _, patched = await api.patch(
            path, data=json.dumps({"name": name}), content_type=content_type
        )
        assert (status, patched.get("name")) == (200, name), (content_type, patched)
    status, _, event = await api.post(
        "/v2/events",
        data=json.dumps({"type": "a.b", "data": {}}),
        content_type="application/cloudevents+json",
    )
    assert status == 202, event


# --- errors -------------------------------------------------------------------------------


async def test_a_revoked_key_is_refused_and_the_others_keep_working(
    herald_factory: HeraldFactory,
) -> None:
    """`herald keys list` names each key by an id and its last characters (never the key);
    `herald keys revoke` takes that id or the key itself, and the API refuses the key
    within the key lookup's bound (herald.access.keys.KEY_CACHE_SECONDS)."""
    h = herald_factory()
    first = await create_key(h, "acme")
    second = await create_key(h, "acme")
    listed = (await h.acli_json("keys", "list", "--tenant", "acme"))["data"]
    assert {k["ends_with"] for k in listed} == {first[-4:], second[-4:]}
    assert all(len(k["id"]) == 12 and k["revoked_at"] is None for k in listed)
    assert first not in json.dumps(listed)
    assert second not in json.dumps(listed)
    [first_id] = [k["id"] for k in listed if k["ends_with"] == first[-4:]]
    # Another tenant cannot revoke it; a malformed reference is a usage error.
    other = await h.acli("keys", "revoke", "--tenant", "globex", first_id, check=False)
    assert other.returncode == 1, other
    bad = await h.acli("keys", "revoke", "--tenant", "acme", "not-a-key", check=False)
    assert bad.returncode == 2, bad
    async with Api(base_url(h), first) as one, Api(base_url(h), second) as two:
        assert (await one.get(DESTS))[0] == 200
        revoked = await h.acli_json("keys", "revoke", "--tenant", "acme", first_id)
        assert (revoked["id"], revoked["revoked_at"] is not None) == (first_id, True)

        async def refused() -> bool:
            return (await one.get(DESTS))[0] == 401

        await eventually(refused, timeout=10, what="the revoked key refused")
        assert (await two.get(DESTS))[0] == 200
    again = await h.acli("keys", "revoke", "--tenant", "acme", first_id, check=False)
    assert again.returncode == 1  # nothing left to revoke under that id
    by_key = await h.acli_json("keys", "revoke", "--tenant", "acme", second)
    assert by_key["ends_with"] == second[-4:]
    listed = (await h.acli_json("keys", "list", "--tenant", "acme"))["data"]
    assert all(k["revoked_at"] is not None for k in listed)


async def test_401_for_a_missing_or_unknown_key(api: Api) -> None:
    known = api.key
    assert known is not None
    cases: list[tuple[dict[str, str], str]] = [
        ({}, "auth_missing"),
        ({"Authorization": "Basic dXNlcjpwYXNz"}, "auth_missing"),
        ({"Authorization": "Bearer "}, "auth_missing"),
        ({"Authorization": "Bearer sk_live_not-a-real-key"}, "auth_invalid_key"),
        ({"Authorization": "Bearer sk_test_" + known.removeprefix("sk_live_")}, "auth_invalid_key"),
        ({"Authorization": "Bearer " + known + "x"}, "auth_invalid_key"),
    ]
    async with api.with_key(None) as anonymous:
        for headers, code in cases:
            for method, path in [
                ("GET", DESTS),
                ("POST", DESTS),
                ("GET", f"{DESTS}/evtd_nope"),
                ("POST", "/v2/events"),
                ("GET", "/v2/event-deliveries/dlv_nope"),
            ]:
                item = await expect_error(
                    anonymous.request(method, path, headers=headers, json={}), 401, code
                )
                assert item["type"] == "auth", (headers, method, path)
    # The known key works.
    assert (await api.get(DESTS))[0] == 200


async def test_400_for_malformed_requests(api: Api) -> None:
    dest = await create(api, hook(dead_url()))
    path = f"{DESTS}/{dest['id']}"
    url = dead_url()
    cases: list[Case] = [
        ("POST", DESTS, {"data": "{not json"}, "invalid_json", None),
        ("POST", DESTS, {"data": "[1, 2]"}, "invalid_json", None),
        ("POST", DESTS, {"data": '"a string"'}, "invalid_json", None),
        ("POST", DESTS, {"data": ""}, "body_required", None),
        ("POST", DESTS, {"data": "{}", "content_type": "text/plain"}, "content_type_invalid", None),
        ("POST", DESTS, {"json": {**hook(url), "name": 1}}, "invalid_type", "name"),
        ("POST", DESTS, {"json": {**hook(url), "events": "*"}}, "invalid_type", "events"),
        ("POST", DESTS, {"json": {**hook(url), "events": [1]}}, "invalid_type", "events[0]"),
        ("POST", DESTS, {"json": {**hook(url), "webhook": url}}, "invalid_type", "webhook"),
        ("POST", DESTS, {"json": hook(url, secret=5)}, "invalid_type", "webhook.secret"),  # type: ignore[arg-type]
        ("POST", DESTS, {"json": {**hook(url), "colour": "red"}}, "unknown_field", "colour"),
        ("POST", DESTS, {"json": hook(url, method="PUT")}, "unknown_field", "webhook.method"),
        ("PATCH", path, {"json": {"status": 1}}, "invalid_type", "status"),
        ("PATCH", path, {"json": {"colour": "red"}}, "unknown_field", "colour"),
        ("PATCH", path, {"data": "{oops"}, "invalid_json", None),
        ("POST", "/v2/events", {"json": {"type": "a.b", "data": [1]}}, "invalid_type", "data"),
        ("POST", "/v2/events", {"json": {"type": 7, "data": {}}}, "invalid_type", "type"),
        (
            "POST",
            "/v2/events",
            {"json": {"type": "a.b", "data": {}, "extra": 1}},
            "unknown_field",
            "extra",
        ),
        ("POST", f"{path}/replay", {"json": {"dry_run": [1]}}, "invalid_type", "dry_run"),
        ("POST", f"{path}/replay", {"json": {"everything": True}}, "unknown_field", "everything"),
        ("POST", f"{path}/rotate-secret", {"json": {"secret": 5}}, "invalid_type", "secret"),
        (
            "POST",
            DESTS,
            {"json": hook(url), "headers": {"Idempotency-Key": "k" * 256}},
            "idempotency_key_invalid",
            "Idempotency-Key",
        ),
        ("GET", DESTS, {"params": {"colour": "red"}}, "unknown_parameter", "colour"),
    ]
    for endpoint in (DESTS, f"{path}/event-deliveries"):
        for bad in ("0", "101", "-1", "1.5", "ten", "", " 5"):
            cases.append(("GET", endpoint, {"params": {"limit": bad}}, "limit_invalid", "limit"))
    await check_cases(api, 400, cases)
    # Nothing above created or changed anything.
    listed = (await api.get(DESTS))[2]["data"]
    assert [(d["id"], d["name"], d["status"]) for d in listed] == [
        (dest["id"], dest["name"], "pending_verification")
    ]


async def test_400_for_a_unicode_digit_limit(api: Api) -> None:
    await expect_error(api.get(DESTS, params={"limit": "²"}), 400, "limit_invalid", "limit")


async def test_404_for_absent_objects_and_endpoints(api: Api) -> None:
    gone = (await create(api, hook(dead_url())))["id"]
    assert (await api.delete(f"{DESTS}/{gone}"))[0] == 200
    cases: list[Case] = []
    for dest_id in ("evtd_01jz0000000000000000000000", gone, "nope"):
        path = f"{DESTS}/{dest_id}"
        cases += [
            ("GET", path, {}, "destination_not_found", None),
            ("PATCH", path, {"json": {"name": "x"}}, "destination_not_found", None),
            ("DELETE", path, {}, "destination_not_found", None),
            ("POST", f"{path}/test", {}, "destination_not_found", None),
            ("POST", f"{path}/verify", {}, "destination_not_found", None),
            ("POST", f"{path}/rotate-secret", {}, "destination_not_found", None),
            ("POST", f"{path}/replay", {}, "destination_not_found", None),
        ]
    for dest_id in ("evtd_01jz0000000000000000000000", "nope"):
        cases.append(
            ("GET", f"{DESTS}/{dest_id}/event-deliveries", {}, "destination_not_found", None)
        )
    for dlv in ("dlv_01jz0000000000000000000000", "nope"):
        cases += [
            ("GET", f"/v2/event-deliveries/{dlv}", {}, "delivery_not_found", None),
            ("POST", f"/v2/event-deliveries/{dlv}/retry", {}, "delivery_not_found", None),
        ]
    cases += [
        ("GET", "/v2/events/evt_never_published", {}, "event_not_found", None),
        ("GET", "/v2/no-such-endpoint", {}, "endpoint_not_found", None),
        ("POST", "/v2/event-destinations/x/y/z", {}, "endpoint_not_found", None),
    ]
    await check_cases(api, 404, cases)


async def test_409_for_operations_the_state_does_not_allow(api: Api) -> None:
    pending = await create(api, hook(dead_url()))
    path = f"{DESTS}/{pending['id']}"
    await expect_error(api.post(f"{path}/test"), 409, "destination_not_active")
    await expect_error(
        api.patch(path, json={"status": "active"}), 409, "destination_not_verified", "status"
    )
    # The verification delivery is the engine's own: it cannot be retried by hand.
    _, _, page = await api.get(f"{path}/event-deliveries")
    [verification] = page["data"]
    assert verification["event_type"] == "destination.verification"
    await expect_error(
        api.post(f"/v2/event-deliveries/{verification['id']}/retry"), 409, "delivery_not_retryable"
    )
    assert (await api.get(path))[2]["status"] == "pending_verification"
    # Events for a pending destination are held; once it is deleted they cannot be retried.
    status, _, _ = await api.post("/v2/events", json={"type": "task_run.failed", "data": {}})
    assert status == 202

    async def held() -> bool:
        _, _, page = await api.get(
            f"{path}/event-deliveries", params={"event_type": "task_run.failed"}
        )
        return bool(page["data"])

    await eventually(held, what="the held delivery")
    _, _, page = await api.get(f"{path}/event-deliveries", params={"event_type": "task_run.failed"})
    [held_delivery] = page["data"]
    assert (held_delivery["status"], held_delivery["held"]) == ("pending", True)
    assert (await api.delete(path))[0] == 200
    await expect_error(
        api.post(f"/v2/event-deliveries/{held_delivery['id']}/retry"), 409, "destination_deleted"
    )


async def test_patch_cannot_activate_an_unverified_destination(api: Api) -> None:
    """Not even by way of inactive: only a successful verification ping activates."""
    pending = await create(api, hook(dead_url()))
    path = f"{DESTS}/{pending['id']}"
    await api.patch(path, json={"status": "inactive"})  # 409 or 200: either is acceptable
    await expect_error(
        api.patch(path, json={"status": "active"}), 409, "destination_not_verified", "status"
    )
    await expect_error(api.post(f"{path}/test"), 409, "destination_not_active")
    assert (await api.get(path))[2]["status"] != "active"


async def test_422_for_invalid_values(api: Api) -> None:
    url = dead_url()
    dest = await create(api, hook(url))
    path = f"{DESTS}/{dest['id']}"
    no_webhook = {k: v for k, v in hook(url).items() if k != "webhook"}
    cases: list[Case] = [
        # webhook.url must be an absolute http(s) URL
        ("POST", DESTS, {"json": hook("/relative/hook")}, "invalid_value", "webhook.url"),
        ("POST", DESTS, {"json": hook("hook.example.com/x")}, "invalid_value", "webhook.url"),
        ("POST", DESTS, {"json": hook("ftp://127.0.0.1/x")}, "invalid_value", "webhook.url"),
        ("POST", DESTS, {"json": hook("http://")}, "invalid_value", "webhook.url"),
        # the secret needs the whsec_ prefix
        ("POST", DESTS, {"json": hook(url, secret="abc")}, "invalid_value", "webhook.secret"),
        (
            "POST",
            DESTS,
            {"json": hook(url, secret=SECRET.removeprefix("whsec_"))},
            "invalid_value",
            "webhook.secret",
        ),
        # custom_headers is a JSON-encoded object of strings
        *[
            ("POST", DESTS, {"json": hook(url, custom_headers=v)}, "invalid_value", f)
            for v, f in [
                ("not json", "webhook.custom_headers"),
                ('["X-A", "1"]', "webhook.custom_headers"),
                ('"X-A: 1"', "webhook.custom_headers"),
                ('{"X-A": 1}', "webhook.custom_headers"),
                ('{"X-A": {"nested": "x"}}', "webhook.custom_headers"),
            ]
        ],
        # event patterns
        (
            "POST",
            DESTS,
            {"json": hook(url, events=["Task Run"])},
            "event_pattern_invalid",
            "events[0]",
        ),
        (
            "POST",
            DESTS,
            {"json": hook(url, events=["*", "task_run.**"])},
            "event_pattern_invalid",
            "events[1]",
        ),
        ("POST", DESTS, {"json": {**hook(url), "events": []}}, "events_empty", "events"),
        # type
        (
            "POST",
            DESTS,
            {"json": {**no_webhook, "type": "carrier_pigeon"}},
            "destination_type_unknown",
            "type",
        ),
        # missing required fields, named
        ("POST", DESTS, {"json": {**hook(url), "webhook": {}}}, "field_required", "webhook.url"),
        (
            "POST",
            DESTS,
            {"json": {**hook(url), "webhook": {"secret": SECRET}}},
            "field_required",
            "webhook.url",
        ),
        ("POST", DESTS, {"json": no_webhook}, "field_required", "webhook"),
        *[
            (
                "POST",
                DESTS,
                {"json": {k: v for k, v in hook(url).items() if k != missing}},
                "field_required",
                missing,
            )
            for missing in ("name", "type", "events")
        ],
        ("POST", DESTS, {"json": {**hook(url), "name": ""}}, "name_invalid", "name"),
        # Control characters (C0, DEL, C1): a retitled terminal, a broken log line.
        *[
            ("POST", DESTS, {"json": {**hook(url), "name": name}}, "name_invalid", "name")
            for name in ("\u001b]0;PWNED\u0007", "a\x7fb", "a\u0085b")
        ],
        # PATCH
        ("PATCH", path, {"json": {"name": "two\nlines"}}, "name_invalid", "name"),
        ("PATCH", path, {"json": {"status": "paused"}}, "status_invalid", "status"),
        ("PATCH", path, {"json": {"events": ["A B"]}}, "event_pattern_invalid", "events[0]"),
        # list filters
        ("GET", DESTS, {"params": {"status": "paused"}}, "status_invalid", "status"),
        ("GET", DESTS, {"params": {"type": "carrier_pigeon"}}, "destination_type_unknown", "type"),
        *[
            ("GET", f"{path}/event-deliveries", {"params": p}, c, f)
            for p, c, f in [
                ({"status": "lost"}, "status_invalid", "status"),
                ({"since": "yesterday"}, "timestamp_invalid", "since"),
                ({"until": "2026-13-45T00:00:00Z"}, "timestamp_invalid", "until"),
            ]
        ],
        # events
        *[
            ("POST", "/v2/events", {"json": body}, c, f)
            for body, c, f in [
                ({"type": "Task Run", "data": {}}, "event_type_invalid", "type"),
                ({"type": "", "data": {}}, "event_type_invalid", "type"),
                ({"type": "a.b", "data": {}, "id": "123"}, "event_id_invalid", "id"),
                *[
                    ({"type": "a.b", "data": {}, "id": i}, "event_id_invalid", "id")
                    for i in ("evt_x\r\nX-Injected: yes", "evt_\u009bx", "evt_\x7f")
                ],
                ({"type": "a.b\r\nX: y", "data": {}}, "event_type_invalid", "type"),
                (
                    {"type": "a.b", "data": {}, "created_at": "soon"},
                    "timestamp_invalid",
                    "created_at",
                ),
                ({"type": "a.b"}, "field_required", "data"),
                ({"data": {}}, "field_required", "type"),
            ]
        ],
        # replay and rotate
        ("POST", f"{path}/replay", {"json": {"since": "x"}}, "timestamp_invalid", "since"),
        # A duration past the calendar (was a 500: OverflowError writing it back).
        *[
            ("POST", f"{path}/replay", {"json": {w: "9" * 400 + "h"}}, "timestamp_invalid", w)
            for w in ("since", "until")
        ],
        (
            "GET",
            f"{path}/event-deliveries",
            {"params": {"since": "9" * 30 + "d"}},
            "timestamp_invalid",
            "since",
        ),
        ("POST", f"{path}/replay", {"json": {"status": "lost"}}, "invalid_value", "status"),
        ("POST", f"{path}/rotate-secret", {"json": {"secret": "abc"}}, "secret_invalid", "secret"),
    ]
    await check_cases(api, 422, cases)
    # Nothing above created or changed anything.
    listed = (await api.get(DESTS))[2]["data"]
    assert [(d["id"], d["name"], d["events"], d["webhook"]) for d in listed] == [
        (dest["id"], dest["name"], dest["events"], dest["webhook"])
    ]


async def test_422_names_the_missing_field_under_the_key_the_caller_used(api: Api) -> None:
    for type_name in ("aws_sqs", "cloudA_sqs"):
        body: dict[str, Any] = {"name": "q", "type": type_name, type_name: {}, "events": ["*"]}
        item = await expect_error(
            api.post(DESTS, json=body), 422, "field_required", f"{type_name}.queue_url"
        )
        assert item["type"] == "request"
    # The type by its alias, its config under the canonical id.
    mixed = {"name": "q", "type": "cloudA_sqs", "aws_sqs": {}, "events": ["*"]}
    await expect_error(api.post(DESTS, json=mixed), 422, "field_required", "aws_sqs.queue_url")
    assert (await api.get(DESTS))[2]["data"] == []


async def test_422_for_an_unknown_type_with_its_config_object(api: Api) -> None:
    body = {"name": "n", "type": "carrier_pigeon", "carrier_pigeon": {"loft": "x"}, "events": ["*"]}
    await expect_error(api.post(DESTS, json=body), 422, "destination_type_unknown", "type")


async def test_an_invalid_webhook_url_has_one_code_on_create_and_update(api: Api) -> None:
    dest = await create(api, hook(dead_url()))
    on_create = await expect_error(api.post(DESTS, json=hook("/rel")), 422, "invalid_value")
    on_update = await expect_error(
        api.patch(f"{DESTS}/{dest['id']}", json={"webhook": {"url": "/rel"}}), 422, "invalid_value"
    )
    assert on_create["field"] == on_update["field"] == "webhook.url"


async def test_405_uses_the_error_shape(api: Api) -> None:
    status, headers, body = await api.request("PUT", DESTS, json={})
    assert status == 405
    assert "POST" in headers["Allow"]
    item = error_of(body)
    assert item["code"] == "method_not_allowed"


async def test_413_for_an_oversized_body(api: Api) -> None:
    big = hook(dead_url(), name="x" * 1_100_000)
    await expect_error(api.post(DESTS, json=big), 413, "payload_too_large")
    assert (await api.get(DESTS))[2]["data"] == []


async def test_request_ids(api: Api) -> None:
    seen: set[str] = set()
    for _ in range(3):
        status, headers, body = await api.get(DESTS)
        assert status == 200
        assert body["request_id"] == headers["X-Request-Id"]
        assert body["request_id"].startswith("req_")
        seen.add(body["request_id"])
    status, headers, body = await api.get(f"{DESTS}/evtd_x")
    assert status == 404
    assert body["request_id"] == headers["X-Request-Id"]
    seen.add(body["request_id"])
    assert len(seen) == 4


async def api_log_lines(h: Herald, *request_ids: str) -> dict[str, dict[str, Any]]:
    """The daemon's ``api_request`` log line of each request id (waits for them)."""
    found: dict[str, dict[str, Any]] = {}

    async def logged() -> bool:
        found.clear()
        for line in h.log_events():
            if line.get("event") == "api_request" and line.get("request_id") in request_ids:
                assert line["request_id"] not in found, f"logged twice: {line}"
                found[line["request_id"]] = line
        return len(found) == len(request_ids)

    await eventually(logged, timeout=5, what=f"log lines of {request_ids}")
    return found


async def test_every_api_request_is_logged_with_its_request_id(herald: Herald, api: Api) -> None:
    """One structured line per /v2 request, with the id the caller got back, and neither
    the Authorization header nor the body; probes and scrapes stay out of the info log."""
    async with api.with_key(None) as anonymous:
        for probe in ("/healthz", "/readyz", "/metrics"):
            assert (await anonymous.get(probe))[0] == 200, probe
    status, created_headers, dest = await api.post(DESTS, json=hook(dead_url(), secret=SECRET))
    assert status == 201, dest
    status, missing_headers, _ = await api.get(f"{DESTS}/evtd_not_there")
    assert status == 404
    wrong_key = "sk_live_wrong-key-never-to-be-logged"
    async with api.with_key(wrong_key) as stranger:
        status, unauth_headers, _ = await stranger.get(DESTS, params={"limit": 5})
    assert status == 401
    ids = {
        name: headers["X-Request-Id"]
        for name, headers in (
            ("created", created_headers),
            ("missing", missing_headers),
            ("unauthorized", unauth_headers),
        )
    }
    lines = await api_log_lines(herald, *ids.values())
    created, missing, unauthorized = (lines[ids[n]] for n in ("created", "missing", "unauthorized"))
    assert (created["method"], created["path"], created["status"]) == ("POST", DESTS, 201)
    assert (missing["method"], missing["path"], missing["status"]) == (
        "GET",
        f"{DESTS}/evtd_not_there",
        404,
    )
    assert (unauthorized["method"], unauthorized["path"]) == ("GET", DESTS)
    assert unauthorized["status"] == 401
    assert created["tenant_id"] == missing["tenant_id"] == "acme"
    assert "tenant_id" not in unauthorized  # no valid key, no tenant
    for line in lines.values():
        assert line["level"] == "info"
        assert isinstance(line["duration_ms"], float)
        assert 0 <= line["duration_ms"] < 10_000
    text = herald.log()
    assert api.key is not None
    for secret in (api.key, wrong_key, SECRET, SECRET.removeprefix("whsec_")):
        assert secret not in text
    assert not [
        line
        for line in herald.log_events()
        if line.get("path") in ("/healthz", "/readyz", "/metrics")
    ], "probes are logged at debug level only"


async def test_an_idempotent_replay_is_logged_with_both_request_ids(
    herald: Herald, api: Api
) -> None:
    """A replayed error answers with the first request's id (body and header); the log
    line of the replay has its own id and names the one the caller got."""
    key = {"Idempotency-Key": "logged-twice"}
    _, first_headers, _ = await api.post(DESTS, json=hook("/rel"), headers=key)
    status, replay_headers, _ = await api.post(DESTS, json=hook("/rel"), headers=key)
    assert (status, replay_headers["Idempotent-Replayed"]) == (422, "true")
    original = first_headers["X-Request-Id"]
    assert replay_headers["X-Request-Id"] == original
    replays = [
        line
        for line in herald.log_events()
        if line.get("event") == "api_request" and line.get("replayed_request_id") == original
    ]
    assert len(replays) == 1, replays
    assert replays[0]["request_id"] != original
    assert replays[0]["status"] == 422


@pytest.mark.database_specific
async def test_500_when_the_database_is_unavailable(herald_factory: HeraldFactory) -> None:
    """Storage trouble is a 500 with the stable code storage_unavailable and no driver
    detail; the request id in the header finds the cause in the log."""
    h = herald_factory({"database": {"busy_timeout_seconds": 0.3}}, start=False)
    await h.astart()
    async with open_api(h, "acme") as api:
        assert (await api.get(DESTS))[0] == 200  # the key is known (and cached) by now
        away, back = database_outage(h)
        away()
        try:
            # SQLite still serves reads beside the other process's lock; writes fail.
            status, headers, body = await api.post(DESTS, json=hook(dead_url()))
            assert status == 500, body
            item = error_of(body)
            assert (item["type"], item["code"]) == ("api_error", "storage_unavailable")
            assert item["message"] == "the database is unavailable"
            assert "SQLite" not in json.dumps(body)
            assert "PostgreSQL" not in json.dumps(body)
            assert headers["X-Request-Id"] == body["request_id"]
        finally:
            back()
        request_id = body["request_id"]
        [line] = (await api_log_lines(h, request_id)).values()
        assert (line["status"], line["method"], line["path"]) == (500, "POST", DESTS)
        errors = [e for e in h.log_events() if e.get("event") == "api_error"]
        assert any(
            e.get("request_id") == request_id and e.get("code") == "storage_error" for e in errors
        ), errors

        async def recovered() -> bool:
            return (await api.post(DESTS, json=hook(dead_url())))[0] == 201

        await eventually(recovered, timeout=20, what="creates to work again")


# --- pagination -----------------------------------------------------------------------------


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _tamper(cursor: str) -> list[str]:
    """Ways to damage a valid cursor: flip a bit of its bytes, truncate, extend, forge."""
    raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
    flipped = [
        _b64(raw[:i] + bytes([raw[i] ^ 0x01]) + raw[i + 1 :])
        for i in (0, len(raw) // 3, len(raw) // 2, len(raw) - 1)
    ]
    middle = len(cursor) // 2
    swapped = cursor[:middle] + ("A" if cursor[middle] != "A" else "B") + cursor[middle + 1 :]
    try:
        payload = json.loads(raw[:-16])
        payload["k"] = "evtd_zzzzzzzzzzzzzzzzzzzzzzzzzz"
        forged_payload = json.dumps(payload).encode()
    except ValueError:
        forged_payload = b'{"k": "evtd_zzzzzzzzzzzzzzzzzzzzzzzzzz"}'
    return [
        *flipped,
        swapped,
        _b64(raw[:-1]),
        _b64(raw + b"\x00"),
        _b64(forged_payload + raw[-16:]),
        _b64(b'{"k": "evtd_x"}'),
        "not-a-cursor",
        "%%%",
        "",
    ]


@pytest.mark.database_specific
async def test_pagination_across_250_destinations(
    herald_factory: HeraldFactory, receiver: Receiver
) -> None:
    h = herald_factory(
        {"api": {"rate_limit_requests": 100_000}, "delivery": {"max_retries": 0}}, start=False
    )
    await h.astart()
    dead = dead_url()
    async with open_api(h, "pager") as api:
        created: list[str] = []
        for i in range(250):
            # Even: verified by the receiver (active). Odd: nothing listens (stays pending).
            url = receiver.url if i % 2 == 0 else dead
            created.append((await create(api, hook(url, name=f"d{i:03d}")))["id"])
        newest_first = created[::-1]
        active = newest_first[1::2]  # created[248], [246], …
        pending = newest_first[0::2]

        async def all_active() -> bool:
            page = await api.pages(DESTS, {"status": "active", "limit": 100})
            return len(page) == 125

        await eventually(all_active, timeout=60, what="125 verified destinations")

        # No filter, page sizes 20 (default), "100" (numeric string), 7 and 1.
        for limit, pages in ((None, 13), ("100", 3), (7, 36), (1, 250)):
            params: dict[str, str | int] = {} if limit is None else {"limit": limit}
            records = await api.pages(DESTS, params)
            assert [d["id"] for d in records] == newest_first, limit
            first = (await api.get(DESTS, params=params))[2]
            assert len(first["data"]) == (20 if limit is None else int(limit))
            assert first["has_more"] is True
            assert -(-250 // len(first["data"])) == pages
        last = (await api.get(DESTS, params={"limit": 100, "status": "active"}))[2]
        tail = (
            await api.get(
                DESTS, params={"limit": 100, "status": "active", "cursor": last["next_cursor"]}
            )
        )[2]
        assert (len(tail["data"]), tail["has_more"], tail["next_cursor"]) == (25, False, None)

        # Filters apply before pagination.
        filtered: list[tuple[Params, list[str]]] = [
            ({"status": "active", "limit": 9}, active),
            ({"status": "pending_verification"}, pending),
            ({"status": "inactive"}, []),
            ({"type": "webhook", "limit": 33}, newest_first),
            ({"type": "webhook", "status": "active", "limit": 50}, active),
        ]
        for params, expected in filtered:
            records = await api.pages(DESTS, params)
            assert [d["id"] for d in records] == expected, params
            assert all(d["status"] == params.get("status", d["status"]) for d in records)

        # The limit may change between pages; the cursor carries the position only.
        p1 = (await api.get(DESTS, params={"limit": 10}))[2]
        p2 = (await api.get(DESTS, params={"limit": 30, "cursor": p1["next_cursor"]}))[2]
        assert [d["id"] for d in p1["data"] + p2["data"]] == newest_first[:40]

        # A cursor is bound to its endpoint and filter set; damaged ones are refused.
        on_active = (await api.get(DESTS, params={"status": "active", "limit": 5}))[2][
            "next_cursor"
        ]
        plain = p1["next_cursor"]
        bad: list[tuple[Params, str]] = [
            ({"cursor": on_active}, "no filter"),
            ({"cursor": on_active, "status": "pending_verification"}, "other status"),
            ({"cursor": on_active, "status": "active", "type": "webhook"}, "extra filter"),
            ({"cursor": plain, "status": "active"}, "filter added"),
            ({"cursor": plain, "type": "webhook"}, "type added"),
        ]
        bad += [({"cursor": c}, f"tampered {c!r}") for c in _tamper(plain)]
        problems = []
        for params, why in bad:
            status, _, body = await api.get(DESTS, params=params)
            if status != 400 or error_of(body)["code"] != "cursor_invalid":
                problems.append(f"{why}: {status} {body}")
        # A destinations cursor on a deliveries list is foreign too.
        status, _, body = await api.get(
            f"{DESTS}/{created[0]}/event-deliveries", params={"cursor": plain}
        )
        if status != 400 or error_of(body)["code"] != "cursor_invalid":
            problems.append(f"destinations cursor on deliveries: {status} {body}")
        assert not problems, "\n".join(problems)
        item = await expect_error(
            api.get(DESTS, params={"cursor": "garbage"}), 400, "cursor_invalid"
        )
        assert item["field"] == "cursor"
        assert item["type"] == "request"


@pytest.mark.database_specific
async def test_pagination_across_250_deliveries(
    herald_factory: HeraldFactory, receiver: Receiver
) -> None:
    h = herald_factory({"api": {"rate_limit_requests": 100_000}}, start=False)
    await h.astart()
    async with open_api(h, "default") as api:
        dest = await create(api, hook(receiver.url, secret=SECRET))
        other = await create(api, hook(dead_url(), events=["nothing.here"]))
        await wait_status(api, dest["id"], "active")
        deliveries = f"{DESTS}/{dest['id']}/event-deliveries"

        def rows(prefix: str, n: int) -> list[tuple[str, str, str, str]]:
            types = ("task_run.completed", "task_run.failed")
            return [(f"{prefix}{i:03d}", "default", types[i % 2], "{}") for i in range(n)]

        first, second = rows("evt_first_", 150), rows("evt_second_", 100)
        h.insert_events(first)
        await receiver.wait_for(
            lambda: len(receiver.counts()) == 151, timeout=60, what="the first 150"
        )
        await asyncio.sleep(0.05)
        boundary = rfc3339(time.time())
        await asyncio.sleep(0.05)
        h.insert_events(second)
        await receiver.wait_for(
            lambda: len(receiver.counts()) == 251, timeout=60, what="the next 100"
        )

        async def all_recorded() -> bool:
            done = await api.pages(deliveries, {"status": "success", "limit": 100})
            return len(done) == 251

        await eventually(all_recorded, timeout=60, what="251 successful deliveries recorded")

        everything = await api.pages(deliveries)
        ids = [d["id"] for d in everything]
        assert len(ids) == len(set(ids)) == 251
        assert ids == sorted(ids, reverse=True), "newest first"
        created_at = [d["created_at"] for d in everything]
        assert created_at == sorted(created_at, reverse=True)
        event_ids = {d["event_id"] for d in everything}
        assert event_ids >= {r[0] for r in first + second}
        assert all(d["destination_id"] == dest["id"] for d in everything)
        for limit in (100, "100", 7, 1):
            assert [d["id"] for d in await api.pages(deliveries, {"limit": limit})] == ids

        def ids_of(*, types: tuple[str, ...] = (), since: bool | None = None) -> list[str]:
            out = []
            for d in everything:
                if types and d["event_type"] not in types:
                    continue
                if since is True and not d["event_id"].startswith("evt_second_"):
                    continue
                if since is False and d["event_id"].startswith("evt_second_"):
                    continue
                out.append(d["id"])
            return out

        filtered: list[tuple[Params, list[str]]] = [
            (
                {"event_type": "task_run.completed", "limit": 50},
                ids_of(types=("task_run.completed",)),
            ),
            ({"event_type": "task_run.failed"}, ids_of(types=("task_run.failed",))),
            ({"status": "success", "limit": 100}, ids),
            ({"status": "failure"}, []),
            ({"status": "pending"}, []),
            ({"since": boundary, "limit": 30}, ids_of(since=True)),
            ({"until": boundary, "limit": 30}, ids_of(since=False)),
            (
                {"since": boundary, "event_type": "task_run.failed", "limit": 7},
                ids_of(types=("task_run.failed",), since=True),
            ),
            (
                {"until": boundary, "event_type": "task_run.completed", "status": "success"},
                ids_of(types=("task_run.completed",), since=False),
            ),
        ]
        for params, expected in filtered:
            got = [d["id"] for d in await api.pages(deliveries, params)]
            assert got == expected, params
        assert len(ids_of(since=True)) == 100
        assert len(ids_of(types=("task_run.failed",), since=True)) == 50

        # Cursors are bound to the destination and the filters.
        page = (await api.get(deliveries, params={"event_type": "task_run.completed"}))[2]
        cursor = page["next_cursor"]
        assert cursor
        for path, params in [
            (deliveries, {"cursor": cursor}),
            (deliveries, {"cursor": cursor, "event_type": "task_run.failed"}),
            (
                deliveries,
                {"cursor": cursor, "event_type": "task_run.completed", "status": "success"},
            ),
            (
                f"{DESTS}/{other['id']}/event-deliveries",
                {"cursor": cursor, "event_type": "task_run.completed"},
            ),
            (DESTS, {"cursor": cursor}),
        ]:
            await expect_error(api.get(path, params=params), 400, "cursor_invalid", "cursor")
        for tampered in _tamper(cursor):
            await expect_error(
                api.get(
                    deliveries, params={"cursor": tampered, "event_type": "task_run.completed"}
                ),
                400,
                "cursor_invalid",
            )
        # The untouched cursor still works.
        status, _, nxt = await api.get(
            deliveries, params={"cursor": cursor, "event_type": "task_run.completed"}
        )
        assert status == 200
        assert nxt["data"][0]["id"] == ids_of(types=("task_run.completed",))[20]


# --- idempotency ------------------------------------------------------------------------------


async def test_idempotent_create_and_publish(api: Api, receiver: Receiver) -> None:
    body = hook(receiver.url, secret=SECRET, events=["task_run.*"], name="once")
    key = {"Idempotency-Key": "create-once-1"}
    status, headers, first = await api.post(DESTS, json=body, headers=key)
    assert status == 201, first
    assert "Idempotent-Replayed" not in headers
    status, headers, again = await api.post(DESTS, json=body, headers=key)
    assert status == 201
    assert headers["Idempotent-Replayed"] == "true"
    assert again == first
    # The same JSON object written differently is the same body.
    reordered = json.dumps(dict(reversed(list(body.items()))), indent=2)
    status, headers, third = await api.post(DESTS, data=reordered, headers=key)
    assert (status, headers.get("Idempotent-Replayed"), third) == (201, "true", first)
    await expect_error(
        api.post(DESTS, json={**body, "name": "twice"}, headers=key),
        422,
        "idempotency_key_reused",
        "Idempotency-Key",
    )
    # The original still replays after the refused reuse.
    status, headers, fourth = await api.post(DESTS, json=body, headers=key)
    assert (status, headers.get("Idempotent-Replayed"), fourth) == (201, "true", first)
    listed = (await api.get(DESTS))[2]["data"]
    assert [d["id"] for d in listed] == [first["id"]]
    # Another key, same body: a new destination.
    second = await create(api, body, headers={"Idempotency-Key": "create-once-2"})
    assert second["id"] != first["id"]
    assert (await api.delete(f"{DESTS}/{second['id']}"))[0] == 200
    await wait_status(api, first["id"], "active")

    event = {"type": "task_run.completed", "data": {"task_run_id": "trun_9"}}
    ekey = {"Idempotency-Key": "publish-once"}
    status, headers, published = await api.post("/v2/events", json=event, headers=ekey)
    assert status == 202, published
    assert "Idempotent-Replayed" not in headers
    for _ in range(3):
        status, headers, replayed = await api.post("/v2/events", json=event, headers=ekey)
        assert (status, headers["Idempotent-Replayed"], replayed) == (202, "true", published)
    await expect_error(
        api.post("/v2/events", json={**event, "data": {}}, headers=ekey),
        422,
        "idempotency_key_reused",
        "Idempotency-Key",
    )
    # A key used on one create endpoint cannot be reused on the other.
    await expect_error(
        api.post("/v2/events", json=event, headers=key), 422, "idempotency_key_reused"
    )
    await receiver.wait_for(lambda: len(receiver.events("task_run.completed")) >= 1, what="event")
    await asyncio.sleep(0.5)
    assert [r.event_id for r in receiver.events("task_run.completed")] == [published["id"]]


@pytest.mark.database_specific
async def test_idempotency_keys_expire_after_the_configured_ttl(
    herald_factory: HeraldFactory,
) -> None:
    ttl = 2.0
    h = herald_factory({"api": {"idempotency_ttl_seconds": ttl}}, start=False)
    await h.astart()
    key = {"Idempotency-Key": "short-lived"}
    async with open_api(h, "acme") as api:
        started = time.monotonic()
        first = await create(api, hook(dead_url(), name="first"), headers=key)
        await expect_error(
            api.post(DESTS, json=hook(dead_url(), name="second"), headers=key),
            422,
            "idempotency_key_reused",
            "Idempotency-Key",
        )
        status, headers, again = await api.post(
            DESTS, json=hook(dead_url(), name="first"), headers=key
        )
        assert (status, headers.get("Idempotent-Replayed"), again) == (201, "true", first)
        assert time.monotonic() - started < ttl, "too slow to check before the expiry"
        await asyncio.sleep(ttl + 0.2 - (time.monotonic() - started))
        # Expired: the key is free, so another body is a new request, not a reuse.
        status, headers, second = await api.post(
            DESTS, json=hook(dead_url(), name="second"), headers=key
        )
        assert status == 201, second
        assert "Idempotent-Replayed" not in headers
        assert second["id"] != first["id"]
        assert second["name"] == "second"
        # And the key now belongs to the second body.
        await expect_error(
            api.post(DESTS, json=hook(dead_url(), name="first"), headers=key),
            422,
            "idempotency_key_reused",
        )
        listed = (await api.get(DESTS))[2]["data"]
        assert [d["id"] for d in listed] == [second["id"], first["id"]]


async def test_a_replayed_error_keeps_body_and_header_request_ids_equal(api: Api) -> None:
    key = {"Idempotency-Key": "bad-body"}
    first = await expect_error(
        api.post(DESTS, json=hook("/rel"), headers=key), 422, "invalid_value"
    )
    status, headers, body = await api.post(DESTS, json=hook("/rel"), headers=key)
    assert status == 422
    assert error_of(body)["code"] == first["code"]
    assert body["request_id"] == headers["X-Request-Id"]


async def test_publishing_an_existing_event_id_conflicts(api: Api) -> None:
    twice: list[tuple[int, int, Any]] = []
    races: list[list[int]] = []
    for i in range(5):
        event_id = f"evt_twice_{i}"
        a = await api.post("/v2/events", json={"id": event_id, "type": "a.b", "data": {"n": 1}})
        b = await api.post("/v2/events", json={"id": event_id, "type": "a.b", "data": {"n": 2}})
        twice.append((a[0], b[0], b[2]))
        together = await asyncio.gather(
            *(
                api.post(
                    "/v2/events", json={"id": f"evt_race_{i}", "type": "a.b", "data": {"n": n}}
                )
                for n in range(3)
            )
        )
        races.append(sorted(r[0] for r in together))
    assert [t for t in twice if t[:2] != (202, 409)] == []
    assert [r for r in races if r != [202, 409, 409]] == []
    _, _, kept = await api.get("/v2/events/evt_twice_0")
    assert kept["data"] == {"n": 1}


# --- rate limits ------------------------------------------------------------------------------


def assert_rate_headers(headers: Headers, *, q: int, w: int) -> dict[str, str]:
    policy = ratelimit_fields(headers["RateLimit-Policy"])
    assert policy == {"q": str(q), "w": str(w)}, headers["RateLimit-Policy"]
    fields = ratelimit_fields(headers["RateLimit"])
    assert set(fields) == {"r", "t"}
    assert 0 <= int(fields["r"]) < q
    assert 1 <= int(fields["t"]) <= w
    return fields


async def test_rate_limit_default_is_200_per_10_seconds(api: Api) -> None:
    await fresh_rate_window(10, need=8)
    started = time.monotonic()
    replies = await asyncio.gather(*(api.get(DESTS) for _ in range(200)))
    assert time.monotonic() - started < 7, "too slow to stay inside one window"
    assert [r[0] for r in replies] == [200] * 200
    remaining = sorted(int(assert_rate_headers(r[1], q=200, w=10)["r"]) for r in replies)
    assert remaining == list(range(200))
    status, headers, body = await api.post(DESTS, json=hook(dead_url()))
    assert status == 429, body
    item = error_of(body)
    assert (item["type"], item["code"]) == ("rate_limit", "rate_limit_exceeded")
    assert headers["X-Request-Id"] == body["request_id"]
    assert 1 <= int(headers["Retry-After"]) <= 10
    assert assert_rate_headers(headers, q=200, w=10)["r"] == "0"
    # Refused requests do nothing.
    assert (await api.get(DESTS))[0] == 429


async def test_rate_limit_headers_429_and_recovery(herald_factory: HeraldFactory) -> None:
    h = herald_factory(
        {"api": {"rate_limit_requests": 4, "rate_limit_window_seconds": 3}}, start=False
    )
    await h.astart()
    async with open_api(h, "busy") as api:
        await fresh_rate_window(3, need=2)
        seen = []
        for _ in range(3):
            status, headers, _ = await api.get(DESTS)
            assert status == 200
            seen.append(int(assert_rate_headers(headers, q=4, w=3)["r"]))
        status, headers, created = await api.post(DESTS, json=hook(dead_url()))
        assert status == 201
        seen.append(int(assert_rate_headers(headers, q=4, w=3)["r"]))
        assert seen == [3, 2, 1, 0]
        for method, path in [("GET", DESTS), ("POST", DESTS), ("GET", f"{DESTS}/{created['id']}")]:
            status, headers, body = await api.request(method, path, json=hook(dead_url()))
            assert status == 429, body
            assert error_of(body)["code"] == "rate_limit_exceeded"
            retry_after = int(headers["Retry-After"])
            assert 1 <= retry_after <= 3
            assert ratelimit_fields(headers["RateLimit"])["r"] == "0"
            assert "RateLimit-Policy" in headers
        # Waiting as long as Retry-After says opens a new window.
        await asyncio.sleep(retry_after + 0.1)
        status, headers, listed = await api.get(DESTS)
        assert status == 200
        assert ratelimit_fields(headers["RateLimit"])["r"] == "3"
        assert [d["id"] for d in listed["data"]] == [created["id"]]  # the 429 POST made nothing
        # The OpenAPI document is not counted against the tenant (it needs no key: its
        # address's budget counts it, tests/e2e/test_openapi_served.py).
        for _ in range(6):
            assert (await api.get("/v2/openapi.json"))[0] == 200


# --- secrets --------------------------------------------------------------------------------


def assert_no_secret(raw: bytes | Any, *secrets: str) -> None:
    text = raw.decode() if isinstance(raw, bytes) else json.dumps(raw)
    for secret in secrets:
        assert secret not in text
        assert secret.removeprefix("whsec_") not in text


async def test_secrets_are_write_only(api: Api, receiver: Receiver) -> None:
    body = hook(receiver.url, secret=SECRET, custom_headers='{"X-Team": "blue"}')
    responses: list[Any] = []
    status, _, dest = await api.post(DESTS, json=body, headers={"Idempotency-Key": "s-1"})
    assert status == 201
    responses.append(dest)
    responses.append((await api.post(DESTS, json=body, headers={"Idempotency-Key": "s-1"}))[2])
    path = f"{DESTS}/{dest['id']}"
    assert dest["webhook"].get("secret", MASK) == MASK
    assert dest["webhook"]["custom_headers"] == MASK  # may carry credentials
    await wait_status(api, dest["id"], "active")
    calls: list[tuple[str, str, dict[str, Any]]] = [
        ("GET", path, {}),
        ("GET", DESTS, {}),
        ("PATCH", path, {"json": {"webhook": {"secret": OTHER_SECRET}}}),
        ("PATCH", path, {"json": {"name": "still secret"}}),
        ("GET", path, {}),
        ("POST", f"{path}/test", {}),
        ("GET", f"{path}/event-deliveries", {}),
        ("POST", f"{path}/replay", {"json": {"dry_run": True}}),
        ("POST", f"{path}/verify", {}),
        ("DELETE", path, {}),
    ]
    for method, p, kwargs in calls:
        status, _, raw = await api.raw(
            method, p, **({"json": kwargs["json"]} if "json" in kwargs else {})
        )
        assert status < 300, (method, p, raw)
        responses.append(raw)
    for raw in responses:
        assert_no_secret(raw, SECRET, OTHER_SECRET)
    # The secret was stored and used: the patched one signs deliveries.
    ping = receiver.events("test.ping")[-1]
    Webhook(OTHER_SECRET).verify(ping.body, ping.headers)


async def test_rotate_secret_shows_a_generated_secret_once(api: Api, receiver: Receiver) -> None:
    dest = await create(api, hook(receiver.url, secret=SECRET))
    path = f"{DESTS}/{dest['id']}"
    status, _, rotated = await api.post(f"{path}/rotate-secret")
    assert status == 200
    generated = rotated["secret"]
    assert generated.startswith("whsec_")
    for p in (path, DESTS, f"{path}/event-deliveries"):
        _, _, raw = await api.raw("GET", p)
        assert_no_secret(raw, SECRET, generated)
    # A webhook without a secret can get one by rotation.
    plain = await create(api, hook(receiver.url))
    status, _, first = await api.post(f"{DESTS}/{plain['id']}/rotate-secret")
    assert status == 200
    assert first["secret"].startswith("whsec_")


async def test_rotate_secret_does_not_echo_a_supplied_secret(api: Api) -> None:
    dest = await create(api, hook(dead_url(), secret=SECRET))
    status, _, raw = await api.raw(
        "POST", f"{DESTS}/{dest['id']}/rotate-secret", json={"secret": OTHER_SECRET}
    )
    assert status == 200
    assert_no_secret(raw, SECRET, OTHER_SECRET)


async def test_credentials_in_custom_headers_are_not_returned(api: Api) -> None:
    token = "Bearer tok_very_secret_value_123"
    headers = json.dumps({"Authorization": token, "X-Team": "blue"})
    status, _, raw = await api.raw("POST", DESTS, json=hook(dead_url(), custom_headers=headers))
    assert status == 201
    responses = [raw]
    dest_id = json.loads(raw)["id"]
    for p in (f"{DESTS}/{dest_id}", DESTS):
        responses.append((await api.raw("GET", p))[2])
    for r in responses:
        assert b"tok_very_secret_value_123" not in r


# --- test pings that fail --------------------------------------------------------------


async def test_receiver_answer_errors_are_recorded_by_test(api: Api) -> None:
    """POST …/test answers the attempt's result, also when the endpoint fails it."""
    state = {"fail": False}

    def behaviour(item: Any) -> web.StreamResponse:
        if state["fail"] and item.type == "test.ping":
            return web.Response(status=503, text="down for maintenance")
        return web.Response(status=204)

    r = await Receiver(secrets=[SECRET], behaviour=behaviour).start()
    try:
        dest = await create(api, hook(r.url, secret=SECRET))
        await wait_status(api, dest["id"], "active")
        state["fail"] = True
        status, _, tested = await api.post(f"{DESTS}/{dest['id']}/test")
        assert status == 200, tested
        assert (tested["status"], tested["attempt_count"]) == ("failure", 1)
        [attempt] = tested["attempts"]
        assert (attempt["outcome"], attempt["response_status"]) == ("failure_retryable", 503)
        assert "down for maintenance" in attempt["response_excerpt"]
        await asyncio.sleep(0.3)
        assert len(r.events("test.ping")) == 1, "test pings are never retried"
        await expect_error(
            api.post(f"/v2/event-deliveries/{tested['id']}/retry"), 409, "delivery_not_retryable"
        )
    finally:
        await r.stop()


async def test_every_bad_field_of_a_body_is_reported_at_once(api: Api) -> None:
    """One request, every problem: a client fixes its body in one round, not one field
    per round (issue 19). Each error names its field and has a resolution of its own."""
    body = {"name": "", "type": "webhook", "events": [], "webhook": {"secret": "nope"}}
    status, _, got = await api.post(DESTS, json=body)
    assert status == 422, got
    errors = {e["field"]: e for e in got["errors"]}
    assert {"name", "events", "webhook.url"} <= errors.keys(), got
    assert errors["webhook.url"]["code"] == "field_required"
    assert all(e["resolution"] for e in got["errors"])
    assert len(errors) == len(got["errors"]), "one error per field"
    dest = await create(api, hook(dead_url()))
    status, _, got = await api.patch(f"{DESTS}/{dest['id']}", json={"name": "", "events": []})
    assert status == 422, got
    assert {e["field"] for e in got["errors"]} == {"name", "events"}
    assert (await api.get(DESTS))[2]["data"][0]["name"] == dest["name"]  # nothing changed
