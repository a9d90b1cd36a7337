"""Fixed egress for receivers that allow-list source addresses: a forward proxy,
and outgoing connections bound to configured local addresses."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from tests.e2e.conftest import SECRET, HeraldFactory
from tests.e2e.test_delivery import wait_active
from tests.support.receiver import Receiver

pytestmark = [pytest.mark.e2e, pytest.mark.backend_neutral]


class ForwardProxy:
    """A minimal HTTP forward proxy: takes absolute-form requests and relays them."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._client: aiohttp.ClientSession | None = None

    async def start(self) -> ForwardProxy:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._relay)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        self._client = aiohttp.ClientSession()
        return self

    async def stop(self) -> None:
        if self._client is not None:
            await self._client.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _relay(self, request: web.Request) -> web.Response:
        target = str(request.url)
        self.seen.append(target)
        assert self._client is not None
        headers = {
            k: v
            for k, v in request.headers.items()
            if k.lower() not in ("host", "proxy-connection", "content-length")
        }
        async with self._client.request(
            request.method, target, data=await request.read(), headers=headers
        ) as resp:
            return web.Response(status=resp.status, body=await resp.read())


@pytest.fixture
async def proxy() -> AsyncIterator[ForwardProxy]:
    p = await ForwardProxy().start()
    yield p
    await p.stop()


async def test_webhooks_leave_through_the_configured_proxy(
    herald_factory: HeraldFactory, receiver: Receiver, proxy: ForwardProxy
) -> None:
    h = herald_factory({"delivery": {"webhook_proxy": f"http://127.0.0.1:{proxy.port}"}})
    dest = await h.acreate_webhook(receiver.url, secret=SECRET)
    await wait_active(h, dest["id"])
    h.insert_events([("evt_proxied", "default", "a.b", "{}")])
    await receiver.wait_for(lambda: "evt_proxied" in receiver.counts(), what="proxied delivery")
    got = receiver.events("a.b")[0]
    assert got.verified, receiver.errors  # the signature survives the hop
    assert receiver.url in proxy.seen  # every request went through the proxy
    assert len(proxy.seen) == len(receiver.received)


async def test_webhooks_bind_to_the_configured_source_address(
    herald_factory: HeraldFactory, receiver: Receiver
) -> None:
    h = herald_factory({"delivery": {"webhook_source_addresses": ["127.0.0.2"]}})
    dest = await h.acreate_webhook(receiver.url, secret=SECRET)
    await wait_active(h, dest["id"])
    h.insert_events([("evt_bound", "default", "a.b", "{}")])
    await receiver.wait_for(lambda: "evt_bound" in receiver.counts(), what="bound delivery")
    assert {r.remote for r in receiver.received} == {"127.0.0.2"}


async def test_several_source_addresses_are_used_in_turn(
    herald_factory: HeraldFactory, receiver: Receiver
) -> None:
    """A receiver allow-lists the whole set: every request leaves from one of them, and
    all of them are used."""
    addresses = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    h = herald_factory({"delivery": {"webhook_source_addresses": addresses}})
    dest = await h.acreate_webhook(receiver.url, secret=SECRET)
    await wait_active(h, dest["id"])
    h.insert_events([(f"evt_turn{i}", "default", "a.b", "{}") for i in range(30)])
    await receiver.wait_for(lambda: len(receiver.events("a.b")) == 30, what="30 deliveries")
    assert {r.remote for r in receiver.received} == set(addresses)


async def test_without_egress_settings_connections_come_from_loopback(
    herald_factory: HeraldFactory, receiver: Receiver
) -> None:
    h = herald_factory()
    dest = await h.acreate_webhook(receiver.url, secret=SECRET)
    await wait_active(h, dest["id"])
    assert {r.remote for r in receiver.received} == {"127.0.0.1"}
