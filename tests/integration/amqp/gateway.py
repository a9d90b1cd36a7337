"""A stand-in for the event gateway's ingest URL: an aiohttp server on 127.0.0.1.

It knows the source tokens it accepts, and checks every request the way the
gateway's source authentication does, independently of Herald's code: the path
names a known source (else 404), ``X-Hookdeck-Signature`` is ``v0=`` + base64
HMAC-SHA256 of the raw body keyed with that source's whole token (else 401),
and the body is the envelope with the metadata headers matching it (else 400).
What it answers to an accepted request is decided per request by ``behaviour``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

METADATA = ("event-id", "event-type", "event-created-at", "tenant-id")


def token_for(source_id: str, secret: str = "s3cr3t-signing-key") -> str:
    """A gateway source token: base64 of ``id:secret``."""
    return base64.b64encode(f"{source_id}:{secret}".encode()).decode()


@dataclass
class GatewayRequest:
    source_id: str
    headers: dict[str, str]
    body: bytes
    envelope: dict[str, Any]
    at: float

    @property
    def event_id(self) -> str:
        return str(self.envelope["id"])

    @property
    def type(self) -> str:
        return str(self.envelope["type"])


Answer = Callable[[GatewayRequest], Awaitable[web.StreamResponse] | web.StreamResponse]


def accepted(_: GatewayRequest) -> web.StreamResponse:
    return web.json_response({"status": "SUCCESS", "message": "Request handled"})


@dataclass
class Gateway:
    tokens: dict[str, str] = field(default_factory=dict)
    """Source id → the token its requests must be signed with."""
    behaviour: Answer = accepted
    received: list[GatewayRequest] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    port: int = 0
    _runner: web.AppRunner | None = None
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def url(self) -> str:
        """The base URL Herald is given as ``endpoint_url``."""
        return f"http://127.0.0.1:{self.port}"

    def add_source(self, source_id: str, secret: str = "s3cr3t-signing-key") -> str:
        token = token_for(source_id, secret)
        self.tokens[source_id] = token
        return token

    async def start(self) -> Gateway:
        app = web.Application()
        app.router.add_post("/{source_id}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
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
        source_id = request.match_info["source_id"]
        body = await request.read()
        headers = {k.lower(): v for k, v in request.headers.items()}
        token = self.tokens.get(source_id)
        if token is None:
            self.rejected.append(f"unknown source {source_id}")
            return web.json_response({"message": "Source not found"}, status=404)
        expected = (
            "v0="
            + base64.b64encode(hmac.new(token.encode(), body, hashlib.sha256).digest()).decode()
        )
        if not hmac.compare_digest(headers.get("x-hookdeck-signature", ""), expected):
            self.rejected.append(f"bad signature for {source_id}")
            return web.json_response({"message": "Invalid signature"}, status=401)
        try:
            envelope = json.loads(body)
        except ValueError:
            self.rejected.append("body is not JSON")
            return web.json_response({"message": "Invalid body"}, status=400)
        problems = self._check_headers(headers, envelope)
        if problems:
            self.rejected.append("; ".join(problems))
            return web.json_response({"message": "; ".join(problems)}, status=400)
        item = GatewayRequest(source_id, headers, body, envelope, time.time())
        self.received.append(item)
        self._arrived.set()
        answer = self.behaviour(item)
        if not isinstance(answer, web.StreamResponse):
            answer = await answer
        return answer

    @staticmethod
    def _check_headers(headers: dict[str, str], envelope: dict[str, Any]) -> list[str]:
        problems = []
        if headers.get("content-type") != "application/json":
            problems.append(f"content-type is {headers.get('content-type')!r}")
        wanted = {
            "event-id": envelope.get("id"),
            "event-type": envelope.get("type"),
            "event-created-at": envelope.get("created_at"),
        }
        for name, value in wanted.items():
            if headers.get(name) != value:
                problems.append(f"{name} is {headers.get(name)!r}, expected {value!r}")
        if not headers.get("tenant-id"):
            problems.append("tenant-id header missing")
        return problems

    def events(self, type_: str | None = None) -> list[GatewayRequest]:
        return [r for r in self.received if type_ is None or r.type == type_]

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
