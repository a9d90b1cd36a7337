"""A real aiohttp webhook receiver on 127.0.0.1 that checks every request.

Each request is verified with the independent ``standardwebhooks`` library
when the receiver knows the secret; what it answers is decided per request by
a behaviour function, so one receiver can fail verification pings, time out,
or answer 500 for a while and then recover.

:meth:`Receiver.for_gateway` makes it a stand-in for the event gateway's ingest
URL instead: it knows the source tokens it accepts and checks every request the
way the gateway's source authentication does, independently of Herald's code —
the path names a known source (else 404), ``X-Hookdeck-Signature`` is ``v0=`` +
base64 HMAC-SHA256 of the raw body keyed with that source's whole token (else
401), and the body is the envelope with the metadata headers matching it (else
400). Refused requests are listed in ``rejected``, never in ``received``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
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

    @property
    def source_id(self) -> str:
        """The gateway source the request was posted to (the path, for a gateway)."""
        return self.path.removeprefix("/")


Behaviour = Callable[["Received"], Awaitable[web.StreamResponse] | web.StreamResponse]


def ok(_: Received) -> web.StreamResponse:
    return web.Response(status=204)


def gateway_accepted(_: Received) -> web.StreamResponse:
    return web.json_response({"status": "SUCCESS", "message": "Request handled"})


def token_for(source_id: str, secret: str = "s3cr3t-signing-key") -> str:
    """A gateway source token: base64 of ``id:secret``."""
    return base64.b64encode(f"{source_id}:{secret}".encode()).decode()


@dataclass
class Receiver:
    secrets: list[str] = field(default_factory=list)
    behaviour: Behaviour = ok
    received: list[Received] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    port: int = 0
    gateway: bool = False
    """Check requests as the event gateway does (see the module docstring)."""
    tokens: dict[str, str] = field(default_factory=dict)
    """Gateway: source id → the token its requests must be signed with."""
    rejected: list[str] = field(default_factory=list)
    """Gateway: the requests it refused, and why."""
    _runner: web.AppRunner | None = None
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)

    @classmethod
    def for_gateway(cls) -> Receiver:
        return cls(gateway=True, behaviour=gateway_accepted)

    @property
    def base_url(self) -> str:
        """The server's root (a gateway's ``endpoint_url``)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.base_url}/hook"

    def add_source(self, source_id: str, secret: str = "s3cr3t-signing-key") -> str:
        """Make the gateway accept ``source_id``; its token."""
        token = token_for(source_id, secret)
        self.tokens[source_id] = token
        return token

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
        if self.gateway and (refusal := self._refuse(request.path, headers, body)) is not None:
            status, reason = refusal
            self.rejected.append(reason)
            return web.json_response({"message": reason}, status=status)
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

    def _refuse(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, str] | None:
        """(status, reason) if the gateway refuses the request, else None."""
        source_id = path.removeprefix("/")
        token = self.tokens.get(source_id)
        if token is None:
            return 404, f"unknown source {source_id}"
        digest = hmac.new(token.encode(), body, hashlib.sha256).digest()
        expected = "v0=" + base64.b64encode(digest).decode()
        if not hmac.compare_digest(headers.get("x-hookdeck-signature", ""), expected):
            return 401, f"bad signature for {source_id}"
        try:
            envelope = json.loads(body)
        except ValueError:
            return 400, "body is not JSON"
        problems = _gateway_header_problems(headers, envelope)
        return (400, "; ".join(problems)) if problems else None

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


def _gateway_header_problems(headers: dict[str, str], envelope: dict[str, Any]) -> list[str]:
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
