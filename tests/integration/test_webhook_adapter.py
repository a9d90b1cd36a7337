"""WebhookAdapter.deliver against real receivers: body, signing, headers, limits, egress.

Only the rotation test reads secrets back from a store, so only it runs on both
backends; the others exercise the adapter alone and run once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import orjson
import pytest
from aiohttp import web
from standardwebhooks.webhooks import Webhook

from herald.adapters.base import Adapter, AdapterContext, DestinationConfig, Result
from herald.adapters.httpdelivery import Proxy
from herald.adapters.registry import Registry
from herald.adapters.webhook import WebhookAdapter
from herald.config import Settings
from herald.egress import EgressPolicy
from herald.ids import new_id
from herald.model import Destination, DestinationStatus, Event, Outcome
from tests.contract import adapter_contract
from tests.contract.adapter_contract import AdapterContract
from tests.integration.conftest import (
    OTHER_SECRET,
    SECRET,
    Harness,
    ReceiverFactory,
    closed_port,
    make_settings,
    status,
)


def make_event(data: Mapping[str, Any] | None = None, *, type_: str = "order.created") -> Event:
    now = time.time()
    return Event(
        id=new_id("evt_"),
        tenant_id="acme",
        type=type_,
        created_at="2026-05-06T07:08:09.123456789Z",
        created_ts=now,
        data=orjson.dumps(data if data is not None else {"order": 1, "name": "caf\u00e9"}),
    )


def make_dest(url: str, **config: str) -> tuple[Destination, dict[str, Any]]:
    raw: dict[str, Any] = {"url": url, **config}
    now = time.time()
    dest = Destination(
        id=new_id("evtd_"),
        tenant_id="acme",
        name="hook",
        type="webhook",
        config={k: v for k, v in raw.items() if k != "secret"},
        secrets={"secret": raw["secret"]} if "secret" in raw else {},
        events=("*",),
        status=DestinationStatus.ACTIVE,
        created_at=now,
        updated_at=now,
    )
    return dest, raw


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """The harness's settings; the database they name is never opened here."""
    return make_settings(f"sqlite:///{tmp_path / 'unused.db'}")


@pytest.fixture
async def registry(settings: Settings) -> AsyncIterator[Registry]:
    """The adapters as ``herald.app`` builds them, without a store."""
    reg = Registry(
        AdapterContext(
            settings=settings,
            egress=EgressPolicy(allow_private=settings.security.allow_private_networks),
        )
    )
    yield reg
    await reg.close()


async def deliver(
    registry: Registry, dest: Destination, raw: Mapping[str, Any], event: Event
) -> Result:
    adapter = registry.get("webhook")
    assert isinstance(adapter, WebhookAdapter)
    config: DestinationConfig = registry.parse_config("webhook", raw)
    return await asyncio.wait_for(adapter.deliver(dest, config, event), 10)


async def test_body_is_the_envelope_and_the_request_is_signed(
    registry: Registry, receivers: ReceiverFactory
) -> None:
    rx = await receivers(status(202, "accepted"))
    dest, raw = make_dest(rx.url, secret=SECRET)
    event = make_event()
    before = int(time.time())
    result = await deliver(registry, dest, raw, event)
    after = int(time.time())
    assert result == Result(Outcome.SUCCESS, status=202, excerpt="accepted")
    [req] = rx.received
    assert req.body == event.envelope()
    assert orjson.loads(req.body) == {
        "id": event.id,
        "type": "order.created",
        "created_at": "2026-05-06T07:08:09.123456789Z",
        "data": {"order": 1, "name": "caf\u00e9"},
    }
    assert req.path == "/hook"
    assert req.headers["content-type"] == "application/json"
    assert req.headers["webhook-id"] == event.id
    assert before <= int(req.headers["webhook-timestamp"]) <= after
    signature = req.headers["webhook-signature"]
    assert signature.startswith("v1,")
    assert " " not in signature
    # Independent verification (the receiver did it too).
    assert req.verified
    assert rx.errors == []
    Webhook(SECRET).verify(req.body, req.headers)
    with pytest.raises(Exception, match=r"[Ss]ignature"):
        Webhook(OTHER_SECRET).verify(req.body, req.headers)


async def test_dual_signature_during_rotation_verifies_with_both_secrets(
    harness: Harness, receivers: ReceiverFactory
) -> None:
    h = harness
    rx = await receivers(secrets=())
    created = await h.service.create(
        "default",
        {
            "name": "rot",
            "type": "webhook",
            "events": ["*"],
            "webhook": {"url": rx.url, "secret": SECRET},
        },
    )
    _, new_secret = await h.service.rotate_secret("default", created.id)
    assert new_secret.startswith("whsec_")
    assert new_secret != SECRET
    await h.catalog.refresh()
    entry = h.catalog.get(created.id)
    assert entry is not None
    assert entry.config is not None
    event = make_event()
    result = await asyncio.wait_for(entry.adapter.deliver(entry.dest, entry.config, event), 10)
    assert result.outcome is Outcome.SUCCESS
    [req] = rx.received
    parts = req.headers["webhook-signature"].split(" ")
    assert len(parts) == 2
    assert all(p.startswith("v1,") for p in parts)
    # A receiver that knows only the old secret, or only the new one, accepts it.
    Webhook(SECRET).verify(req.body, req.headers)
    Webhook(new_secret).verify(req.body, req.headers)
    with pytest.raises(Exception, match=r"[Ss]ignature"):
        Webhook(OTHER_SECRET).verify(req.body, req.headers)

    # Once the window has passed, only the new secret signs.
    stored = await h.store.get_destination("default", created.id)
    assert stored is not None
    assert stored.secrets["_previous_secret"] == SECRET
    expired = replace(
        stored,
        config={**stored.config, "_previous_secret_until": time.time() - 1},
        updated_at=stored.updated_at + 1,
    )
    await h.store.update_destination(expired)
    await h.catalog.refresh()
    entry = h.catalog.get(created.id)
    assert entry is not None
    assert entry.config is not None
    await entry.adapter.deliver(entry.dest, entry.config, make_event())
    late = rx.received[-1]
    assert " " not in late.headers["webhook-signature"]
    Webhook(new_secret).verify(late.body, late.headers)
    with pytest.raises(Exception, match=r"[Ss]ignature"):
        Webhook(SECRET).verify(late.body, late.headers)


async def test_no_secret_no_signature_header(
    registry: Registry, receivers: ReceiverFactory
) -> None:
    rx = await receivers(secrets=())
    dest, raw = make_dest(rx.url)
    event = make_event()
    result = await deliver(registry, dest, raw, event)
    assert result.outcome is Outcome.SUCCESS
    [req] = rx.received
    assert "webhook-signature" not in req.headers
    assert req.headers["webhook-id"] == event.id
    assert "webhook-timestamp" in req.headers


async def test_custom_headers_are_sent(registry: Registry, receivers: ReceiverFactory) -> None:
    rx = await receivers()
    headers = {"X-Api-Key": "k-123", "X-Team": "payments"}
    dest, raw = make_dest(rx.url, secret=SECRET, custom_headers=orjson.dumps(headers).decode())
    await deliver(registry, dest, raw, make_event())
    [req] = rx.received
    assert req.headers["x-api-key"] == "k-123"
    assert req.headers["x-team"] == "payments"
    assert req.verified


async def test_redirects_are_not_followed(registry: Registry, receivers: ReceiverFactory) -> None:
    rx = await receivers(status(302, "moved", headers={"Location": "/elsewhere"}))
    dest, raw = make_dest(rx.url, secret=SECRET)
    result = await deliver(registry, dest, raw, make_event())
    assert result.outcome is Outcome.FAILURE_PERMANENT
    assert result.status == 302
    assert result.error is not None
    assert "redirect" in result.error
    assert [r.path for r in rx.received] == ["/hook"]


async def test_connection_refused_is_retryable(registry: Registry) -> None:
    dest, raw = make_dest(f"http://127.0.0.1:{closed_port()}/hook")
    result = await deliver(registry, dest, raw, make_event())
    assert result.outcome is Outcome.FAILURE_RETRYABLE
    assert result.status is None
    assert result.error is not None
    assert result.error.startswith("connection failed")


async def test_an_unreachable_proxy_is_named_without_its_url(tmp_path: Path) -> None:
    """The proxy's address and credentials are the operator's: the tenant reads a
    fixed text (the refusing proxy: tests/e2e/test_proxy_credentials.py)."""
    port = closed_port()
    settings = make_settings(
        f"sqlite:///{tmp_path / 'unused.db'}",
        delivery={"webhook_proxy": f"http://squid:Pr0xy-S3cret@127.0.0.1:{port}"},
    )
    registry = Registry(AdapterContext(settings=settings, egress=EgressPolicy(allow_private=True)))
    try:
        dest, raw = make_dest("https://127.0.0.1:9/hook")
        result = await deliver(registry, dest, raw, make_event())
    finally:
        await registry.close()
    assert result.outcome is Outcome.FAILURE_RETRYABLE
    assert result.error == "connection failed: egress proxy unreachable"


def test_proxy_credentials_go_to_the_proxy_only() -> None:
    proxy = Proxy.parse("http://squid:Pr0xy%2FS3cret@proxy.internal:3128")
    assert str(proxy.url) == "http://proxy.internal:3128"
    basic = "Basic c3F1aWQ6UHIweHkvUzNjcmV0"  # squid:Pr0xy/S3cret
    # Plain HTTP: the proxy reads the request itself. https: the CONNECT carries them,
    # the request inside the tunnel (which the target reads) does not.
    assert proxy.headers("http://t/h", {"a": "1"}) == (
        {"a": "1", "Proxy-Authorization": basic},
        None,
    )
    assert proxy.headers("https://t/h", {"a": "1"}) == ({"a": "1"}, {"Proxy-Authorization": basic})
    bare = Proxy.parse("http://proxy.internal:3128")
    assert bare.headers("http://t/h", {"a": "1"}) == ({"a": "1"}, None)


class Streamer:
    """A receiver that answers 200 with a huge body, streamed in chunks."""

    def __init__(self, total: int, chunk: int = 64 * 1024) -> None:
        self.total = total
        self.chunk = chunk
        self.sent = 0
        self.aborted = asyncio.Event()
        self.finished = False
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(status=200, headers={"Content-Type": "text/plain"})
        resp.content_length = self.total
        await resp.prepare(request)
        block = b"x" * self.chunk
        try:
            while self.sent < self.total:
                await resp.write(block)
                self.sent += len(block)
                await asyncio.sleep(0.002)
            self.finished = True
        except (ConnectionError, asyncio.CancelledError):
            self.aborted.set()
            raise
        return resp

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/hook", self.handle)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        assert site._server is not None
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]

    async def stop(self) -> None:
        if self._runner is not None:
            await asyncio.wait_for(self._runner.cleanup(), 10)


@pytest.fixture
async def streamer() -> AsyncIterator[Streamer]:
    s = Streamer(total=50 * 1024 * 1024)
    await s.start()
    yield s
    await s.stop()


async def test_response_excerpt_is_capped_and_the_rest_is_not_read(
    registry: Registry, streamer: Streamer
) -> None:
    dest, raw = make_dest(f"http://127.0.0.1:{streamer.port}/hook")
    result = await deliver(registry, dest, raw, make_event())
    assert result.outcome is Outcome.SUCCESS
    assert result.excerpt is not None
    assert len(result.excerpt.encode()) <= 1024
    assert result.excerpt == "x" * 1024
    # The whole body takes at least 1.6 s to stream; the adapter stops at 1 KiB and
    # drops the connection (no wall-clock bound here: a loaded machine is slow to start).
    await asyncio.wait_for(streamer.aborted.wait(), 5)
    assert not streamer.finished
    assert streamer.sent < streamer.total // 2


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
async def test_egress_guard_refuses_private_addresses_at_send_time(
    settings: Settings, receivers: ReceiverFactory, host: str
) -> None:
    rx = await receivers()
    strict = Registry(AdapterContext(settings=settings, egress=EgressPolicy(allow_private=False)))
    try:
        dest, raw = make_dest(f"http://{host}:{rx.port}/hook", secret=SECRET)
        result = await deliver(strict, dest, raw, make_event())
    finally:
        await strict.close()
    assert result.outcome is Outcome.FAILURE_PERMANENT
    assert result.status is None
    assert result.error is not None
    assert "egress denied" in result.error
    assert "127.0.0.1" in result.error
    await asyncio.sleep(0.1)
    assert rx.received == []


class TestWebhookContract(AdapterContract):
    """The shared contract, for the webhook type: a missing endpoint is a 404 and refused
    credentials a 401 from the receiver, both permanent; a closed port is retryable."""

    adapter_class = WebhookAdapter
    settings_overrides: ClassVar[dict[str, Any]] = {"delivery": {"webhook_timeout_seconds": 2.0}}

    @pytest.fixture
    async def good_config(self, receivers: ReceiverFactory) -> dict[str, str]:
        self.rx = await receivers()
        return {"url": self.rx.url, "secret": SECRET}

    @pytest.fixture
    async def missing_target_config(self, receivers: ReceiverFactory) -> dict[str, str]:
        return {"url": (await receivers(status(404, "no such hook"))).url}

    @pytest.fixture
    async def bad_credentials_config(self, receivers: ReceiverFactory) -> dict[str, str]:
        rx = await receivers(status(401, "signature rejected"), secrets=[SECRET])
        return {"url": rx.url, "secret": "whsec_" + "A" * 32}

    @pytest.fixture
    def unreachable_config(self) -> dict[str, str]:
        return {"url": f"http://127.0.0.1:{closed_port()}/hook"}

    async def read_back(self, config: dict[str, str], event: Event) -> dict[str, Any]:
        """A webhook carries the event id as ``webhook-id``, the rest in the envelope."""
        [got] = [r for r in self.rx.received if r.headers.get("webhook-id") == event.id]
        assert got.verified, self.rx.errors
        return {
            "body": got.body,
            "metadata": {
                "event-id": got.headers["webhook-id"],
                "event-type": got.envelope["type"],
                "event-created-at": got.envelope["created_at"],
                **{k: v for k, v in got.headers.items() if k == "traceparent"},
            },
        }

    async def test_success_arrives_with_envelope_and_metadata(
        self, adapter: Adapter, good_config: dict[str, str]
    ) -> None:
        """The contract's check, less ``tenant-id``: a webhook is signed, not labelled, and
        the tenant is implied by the destination (which belongs to one tenant)."""
        event = adapter_contract.make_event(tenant="acme")
        result = await self.publish(adapter, good_config, event)
        assert result.outcome is Outcome.SUCCESS, result
        got = await self.read_back(good_config, event)
        assert orjson.loads(got["body"]) == orjson.loads(event.envelope())
        assert got["metadata"] == {
            "event-id": event.id,
            "event-type": event.type,
            "event-created-at": event.created_at,
        }
