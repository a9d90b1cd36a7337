"""The HTTP layer under hostile clients: what it refuses is answered in the spec's
``errors`` shape, slow clients are dropped, connections are capped, credentials that
cannot be keys are a 401, and floods of unauthenticated requests are rate limited.

These talk raw HTTP/1.1 over sockets: the requests are ones a well-behaved client
library will not send (undecodable header bytes, half a header, a short body).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import pytest

from tests.e2e.conftest import HeraldFactory
from tests.support.api import Api, error_of
from tests.support.daemon import Herald

pytestmark = [pytest.mark.e2e, pytest.mark.backend_neutral]

DESTS = "/v2/event-destinations"
DROPPED_WITHIN = 15.0
"""Seconds by which a slow client configured for a 1 s timeout must be dropped."""


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


async def _read_answer(reader: asyncio.StreamReader) -> Answer:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return Answer(status, headers, body)


async def raw_request(
    h: Herald, request: bytes, *, source: str | None = None, timeout: float = 30.0
) -> Answer:
    """Send ``request`` as is on a new connection (from ``source``, a loopback
    address) and read one answer."""
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", h.port, local_addr=(source, 0) if source else None
    )
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(_read_answer(reader), timeout)
    finally:
        writer.close()


def get(path: str, *header_lines: bytes) -> bytes:
    lines = [f"GET {path} HTTP/1.1".encode(), b"Host: herald", *header_lines]
    return b"\r\n".join(lines) + b"\r\n\r\n"


def bearer(key: bytes) -> bytes:
    return b"Authorization: Bearer " + key


async def closed_within(reader: asyncio.StreamReader, limit: float) -> tuple[float, bytes]:
    """Read until the server closes the connection; (seconds it took, what came)."""
    started = time.monotonic()
    received = await asyncio.wait_for(reader.read(), limit)
    return time.monotonic() - started, received


# --- credentials ----------------------------------------------------------------------


async def test_a_credential_that_cannot_be_a_key_is_a_401_in_the_errors_shape(
    herald: Herald,
) -> None:
    for key in (
        b"sk_live_\xff\xfe",  # not UTF-8
        "sk_live_ключ".encode(),  # UTF-8, not ASCII
        b"sk_live_a\tb",  # a control character
        b"sk_live_" + b"k" * 500,  # longer than any key
    ):
        answer = await raw_request(herald, get(DESTS, bearer(key)))
        assert answer.status == 401, (key, answer)
        item = error_of(answer.json())
        assert (item["type"], item["code"]) == ("auth", "auth_invalid_key"), item
        assert answer.json()["request_id"] == answer.headers["x-request-id"]
        assert answer.headers["www-authenticate"].startswith("Bearer"), answer.headers
    answer = await raw_request(herald, get(DESTS))
    assert answer.status == 401
    assert answer.headers["www-authenticate"] == 'Bearer realm="herald"'
    assert "Traceback" not in herald.log()
    assert herald.get("/readyz")[0] == 200


async def test_two_authorization_headers_are_a_400_not_first_wins(herald: Herald) -> None:
    """Issue 31: a proxy that adds its own Authorization in front of the client's (or
    after it) must not decide which key the request runs as."""
    key = (await herald.acli("keys", "create", "--tenant", "acme")).stdout.strip().encode()
    assert (await raw_request(herald, get(DESTS, bearer(key)))).status == 200
    for pair in ((key, b"sk_live_other"), (b"sk_live_other", key), (key, key)):
        answer = await raw_request(herald, get(DESTS, *(bearer(k) for k in pair)))
        assert answer.status == 400, (pair, answer)
        item = error_of(answer.json())
        assert (item["type"], item["code"]) == ("request", "auth_header_repeated"), item
        assert key.decode() not in answer.body.decode()


async def test_unauthenticated_requests_are_rate_limited_per_client_address(
    herald_factory: HeraldFactory,
) -> None:
    # A long window: the whole test runs inside one, however loaded the machine.
    h = herald_factory(
        {"api": {"unauthenticated_rate_limit_requests": 5, "rate_limit_window_seconds": 300}},
        start=False,
    )
    await h.astart()
    key = (await h.acli("keys", "create", "--tenant", "acme")).stdout.strip().encode()
    bad = get(DESTS, bearer(b"sk_live_made-up"))
    for _ in range(5):
        assert (await raw_request(h, bad)).status == 401
    for request in (bad, get(DESTS), get(DESTS, bearer(b"sk_live_\xff"))):
        answer = await raw_request(h, request)
        assert answer.status == 429, answer
        item = error_of(answer.json())
        assert (item["type"], item["code"]) == ("rate_limit", "rate_limit_exceeded")
        assert 1 <= int(answer.headers["retry-after"]) <= 300
    # A valid key is served from that address; another address has its own budget.
    assert (await raw_request(h, get(DESTS, bearer(key)))).status == 200
    assert (await raw_request(h, bad, source="127.0.0.2")).status == 401
    # The flood is one log line, not one per request.
    events = [e for e in h.log_events() if e.get("event") == "api_request"]
    assert sum(e["status"] == 401 for e in events) == 6, events
    assert not any(e["status"] == 429 for e in events), events
    limited = [e for e in h.log_events() if e.get("event") == "unauthenticated_requests_limited"]
    assert [e["address"] for e in limited] == ["127.0.0.1"], limited


# --- what the HTTP parser refuses -------------------------------------------------------


async def test_requests_the_http_layer_refuses_get_the_errors_shape_without_echo(
    herald: Herald,
) -> None:
    secret = "sk_live_" + "s" * 9000
    cases = {
        "a huge API key": get(DESTS, bearer(secret.encode())),
        "a huge header": get(DESTS, b"X-Big: " + b"v" * 20_000),
        "too many headers": get(DESTS, *(f"X-H{i}: v".encode() for i in range(300))),
        "a malformed header": get(DESTS, b"Bad Header: v"),
        "a malformed request line": b"GET /v2 HTTP/1.1 extra\r\nHost: h\r\n\r\n",
    }
    for what, request in cases.items():
        answer = await raw_request(herald, request)
        assert answer.status == 400, (what, answer)
        assert answer.headers["content-type"].startswith("application/json"), what
        body = answer.json()
        item = error_of(body)
        assert item["type"] == "request", (what, item)
        assert body["request_id"] == answer.headers["x-request-id"], what
        assert b"sss" not in answer.body, what
        assert b"vvv" not in answer.body, what
        assert answer.headers["server"] == "herald", what
    assert "sss" not in herald.log()
    assert herald.get("/readyz")[0] == 200


async def test_the_server_header_names_no_versions(herald: Herald) -> None:
    for path in ("/healthz", "/v2/openapi.json", DESTS, "/no-such-page"):
        answer = await raw_request(herald, get(path))
        assert answer.headers["server"] == "herald", (path, answer.headers)


# --- slow clients and the connection cap ------------------------------------------------


@pytest.fixture
async def impatient(herald_factory: HeraldFactory) -> Herald:
    """A daemon that waits 1 s for a request head, and 1 s for a body after it."""
    h = herald_factory(
        {"api": {"header_timeout_seconds": 1.0, "body_timeout_seconds": 1.0}}, start=False
    )
    return await h.astart()


async def test_half_a_header_is_dropped(impatient: Herald) -> None:
    for sent in (b"", b"GET /v2/event-destinations HTTP/1.1\r\nHost: herald\r\nAuthoriz"):
        reader, writer = await asyncio.open_connection("127.0.0.1", impatient.port)
        try:
            writer.write(sent)
            await writer.drain()
            took, received = await closed_within(reader, DROPPED_WITHIN)
        finally:
            writer.close()
        assert received == b"", received
        assert took < DROPPED_WITHIN, took
    assert impatient.get("/readyz")[0] == 200


async def test_a_body_shorter_than_its_content_length_is_a_408_and_dropped(
    impatient: Herald,
) -> None:
    key = (await impatient.acli("keys", "create", "--tenant", "acme")).stdout.strip()
    head = (
        f"POST /v2/events HTTP/1.1\r\nHost: herald\r\nAuthorization: Bearer {key}\r\n"
        "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    ).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", impatient.port)
    try:
        writer.write(head + b'{"type": "a.b",')
        await writer.drain()
        answer = await asyncio.wait_for(_read_answer(reader), DROPPED_WITHIN)
        took, _ = await closed_within(reader, DROPPED_WITHIN)
    finally:
        writer.close()
    assert answer.status == 408, answer
    assert error_of(answer.json())["code"] == "request_timeout"
    assert answer.headers["connection"] == "close"
    assert took < DROPPED_WITHIN
    # Nothing was published.
    assert impatient.get("/readyz")[0] == 200


async def test_connections_past_max_connections_are_refused_with_503(
    herald_factory: HeraldFactory,
) -> None:
    h = herald_factory({"api": {"max_connections": 2, "header_timeout_seconds": 60}}, start=False)
    await h.astart()
    held = [await asyncio.open_connection("127.0.0.1", h.port) for _ in range(2)]
    try:
        answer = await raw_request(h, get("/healthz"))
        assert answer.status == 503, answer
        item = error_of(answer.json())
        assert item["code"] == "too_many_connections"
        assert answer.headers["retry-after"] == "1"
    finally:
        for _, writer in held:
            writer.close()
    # Once they are gone, connections are served again.
    deadline = time.monotonic() + DROPPED_WITHIN
    while (await raw_request(h, get("/healthz"))).status != 200:
        assert time.monotonic() < deadline, "still refused after the held connections closed"
        await asyncio.sleep(0.05)


# --- field and list limits ----------------------------------------------------------------


async def created(api: Api, body: dict[str, Any]) -> dict[str, Any]:
    status, _, answer = await api.post(DESTS, json=body)
    assert status == 201, answer
    assert isinstance(answer, dict)
    return answer


LOCAL = "http://127.0.0.1:9/"
"""A URL the test daemon accepts (private networks allowed): only its length is wrong."""


def webhook(name: str = "hook", **config: str) -> dict[str, Any]:
    return {
        "name": name,
        "type": "webhook",
        "webhook": {"url": LOCAL + "hook", **config},
        "events": ["*"],
    }


async def test_every_list_and_string_has_a_limit_answered_with_a_422_naming_the_field(
    api: Api,
) -> None:
    dest = await created(api, webhook())
    path = f"{DESTS}/{dest['id']}"
    headers_33 = json.dumps({f"X-H{i}": "v" for i in range(33)})
    cases: list[tuple[str, str, Any, str, str]] = [
        ("POST", DESTS, webhook(url=LOCAL + "p" * 200_000), "webhook.url", ""),
        ("POST", DESTS, webhook(url=LOCAL + "p" * (2049 - len(LOCAL))), "webhook.url", ""),
        ("POST", DESTS, webhook(custom_headers=headers_33), "webhook.custom_headers", ""),
        (
            "POST",
            DESTS,
            webhook(custom_headers=json.dumps({"X-Big": "v" * 9000})),
            "webhook.custom_headers",
            "",
        ),
        ("POST", DESTS, webhook(endpoint_url="h" * 20_000), "webhook.endpoint_url", "too_long"),
        ("POST", DESTS, webhook(name="n" * 256), "name", "name_invalid"),
        ("POST", DESTS, webhook(name="n" + " " * 300), "name", "name_invalid"),
        ("POST", DESTS, {**webhook(), "type": "t" * 100_000}, "type", "too_long"),
        ("POST", DESTS, {**webhook(), "events": ["a.b"] * 101}, "events", "events_invalid"),
        ("PATCH", path, {"name": "n" * 256}, "name", "name_invalid"),
        ("PATCH", path, {"webhook": {"url": LOCAL + "p" * 3000}}, "webhook.url", ""),
        ("POST", f"{path}/replay", {"event_types": ["a.b"] * 101}, "event_types", ""),
        ("POST", f"{path}/replay", {"event_types": ["a", "B B"]}, "event_types[1]", ""),
        ("POST", "/v2/events", {"type": "t" * 129, "data": {}}, "type", ""),
    ]
    for method, p, body, field, code in cases:
        status, _, answer = await api.request(method, p, json=body)
        assert status == 422, (method, p, field, answer)
        item = error_of(answer)
        assert item["field"] == field, (field, item)
        if field == "webhook.url":
            assert "2048" in item["message"], item
        if code:
            assert item["code"] == code, (field, item)
        assert len(json.dumps(answer)) < 2000, (field, "the error echoes the value")
    # 255,000 entries, just under api.max_body_bytes written compactly: a 500 before.
    compact = json.dumps({"event_types": ["a"] * 255_000}, separators=(",", ":"))
    status, _, answer = await api.post(f"{path}/replay", data=compact)
    assert status == 422, answer
    assert (error_of(answer)["field"], error_of(answer)["code"]) == (
        "event_types",
        "too_many_items",
    )
    status, _, answer = await api.get(f"{path}/event-deliveries", params={"event_type": "x" * 200})
    assert status == 422, answer
    assert error_of(answer)["field"] == "event_type"
    # Nothing was stored or changed.
    status, _, listed = await api.get(DESTS)
    assert [(d["id"], d["name"], d["webhook"]["url"]) for d in listed["data"]] == [
        (dest["id"], dest["name"], dest["webhook"]["url"])
    ]
    # At the limits, it is accepted.
    at_limits = webhook(
        name="n" * 255,
        url=LOCAL + "p" * (2048 - len(LOCAL)),
        custom_headers=json.dumps({f"X-H{i}": "v" for i in range(32)}),
    )
    at_limits["events"] = [f"t{i}.x" for i in range(100)]
    await created(api, at_limits)
    status, _, answer = await api.post(
        f"{path}/replay", json={"event_types": [f"t{i}.x" for i in range(100)], "dry_run": True}
    )
    assert status == 200, answer
