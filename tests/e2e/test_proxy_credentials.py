"""The operator's proxy password never reaches a tenant (issue 31, item 1).

A real allow-listing forward proxy on 127.0.0.1 refuses a ``CONNECT`` (every https
target) and any plain-HTTP target it does not allow with 403, and relays plain HTTP
to the one receiver it allows (the tenant's monitor of ``herald.*``). The daemon's
``delivery.webhook_proxy`` carries ``user:password``; after one refused delivery
each way, the password (as written, percent-decoded, and as the Basic credentials
the proxy was sent) is looked for in everything a tenant or a log reader sees.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import urllib.parse
from collections.abc import AsyncIterator

import aiohttp
import pytest

from tests.e2e.conftest import SECRET, HeraldFactory
from tests.e2e.test_console_http import Client
from tests.e2e.test_delivery import wait_active
from tests.support.api import open_api
from tests.support.daemon import free_port
from tests.support.receiver import Receiver

pytestmark = [pytest.mark.e2e, pytest.mark.backend_neutral]

USER = "herald-egress"
PASSWORD = "Pr0xy/S3cret!x"  # "/" and "!" are percent-encoded in the URL
BASIC = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
# "S3cret" finds the password however it is (partly) encoded.
LEAKS = ("S3cret", BASIC)


class AllowListingProxy:
    """A forward proxy that relays plain HTTP to ``allowed`` origins and answers 403 to
    anything else: every ``CONNECT``, and the rest with a page that echoes the request's
    ``Proxy-Authorization`` (a careless proxy's error page)."""

    def __init__(self, allowed: set[str]) -> None:
        self.allowed = allowed
        self.refused: list[str] = []
        self.credentials: list[str | None] = []
        self.port = 0
        self._server: asyncio.Server | None = None
        self._open: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        self._client: aiohttp.ClientSession | None = None

    async def start(self) -> AllowListingProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        self._client = aiohttp.ClientSession()
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in self._open.values():
            writer.close()  # its handler reads EOF and returns
        await asyncio.gather(*self._open)
        if self._client is not None:
            await self._client.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._open[task] = writer
        try:
            while await self._one(reader, writer):
                pass
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
            del self._open[task]

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        head = await reader.readuntil(b"\r\n\r\n")
        method, target, _ = head.split(b"\r\n", 1)[0].decode().split(" ", 2)
        headers: dict[str, str] = {}
        for line in head.decode().split("\r\n")[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        auth = headers.get("proxy-authorization")
        self.credentials.append(auth)
        origin = "{0.scheme}://{0.netloc}".format(urllib.parse.urlsplit(target))
        if method == "CONNECT" or origin not in self.allowed:
            self.refused.append(f"{method} {target}")
            page = f"access denied for {auth}".encode()
            writer.write(
                b"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\n"
                + f"Content-Length: {len(page)}\r\n\r\n".encode()
                + page
            )
            await writer.drain()
            return method != "CONNECT"
        assert self._client is not None
        relayed = {
            k: v
            for k, v in headers.items()
            if k not in ("host", "proxy-authorization", "proxy-connection", "content-length")
        }
        async with self._client.request(method, target, data=body, headers=relayed) as resp:
            answer = await resp.read()
            writer.write(
                f"HTTP/1.1 {resp.status} {resp.reason}\r\n"
                f"Content-Length: {len(answer)}\r\n\r\n".encode()
                + answer
            )
        await writer.drain()
        return True


@pytest.fixture
async def monitor() -> AsyncIterator[Receiver]:
    r = await Receiver(secrets=[SECRET]).start()
    yield r
    await r.stop()


@pytest.fixture
async def proxy(monitor: Receiver) -> AsyncIterator[AllowListingProxy]:
    p = await AllowListingProxy({f"http://127.0.0.1:{monitor.port}"}).start()
    yield p
    await p.stop()


def leaked(text: str) -> list[str]:
    return [secret for secret in LEAKS if secret in text]


async def get_text(url: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        assert resp.status == 200, url
        return await resp.text()


async def test_a_refusing_proxy_never_shows_its_password_to_the_tenant(
    herald_factory: HeraldFactory, monitor: Receiver, proxy: AllowListingProxy
) -> None:
    quoted = urllib.parse.quote(PASSWORD, safe="")
    h = herald_factory(
        {
            "delivery": {
                "webhook_proxy": f"http://{USER}:{quoted}@127.0.0.1:{proxy.port}",
                "max_retries": 1,
            },
            "signals": {"failing_after_attempts": 1},
        }
    )
    mon = await h.acreate_webhook(monitor.url, secret=SECRET, events=["herald.*"], name="mon")
    await wait_active(h, mon["id"])
    https = await h.acreate_webhook("https://127.0.0.1:9/hook", name="over https")
    plain = await h.acreate_webhook(f"http://127.0.0.1:{free_port()}/hook", name="over http")
    await monitor.wait_for(
        lambda: len(monitor.events("herald.destination.verification_failed")) == 2,
        what="both verifications to fail",
    )
    assert any(r.startswith("CONNECT 127.0.0.1:9") for r in proxy.refused)
    assert any(r.startswith("POST http://") for r in proxy.refused)
    # The credentials travel as Proxy-Authorization, on the CONNECT too.
    assert set(proxy.credentials) == {f"Basic {BASIC}"}

    outputs: dict[str, str] = {}
    for i, received in enumerate(monitor.received):
        outputs[f"monitor's {i}: {received.envelope['type']}"] = received.body.decode()
    errors = {}
    async with open_api(h, "default") as api:
        for dest in (https, plain):
            _, _, page = await api.get(f"/v2/event-destinations/{dest['id']}/event-deliveries")
            outputs[f"API deliveries of {dest['name']}"] = json.dumps(page)
            _, _, one = await api.get(f"/v2/event-destinations/{dest['id']}")
            outputs[f"API destination {dest['name']}"] = json.dumps(one)
            [delivery] = page["data"]
            _, _, full = await api.get(f"/v2/event-deliveries/{delivery['id']}")
            outputs[f"API delivery of {dest['name']}"] = json.dumps(full)
            errors[dest["name"]] = [a["error"] for a in full["attempts"]]
            shown = await h.acli("deliveries", "show", delivery["id"])
            outputs[f"CLI show of {dest['name']}"] = shown.stdout + shown.stderr
            shown = await h.acli("deliveries", "show", delivery["id"], "--json")
            outputs[f"CLI show --json of {dest['name']}"] = shown.stdout

            console = Client(h)
            operator = (await h.acli("keys", "create", "--operator")).stdout.strip()
            assert await asyncio.to_thread(console.sign_in, operator) == 303
            status, text = await asyncio.to_thread(
                console.request, f"/console/deliveries/{delivery['id']}"
            )
            assert status == 200
            outputs[f"console page of {dest['name']}"] = text
            portal = Client(h)
            token = await asyncio.to_thread(h.portal_token, "default")
            await asyncio.to_thread(portal.request, f"/portal/?token={token}")
            status, text = await asyncio.to_thread(
                portal.request, f"/portal/deliveries/{delivery['id']}"
            )
            assert status == 200
            outputs[f"portal page of {dest['name']}"] = text
    rows = await asyncio.to_thread(h.query, "SELECT error, response_excerpt FROM herald_attempts")
    outputs["stored attempts"] = repr(rows)
    outputs["stored events"] = repr(await asyncio.to_thread(h.query, "SELECT * FROM herald_events"))
    outputs["stored destinations"] = repr(
        await asyncio.to_thread(h.query, "SELECT * FROM herald_destinations")
    )
    outputs["daemon log"] = h.log()

    found = {where: leaked(text) for where, text in outputs.items() if leaked(text)}
    assert found == {}, found
    assert errors["over https"] == ["egress proxy refused the request (403)"] * 2
    assert errors["over http"] == ["HTTP 403"] * 2
    assert "proxy refused" in outputs["console page of over https"]
