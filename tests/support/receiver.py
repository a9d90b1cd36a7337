"""A real aiohttp webhook receiver on 127.0.0.1 that checks every request.

Each request is verified with the independent ``standardwebhooks`` library
when the receiver knows the secret; what it answers is decided per request by
a behaviour function, so one receiver can fail verification pings, time out,
or answer 500 for a while and then recover.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from standardwebhooks.webhooks import Webhook


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    envelope: dict[str, Any]
    at: float
    verified: bool
    remote: str | None = None
    """The address the request came from."""

    @property
    def event_id(self) -> str:
        return str(self.envelope["id"])

    @property
    def type(self) -> str:
        return str(self.envelope["type"])


Behaviour = Callable[["Received"], Awaitable[web.StreamResponse] | web.StreamResponse]


def ok(_: Received) -> web.StreamResponse:
    return web.Response(status=204)


@dataclass
class Receiver:
    secrets: list[str] = field(default_factory=list)
    behaviour: Behaviour = ok
    received: list[Received] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    port: int = 0
    _runner: web.AppRunner | None = None
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    async def start(self, port: int = 0) -> Receiver:
        app = web.Application()
        app.router.add_post("/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k.lower(): v for k, v in request.headers.items()}
        verified = False
        if self.secrets:
            # The receiver accepts a request signed by any secret it knows,
            # exactly as a receiver does during a rotation window.
            for secret in self.secrets:
                try:
                    Webhook(secret).verify(body, headers)
                    verified = True
                    break
                except Exception:
                    continue
            if not verified:
                self.errors.append(f"bad signature on {headers.get('webhook-id')}")
        try:
            envelope = json.loads(body)
        except ValueError:
            self.errors.append(f"body is not JSON: {body[:80]!r}")
            envelope = {}
        item = Received(
            request.path, headers, body, envelope, time.time(), verified, request.remote
        )
        self.received.append(item)
        self._arrived.set()
        result = self.behaviour(item)
        if not isinstance(result, web.StreamResponse):
            result = await result
        assert isinstance(result, web.StreamResponse)
        return result

    def events(self, type_: str | None = None) -> list[Received]:
        return [r for r in self.received if type_ is None or r.type == type_]

    def counts(self, type_: str | None = None) -> Counter[str]:
        return Counter(r.event_id for r in self.events(type_))

    async def wait_for(
        self, predicate: Callable[[], bool], *, timeout: float = 30.0, what: str = "condition"
    ) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"timed out after {timeout} s waiting for {what}")
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), timeout=min(remaining, 0.2))


def verification_ok_then(behaviour: Behaviour) -> Behaviour:
    """Answer verification pings with 204 and everything else with ``behaviour``."""

    def decide(item: Received) -> Awaitable[web.StreamResponse] | web.StreamResponse:
        if item.type == "destination.verification":
            return web.Response(status=204)
        return behaviour(item)

    return decide
