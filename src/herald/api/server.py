"""aiohttp's HTTP server, held to the API's rules at the connection level.

What aiohttp answers before any handler or middleware runs — a request line or
header its parser refuses, a handler's unexpected failure — is answered here in
the spec's ``errors`` shape with a ``request_id``, never echoing what the client
sent (an oversized header is usually ``Authorization: Bearer sk_live_…``).

Slow clients are bounded: a connection must send a complete request head within
``api.header_timeout_seconds`` of opening (or of its previous response: this is
also the keep-alive idle time), and a request's body within
``api.body_timeout_seconds`` of its head (:func:`read_body`, called by the API's
middleware). Past ``api.max_connections`` open connections, or
``api.max_connections_per_address`` from one client address (an IPv6 client's /64),
a new one is answered 503 and closed. Connections that have not yet sent their first
request head are capped lower, at ``api.max_headless_connections``: past it, the
oldest of them is closed to make room, so idle sockets cannot keep out a client that
sends its request at once. The ``Server`` header names no versions.

The probes (``/healthz``, ``/readyz``) also answer on ``metrics.listen``, a listener
with connections of its own: a flood of the API's port cannot take them down.
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, cast

import orjson
import structlog
from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, BadStatusLine, InvalidHeader, LineTooLong

from herald.api.errors import RequestTimeout, Unavailable, error_body
from herald.config import ApiSettings
from herald.errors import BadRequest, HeraldError
from herald.ids import new_id

log = structlog.get_logger("herald.api")

SERVER = "herald"
"""The ``Server`` header: no product versions for a scanner to match."""

LINGER_SECONDS = 2.0
"""How long an unread body is drained after the response before the connection closes."""


def _refused(exc: BaseException | None, status: int, max_field_size: int) -> HeraldError:
    """What the parser refused, in words that quote nothing the client sent."""
    if status >= 500:
        return HeraldError("internal error")
    if isinstance(exc, LineTooLong):
        return BadRequest(
            f"the request line or a header is longer than {max_field_size} bytes",
            code="header_too_large",
        )
    if isinstance(exc, InvalidHeader):
        return BadRequest("a header is malformed", code="header_invalid")
    if isinstance(exc, BadStatusLine):
        return BadRequest("the request line is malformed", code="request_line_invalid")
    if isinstance(exc, BadHttpMessage) and "Too many headers" in exc.message:
        return BadRequest("the request has too many headers", code="too_many_headers")
    return BadRequest("the request is not valid HTTP/1.1", code="invalid_http")


def _json_error(exc: HeraldError, status: int, request_id: str) -> web.Response:
    response = web.Response(
        body=orjson.dumps(error_body(exc, request_id, status)),
        status=status,
        content_type="application/json",
        headers={"X-Request-Id": request_id, "Server": SERVER},
    )
    response.force_close()
    return response


class _Protocol(web.RequestHandler):
    """One connection: aiohttp's, with refusals in the spec's shape and the caps."""

    def __init__(self, manager: _Server, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._server = manager
        self.address: str | None = None
        """The client's address (its /64 for IPv6) once the connection is admitted."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        server = self._server
        address = client_address(transport.get_extra_info("peername"))
        if len(server.connections) > server.max_connections:
            self._refuse(
                transport,
                f"more than {server.max_connections} connections are open",
                "max_connections",
            )
        elif server.by_address[address] >= server.max_per_address:
            self._refuse(
                transport,
                f"more than {server.max_per_address} connections are open from this address",
                "max_connections_per_address",
            )
        else:
            server.admitted(self, address)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._server.forget(self)
        super().connection_lost(exc)

    def _refuse(self, transport: asyncio.BaseTransport, why: str, reason: str) -> None:
        request_id = new_id("req_")
        body = orjson.dumps(error_body(Unavailable(why), request_id))
        head = (
            "HTTP/1.1 503 Service Unavailable\r\n"
            "Content-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n"
            f"X-Request-Id: {request_id}\r\nRetry-After: 1\r\n"
            f"Server: {SERVER}\r\nConnection: close\r\n\r\n"
        )
        # uvloop's transports are not asyncio.WriteTransport subclasses; aiohttp casts too.
        cast(asyncio.Transport, transport).write(head.encode() + body)
        self.force_close()
        self._server.logged("connection_refused", reason=reason, request_id=request_id)

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:
            raise ConnectionError("the response has started; it cannot become an error")
        request_id = new_id("req_")
        err = _refused(exc, status, self.max_field_size)
        if status >= 500:
            # A handler's failure, not the parser's: its traceback quotes no header.
            log.error("api_unhandled_error", request_id=request_id, exc_info=exc)
        else:
            log.info("http_request_refused", status=status, code=err.code, request_id=request_id)
        return _json_error(err, status, request_id)


def client_address(peername: Any) -> str:
    """What the per-address cap counts: the IPv4 address, or the IPv6 address's /64
    (one client usually holds a whole /64); ``""`` when the transport names no peer."""
    if not isinstance(peername, tuple) or not peername:
        return ""
    try:
        address = ipaddress.ip_address(peername[0])
    except ValueError:
        return str(peername[0])
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


class _Server(web.Server):
    def __init__(
        self,
        made: web.Server,
        *,
        settings: ApiSettings,
        handler_kwargs: dict[str, Any],
    ) -> None:
        self._make_request: Callable[..., web.BaseRequest] = made.request_factory
        super().__init__(
            made.request_handler,
            request_factory=self._headed,
            handler_cancellation=made.handler_cancellation,
            **handler_kwargs,
        )
        self.max_connections = settings.max_connections
        self.max_per_address = settings.max_connections_per_address
        self.max_headless = settings.max_headless_connections
        self.by_address: Counter[str] = Counter()
        self.headless: dict[_Protocol, None] = {}
        """Admitted connections that have sent no request head yet, oldest first."""
        self._logged: dict[str, float] = {}
        self._handler_kwargs = handler_kwargs

    def __call__(self) -> web.RequestHandler:
        return _Protocol(self, loop=asyncio.get_running_loop(), **self._handler_kwargs)

    def admitted(self, protocol: _Protocol, address: str) -> None:
        protocol.address = address
        self.by_address[address] += 1
        self.headless[protocol] = None
        if len(self.headless) > self.max_headless:
            oldest = next(iter(self.headless))
            del self.headless[oldest]
            oldest.force_close()  # it sent nothing: nothing to answer
            self.logged("connection_dropped", reason="max_headless_connections")

    def forget(self, protocol: _Protocol) -> None:
        self.headless.pop(protocol, None)
        address, protocol.address = protocol.address, None
        if address is not None:
            self.by_address[address] -= 1
            if self.by_address[address] <= 0:
                del self.by_address[address]

    def _headed(self, message: Any, payload: Any, protocol: Any, *args: Any) -> web.BaseRequest:
        """aiohttp's request factory, called once a request head has arrived whole."""
        self.headless.pop(protocol, None)
        return self._make_request(message, payload, protocol, *args)

    def logged(self, event: str, **fields: str) -> None:
        """A warning for a refused or dropped connection; a flood is a line a second."""
        now = time.monotonic()
        if now - self._logged.get(event, float("-inf")) >= 1.0:
            self._logged[event] = now
            log.warning(event, **fields)


class Runner(web.AppRunner):
    """``web.AppRunner`` whose connections follow ``api.*``'s timeouts and caps."""

    def __init__(self, app: web.Application, settings: ApiSettings) -> None:
        self._handler_kwargs: dict[str, Any] = {
            "keepalive_timeout": settings.header_timeout_seconds,
            "lingering_time": LINGER_SECONDS,
            "access_log": None,
        }
        super().__init__(app, handle_signals=False, **self._handler_kwargs)
        self._settings = settings
        app.on_response_prepare.append(_server_header)

    async def _make_server(self) -> web.Server:
        made = await super()._make_server()
        return _Server(made, settings=self._settings, handler_kwargs=self._handler_kwargs)


async def _server_header(request: web.Request, response: web.StreamResponse) -> None:
    response.headers["Server"] = SERVER


async def read_body(request: web.Request, timeout: float) -> None:
    """Read the body now (handlers then get it from memory), or RequestTimeout.

    A ``Content-Length`` larger than what arrives would otherwise hold the handler,
    and the connection, for as long as the client keeps it open."""
    if not request.can_read_body:
        return
    try:
        async with asyncio.timeout(timeout):
            await request.read()
    except TimeoutError:
        raise RequestTimeout(
            f"the body did not arrive within {timeout:g} s of the headers"
        ) from None
