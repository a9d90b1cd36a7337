"""HTTP/1.1 POSTs on pooled keep-alive connections: the HTTP types' request path.

An HTTP type's attempt is always the same exchange: one POST with its body in memory,
the status and headers of the answer, at most a KiB of its body. aiohttp's client
spends about a hundred microseconds of CPU on each such request, most of it on
machinery this exchange never uses (payload registries, traces, cookie jars, a
stream per response). :class:`Client` writes the request in one write, parses the
answer with httptools (the llhttp parser that uvloop's authors maintain) and keeps
the connection for the next request when the receiver allows.

What it keeps of aiohttp's behaviour: addresses come from the same resolver (the
egress guard, :class:`herald.egress.GuardedResolver`; an IP literal is not resolved,
as aiohttp does not), cached 10 s; connections are made with aiohappyeyeballs as
aiohttp makes them; an idle connection is closed after 15 s; a TLS connection checks
the certificate with the default context unless the destination brings its own; the
connection of a body longer than the caller reads is closed rather than drained.
Concurrency is the dispatcher's to bound (its slots), not this pool's.

The operator's proxy is aiohttp's business (``httpdelivery.request``): this client
connects directly only.
"""

from __future__ import annotations

import asyncio
import re
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import cast

import aiohappyeyeballs
import httptools
from aiohttp.abc import AbstractResolver
from yarl import URL

__all__ = [
    "Answer",
    "Client",
    "ConnectFailed",
    "Request",
    "ResponseFailed",
]

IDLE_SECONDS = 15.0
"""An idle connection older than this is closed, not reused (aiohttp's keep-alive)."""
DNS_TTL_SECONDS = 10.0
"""How long a resolved host's addresses are reused."""
HAPPY_EYEBALLS_DELAY = 0.25
MAX_HEAD_BYTES = 65536
"""Bytes of a response's status line and headers, at most."""
MAX_HEADERS = 128
"""Response headers, at most."""
_DEFAULT_PORTS = {"http": 80, "https": 443}


class ConnectFailed(Exception):
    """No connection to the receiver: ``os_error`` says why (a refusal, a DNS failure,
    a TLS handshake's, the egress guard's :class:`herald.errors.EgressDenied`)."""

    def __init__(self, os_error: BaseException) -> None:
        super().__init__(str(os_error))
        self.os_error = os_error


class ResponseFailed(Exception):
    """The connection was made but no well-formed answer came back on it."""


_Key = tuple[str, int, ssl.SSLContext | None]
"""A pool of connections: host, port, TLS context (None: plain HTTP)."""


@dataclass(frozen=True, slots=True)
class Request:
    """A POST ready to be written (:meth:`Client.request`)."""

    key: _Key
    sent: tuple[tuple[str, str], ...]
    """Its headers as they go out (``Host`` and ``Content-Length`` included)."""
    data: bytes


@dataclass(frozen=True, slots=True)
class Answer:
    """A response: its status, its headers as received, the first bytes of its body."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (any case), if any."""
        lower = name.lower()
        for key, value in self.headers:
            if key.lower() == lower:
                return value
        return None


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


class _Connection(asyncio.Protocol):
    """One keep-alive connection and the answer it is reading."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle_since = 0.0
        self._waiter: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._limit = 0
        self._status = 0
        self._headers: list[tuple[str, str]] = []
        self._body = bytearray()
        self._head_bytes = 0
        self._head_size = 0
        self._headers_done = False
        self._complete = False
        self._keep_alive = False
        self._truncated = False

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        # Kept for every request on this connection: on Python 3.11 each
        # asyncio.get_running_loop() is a getpid() system call.
        self._loop = asyncio.get_running_loop()

    def data_received(self, data: bytes) -> None:
        if self._waiter is None:  # nothing asked: a receiver talking out of turn
            self.close()
            return
        if not self._headers_done:
            self._head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(ResponseFailed("the receiver switched protocols"))
            return
        except httptools.HttpParserError as exc:
            cause = exc.__context__
            if not isinstance(cause, ResponseFailed):
                cause = ResponseFailed(f"malformed response: {exc}")
            self._fail(cause)
            return
        if not self._headers_done and self._head_bytes > MAX_HEAD_BYTES:
            self._fail(ResponseFailed(f"response headers over {MAX_HEAD_BYTES} bytes"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._waiter is None or self._waiter.done():
            return
        if self._headers_done:
            # A body that ends with the connection (no length): what came is all of it.
            self._complete = True
            self._done()
        else:
            self._fail(ResponseFailed("server disconnected without an answer"))

    # -- httptools callbacks
    def on_message_begin(self) -> None:
        self._status = 0
        self._head_size = 0
        self._headers = []
        self._body = bytearray()
        self._headers_done = False

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(self._headers) >= MAX_HEADERS:
            raise ResponseFailed(f"more than {MAX_HEADERS} response headers")
        # Within one read the head can complete before data_received counts it.
        self._head_size += len(name) + len(value) + 4
        if self._head_size > MAX_HEAD_BYTES:
            raise ResponseFailed(f"response headers over {MAX_HEAD_BYTES} bytes")
        self._headers.append((_text(name), _text(value)))

    def on_headers_complete(self) -> None:
        self._status = self.parser.get_status_code()
        if self._status >= 200:
            self._headers_done = True

    def on_body(self, body: bytes) -> None:
        room = self._limit - len(self._body)
        if len(body) > room:
            self._body += body[:room]
            self._truncated = True
            self._done()  # the rest is never read: the connection goes
        else:
            self._body += body

    def on_message_complete(self) -> None:
        if not self._headers_done:
            return  # an interim (1xx) answer: the real one follows
        # Asked here: once the parser returns, it may have moved on (a chunked answer).
        self._keep_alive = self.parser.should_keep_alive()
        self._complete = True
        self._done()

    # -- the exchange
    def begin(self, request: bytes, limit: int) -> asyncio.Future[None]:
        """Write ``request``; the future is done once the answer is read (or failed)."""
        assert self.transport is not None
        assert self._loop is not None  # both set by connection_made
        self._waiter = self._loop.create_future()
        if self.closed:
            self._waiter.set_exception(ResponseFailed("server disconnected without an answer"))
            return self._waiter
        self._limit = limit
        self._head_bytes = 0
        self._headers_done = self._complete = self._keep_alive = self._truncated = False
        self.transport.write(request)
        return self._waiter

    def answer(self) -> Answer:
        self._waiter = None
        return Answer(self._status, tuple(self._headers), bytes(self._body))

    @property
    def reusable(self) -> bool:
        """The answer was read whole and the receiver keeps the connection open."""
        return self._complete and self._keep_alive and not self._truncated and not self.closed

    def _done(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _fail(self, exc: Exception) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)
        self.close()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class Client:
    """POSTs over keep-alive connections to the addresses ``resolver`` permits."""

    def __init__(
        self,
        resolver: AbstractResolver,
        *,
        connect_timeout: float,
        local_address: str | None = None,
    ) -> None:
        self._resolver = resolver
        self._connect_timeout = connect_timeout
        self._local = (
            aiohappyeyeballs.addr_to_addr_infos((local_address, 0)) if local_address else None
        )
        self._idle: dict[_Key, list[_Connection]] = {}
        self._addresses: dict[tuple[str, int], tuple[float, list[aiohappyeyeballs.AddrInfoType]]]
        self._addresses = {}
        self._default_tls: ssl.SSLContext | None = None
        self._closed = False
        self._sweep_at = 0.0

    def request(
        self,
        url: str,
        *,
        body: bytes,
        headers: Mapping[str, str],
        tls: ssl.SSLContext | None = None,
    ) -> Request:
        """The POST of ``body`` to ``url`` as it will go out (``ValueError`` for what
        cannot go on the wire). ``tls``: the destination's own context for an https
        URL (a client certificate, a CA of its own); the pool keys its connections on it.
        """
        target = URL(url)
        scheme, host = target.scheme, target.raw_host
        if scheme not in _DEFAULT_PORTS or not host:
            raise ValueError(f"not an http(s) URL: {url[:100]!r}")
        port = target.port or _DEFAULT_PORTS[scheme]
        context = (tls or self._tls()) if scheme == "https" else None
        sent = (
            ("Host", target.host_port_subcomponent or host),
            *headers.items(),
            ("Content-Length", str(len(body))),
        )
        data = _request_bytes(target.raw_path_qs or "/", sent, body)
        return Request((host, port, context), sent, data)

    async def send(
        self,
        request: Request,
        *,
        limit: int,
        ready: Callable[[], Awaitable[None]] | None = None,
    ) -> Answer:
        """Send ``request`` once and read the answer's first ``limit`` body bytes.

        ``ready`` is awaited once the connection is ready, just before the request is
        written (the attempt's turn). Raises :class:`ConnectFailed` or
        :class:`ResponseFailed`.
        """
        key = request.key
        conn = self._reused(key) or await self._connect(*key)
        try:
            if ready is not None:
                await ready()
                if conn.closed:  # the receiver closed it while we waited for our turn
                    conn = await self._connect(*key)
            await conn.begin(request.data, limit)
        except BaseException:
            conn.close()  # a timeout or a failure: never reused mid-answer
            raise
        answer = conn.answer()
        now = time.monotonic()
        if conn.reusable and not self._closed:
            conn.idle_since = now
            self._idle.setdefault(key, []).append(conn)
        else:
            conn.close()
        if now >= self._sweep_at:
            self._sweep(now)
        return answer

    def _sweep(self, now: float) -> None:
        """Close the idle connections past :data:`IDLE_SECONDS` and forget the pools
        left empty: a destination that is not sent to again keeps no socket."""
        self._sweep_at = now + IDLE_SECONDS
        for key in list(self._idle):
            idle = self._idle[key]
            kept = [c for c in idle if not c.closed and now - c.idle_since < IDLE_SECONDS]
            for conn in idle:
                if conn not in kept:
                    conn.close()
            if kept:
                self._idle[key] = kept
            else:
                del self._idle[key]
        stale = [k for k, (until, _) in self._addresses.items() if until <= now]
        for k in stale:
            del self._addresses[k]

    def _tls(self) -> ssl.SSLContext:
        if self._default_tls is None:
            self._default_tls = ssl.create_default_context()
        return self._default_tls

    def _reused(self, key: _Key) -> _Connection | None:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < IDLE_SECONDS:
                return conn
            conn.close()
        return None

    async def _connect(self, host: str, port: int, context: ssl.SSLContext | None) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout):
                infos = await self._resolve(host, port)
                sock = await aiohappyeyeballs.start_connection(
                    infos, local_addr_infos=self._local, happy_eyeballs_delay=HAPPY_EYEBALLS_DELAY
                )
                try:
                    # One write per request: no reason to wait for the last one's ACK.
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    _, conn = await loop.create_connection(
                        _Connection,
                        sock=sock,
                        ssl=context,
                        server_hostname=host.rstrip(".") if context is not None else None,
                    )
                except BaseException:
                    sock.close()
                    raise
        except TimeoutError as exc:  # this timeout's own: the attempt's deadline cancels
            late = TimeoutError(f"connect timed out after {self._connect_timeout:g} s")
            raise ConnectFailed(late) from exc
        except OSError as exc:
            raise ConnectFailed(exc) from exc
        return conn

    async def _resolve(self, host: str, port: int) -> list[aiohappyeyeballs.AddrInfoType]:
        """The addresses to try, as aiohttp would: an IP literal as it is, a name through
        the resolver (the egress guard), cached for :data:`DNS_TTL_SECONDS`."""
        literal = _literal(host)
        if literal is not None:
            return [_addr_info(literal, port)]
        now = time.monotonic()
        cached = self._addresses.get((host, port))
        if cached is not None and cached[0] > now:
            return cached[1]
        results = await self._resolver.resolve(host, port, family=socket.AF_UNSPEC)
        infos = [_addr_info(r["host"], r["port"]) for r in results]
        if not infos:
            raise OSError(f"no address for {host}")
        self._addresses[(host, port)] = (now + DNS_TTL_SECONDS, infos)
        return infos

    async def close(self) -> None:
        """Close every idle connection; those in use close when their answer is read."""
        self._closed = True
        idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.close()


_BAD_VALUE = re.compile(r"[\r\n\x00]")
_BAD_NAME = re.compile(r"[\x00-\x20:\x7f]|^$")


def _request_bytes(target: str, headers: tuple[tuple[str, str], ...], body: bytes) -> bytes:
    """The request's head and body, as one write."""
    if _BAD_VALUE.search(target) or " " in target:
        raise ValueError(f"request target {target[:100]!r} cannot go on the wire")
    lines = [f"POST {target} HTTP/1.1"]
    for name, value in headers:
        if _BAD_VALUE.search(value):
            raise ValueError(f"header {name[:64]!r} holds a line break or NUL")
        if _BAD_NAME.search(name):
            raise ValueError(f"{name[:64]!r} is not a header name")
        lines.append(f"{name}: {value}")
    lines.append("\r\n")
    return "\r\n".join(lines).encode("utf-8") + body


def _literal(host: str) -> str | None:
    """``host`` as an address if it is an IP literal (brackets of IPv6 taken off)."""
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, bare)
        except OSError:
            continue
        return bare
    return None


def _addr_info(address: str, port: int) -> aiohappyeyeballs.AddrInfoType:
    if ":" in address:
        return (socket.AF_INET6, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, port, 0, 0))
    return (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, port))
