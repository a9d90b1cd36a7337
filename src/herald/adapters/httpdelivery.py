"""The HTTP POST that the HTTP-based types (``webhook``, ``hookdeck``) deliver through.

:class:`HTTPAdapter` is their common base: its client sessions, its deadline
(``delivery.webhook_timeout_seconds``) and its per-destination prepared values;
a type only builds the URL, headers and body. Redirects are never
followed; a ``Retry-After`` on 429/503 is passed to the engine; the response
body is read up to 1 KiB and the connection is dropped rather than drained past
that. The status maps to an outcome the same way for every HTTP type: 2xx is
success, 3xx and the 4xx a retry cannot fix are permanent, the rest retryable.

Behind the operator's proxy (:class:`Proxy`) the credentials travel as
``Proxy-Authorization`` only, never in the URL aiohttp holds, and a proxy's own
failure reads as a fixed text that names no proxy: library messages quote the
proxy's URL, and an attempt's error is the tenant's to read.

Every POST notes what it sent (``note_exchange``): the method, the URL and the
headers, the values of the ones a type names as credentials masked, then the
headers as aiohttp sent them and the response's headers (bounded, ``Set-Cookie``
masked) once a response comes. The body is the event's envelope and is not noted.
"""

from __future__ import annotations

import base64
import time
from abc import abstractmethod
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from ssl import SSLContext
from types import SimpleNamespace
from typing import Any, Generic, NamedTuple, TypeVar

import aiohttp
import orjson
from yarl import URL

from herald import __version__
from herald.adapters.base import (
    MASK,
    Adapter,
    AdapterContext,
    PerDestination,
    Result,
    note_exchange,
    on_the_wire,
)
from herald.adapters.http1 import Client, ConnectFailed, ResponseFailed
from herald.egress import EgressPolicy, GuardedResolver, TargetCheck, check_url_host
from herald.errors import EgressDenied
from herald.model import Exchange, Headers
from herald.timeutil import parse_retry_after

__all__ = [
    "EXCERPT_BYTES",
    "RETRYABLE_4XX",
    "HTTPAdapter",
    "Proxy",
    "Route",
    "TargetCheck",
    "failure",
    "json_headers",
    "kept_headers",
    "new_session",
    "post",
    "post_direct",
    "read_body",
    "read_excerpt",
    "request",
    "status_result",
]

EXCERPT_BYTES = 1024
# Statuses a retry can plausibly fix on its own; other 4xx need a change at the receiver.
RETRYABLE_4XX = frozenset({408, 409, 423, 425, 429})

P = TypeVar("P")

KEPT_HEADERS = 32
"""Response headers an attempt's record keeps, at most (the rest are counted)."""
KEPT_HEADER_CHARS = 4096
"""Characters of the kept response headers, names and values, at most."""
KEPT_VALUE_CHARS = 256
"""A kept header value is cut at this many characters."""
MASKED_RESPONSE_HEADERS = frozenset({"set-cookie", "set-cookie2"})
"""A receiver's session cookie is a credential to the receiver."""
ALWAYS_MASKED = frozenset({"authorization", "proxy-authorization"})
"""Request headers whose values no record keeps, whoever set them: a bearer token
(OAuth2), the operator's proxy credentials on a plain-HTTP request."""


def kept_headers(
    headers: Iterable[tuple[str, str]], masked: Collection[str], *, limit: int | None = None
) -> tuple[Headers, int]:
    """``headers`` as a record keeps them: the values of ``masked`` (lower-case names)
    shown as the mask, each value cut at :data:`KEPT_VALUE_CHARS`; with ``limit`` at
    most that many, within :data:`KEPT_HEADER_CHARS`. Also how many were left out."""
    kept: list[tuple[str, str]] = []
    size = omitted = 0
    for full, value in headers:
        name = full[:64]
        if full.lower() in masked:
            value = MASK
        elif len(value) > KEPT_VALUE_CHARS:
            value = value[: KEPT_VALUE_CHARS - 1] + "…"
        size += len(name) + len(value)
        if limit is not None and (len(kept) >= limit or size > KEPT_HEADER_CHARS):
            omitted += 1
            continue
        kept.append((name, value))
    return tuple(kept), omitted


class Proxy(NamedTuple):
    """The operator's forward proxy: its URL without credentials, and those apart."""

    url: URL
    authorization: str | None
    """The ``Proxy-Authorization`` value (Basic), if the configured URL had credentials."""

    @classmethod
    def parse(cls, url: str) -> Proxy:
        """``http://user:password@host:port`` (percent-encoded) into its two halves."""
        parsed = URL(url)
        if parsed.user is None and parsed.password is None:
            return cls(parsed, None)
        plain = f"{parsed.user or ''}:{parsed.password or ''}".encode()
        return cls(parsed.with_user(None), f"Basic {base64.b64encode(plain).decode()}")

    def headers(
        self, url: str, headers: Mapping[str, str]
    ) -> tuple[Mapping[str, str], Mapping[str, str] | None]:
        """The request's headers and the ``CONNECT``'s for a POST to ``url``: the
        credentials go to the proxy only, never through an https tunnel to the target."""
        if self.authorization is None:
            return headers, None
        auth = {"Proxy-Authorization": self.authorization}
        if url[:6].lower() == "https:":
            return headers, auth
        return {**headers, **auth}, None


def json_headers() -> dict[str, str]:
    """The headers every HTTP type sends with the JSON envelope."""
    return {"content-type": "application/json", "user-agent": f"Herald/{__version__}"}


def new_session(
    egress: EgressPolicy,
    *,
    limit: int,
    connect_timeout: float,
    local_address: str | None = None,
    guarded: bool = True,
) -> aiohttp.ClientSession:
    """A client session that connects only where ``egress`` permits (create it inside the loop).

    ``local_address`` binds outgoing connections to that source address.
    ``guarded=False`` is for a session that only ever connects to an operator's
    proxy: the proxy may well be private; the targets are checked by ``post``.
    """
    connector = aiohttp.TCPConnector(
        resolver=GuardedResolver(egress) if guarded else None,
        limit=limit,
        limit_per_host=0,
        ttl_dns_cache=10,
        enable_cleanup_closed=True,
        local_addr=(local_address, 0) if local_address else None,
    )
    # A paced request (post) waits for its turn once its connection is ready.
    trace = aiohttp.TraceConfig()
    trace.on_connection_create_end.append(_connection_ready)
    trace.on_connection_reuseconn.append(_connection_ready)
    return aiohttp.ClientSession(
        connector=connector,
        trace_configs=[trace],
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout),
        skip_auto_headers=("User-Agent",),
        json_serialize=lambda obj: orjson.dumps(obj).decode(),
        trust_env=False,
    )


PACED = "paced"
"""The ``trace_request_ctx`` of a request that takes a turn of its destination's pacing."""


async def _connection_ready(
    session: aiohttp.ClientSession, ctx: SimpleNamespace, params: object
) -> None:
    if ctx.trace_request_ctx is PACED:
        await on_the_wire()


class Route(NamedTuple):
    """How a request goes out through aiohttp: the session, the egress policy it is
    held to, and the operator's proxy, behind which the resolver never sees the
    target, so ``targets`` checks it."""

    session: aiohttp.ClientSession
    egress: EgressPolicy
    proxy: Proxy | None = None
    targets: TargetCheck | None = None


@asynccontextmanager
async def request(
    route: Route,
    url: str,
    *,
    body: bytes,
    headers: Mapping[str, str],
    ssl: SSLContext | None = None,
    paced: bool = False,
) -> AsyncIterator[aiohttp.ClientResponse]:
    """POST ``body`` once along ``route`` and yield the response; the errors are
    the library's (:func:`failure` reads them). ``ssl`` is the destination's own TLS
    (a client certificate, a CA of its own); the connector keys its pool on it.
    ``paced``: the request waits for the attempt's turn (``on_the_wire``) once its
    connection is ready (a request to the receiver; not a token request).
    """
    check_url_host(url, route.egress)
    proxy = route.proxy
    if proxy is not None and route.targets is not None:
        await route.targets.check(url)
    proxy_headers = None
    if proxy is not None:
        headers, proxy_headers = proxy.headers(url, headers)
    async with route.session.post(
        url,
        data=body,
        headers=headers,
        allow_redirects=False,
        proxy=proxy.url if proxy else None,
        proxy_headers=proxy_headers,
        ssl=ssl if ssl is not None else True,
        trace_request_ctx=PACED if paced else None,
    ) as resp:
        yield resp


def failure(exc: Exception) -> Result | None:
    """The result of a :func:`request` that raised ``exc``, or None if it is no
    failure of the request (a bug, re-raised by the caller)."""
    if isinstance(exc, EgressDenied):
        return Result.permanent(exc.message)
    if isinstance(exc, aiohttp.ClientHttpProxyError):  # the proxy refused the CONNECT
        return Result.retryable(f"egress proxy refused the request ({exc.status})")
    if isinstance(exc, aiohttp.ClientProxyConnectionError):
        return Result.retryable("connection failed: egress proxy unreachable")
    if isinstance(exc, aiohttp.ClientConnectorError):
        if isinstance(exc.os_error, EgressDenied):
            return Result.permanent(exc.os_error.message)
        return Result.retryable(f"connection failed: {exc.os_error or exc}")
    if isinstance(exc, aiohttp.ClientError):
        return Result.retryable(f"{type(exc).__name__}: {exc}")
    return None


async def post(
    route: Route,
    url: str,
    *,
    body: bytes,
    headers: Mapping[str, str],
    ssl: SSLContext | None = None,
    masked: Collection[str] = (),
) -> Result:
    """POST ``body`` once (:func:`request`) and turn the response (or the failure) into
    a typed Result. ``masked``: the (lower-case) names of headers whose values are
    credentials, never noted (``Authorization`` and ``Proxy-Authorization`` always are).
    """
    hidden = ALWAYS_MASKED.union(masked)
    sent, _ = kept_headers(headers.items(), hidden)
    # Noted before the request: a timeout cancels the attempt, and what was sent stays.
    note_exchange(Exchange("POST", url, sent))
    try:
        async with request(route, url, body=body, headers=headers, ssl=ssl, paced=True) as resp:
            # The headers as aiohttp sent them (Host, Content-Length and its own added).
            sent, _ = kept_headers(resp.request_info.headers.items(), hidden)
            answered, omitted = kept_headers(
                resp.headers.items(), MASKED_RESPONSE_HEADERS, limit=KEPT_HEADERS
            )
            note_exchange(Exchange("POST", url, sent, answered, omitted))
            excerpt = await read_excerpt(resp)
            return status_result(resp.status, excerpt=excerpt, header=resp.headers.get)
    except (EgressDenied, aiohttp.ClientError) as exc:
        failed = failure(exc)
        assert failed is not None
        return failed


async def post_direct(
    client: Client,
    url: str,
    *,
    body: bytes,
    headers: Mapping[str, str],
    egress: EgressPolicy,
    ssl: SSLContext | None = None,
    masked: Collection[str] = (),
) -> Result:
    """:func:`post` without a proxy, on the lean client (:mod:`herald.adapters.http1`):
    the same checks, the same notes, the same outcomes."""
    hidden = ALWAYS_MASKED.union(masked)
    outgoing = client.request(url, body=body, headers=headers, tls=ssl)
    sent, _ = kept_headers(outgoing.sent, hidden)
    # Noted before the request: a timeout cancels the attempt, and what was sent stays.
    note_exchange(Exchange("POST", url, sent))
    try:
        check_url_host(url, egress)
        answer = await client.send(outgoing, limit=EXCERPT_BYTES, ready=on_the_wire)
    except EgressDenied as exc:
        return Result.permanent(exc.message)
    except ConnectFailed as exc:
        if isinstance(exc.os_error, EgressDenied):
            return Result.permanent(exc.os_error.message)
        return Result.retryable(f"connection failed: {exc.os_error}")
    except ResponseFailed as exc:
        return Result.retryable(str(exc))
    answered, omitted = kept_headers(answer.headers, MASKED_RESPONSE_HEADERS, limit=KEPT_HEADERS)
    note_exchange(Exchange("POST", url, sent, answered, omitted))
    excerpt = answer.body.decode("utf-8", "replace") if answer.body else None
    return status_result(answer.status, excerpt=excerpt, header=answer.header)


def status_result(
    status: int, *, excerpt: str | None, header: Callable[[str], str | None]
) -> Result:
    """The outcome of an HTTP answer, the same for every HTTP type and client;
    ``header`` reads one of its headers (``Retry-After``, of a 429 or a 503)."""
    if 200 <= status < 300:
        return Result.success(status=status, excerpt=excerpt)
    retry_after = None
    if status in (429, 503) and (value := header("Retry-After")):
        retry_after = parse_retry_after(value, now=time.time())
    error = f"HTTP {status}"
    if 300 <= status < 400:
        return Result.permanent(
            f"{error}: redirects are not followed", status=status, excerpt=excerpt
        )
    if 400 <= status < 500 and status not in RETRYABLE_4XX:
        return Result.permanent(error, status=status, excerpt=excerpt)
    return Result.retryable(error, status=status, excerpt=excerpt, retry_after=retry_after)


async def read_excerpt(resp: aiohttp.ClientResponse) -> str | None:
    """The first KiB of the body; the rest is never read (a hostile body can be endless)."""
    buf = await read_body(resp, EXCERPT_BYTES)
    if not buf:
        return None
    return buf.decode("utf-8", "replace")


async def read_body(resp: aiohttp.ClientResponse, limit: int) -> bytes:
    """The body's first ``limit`` bytes, never more."""
    buf = b""
    while len(buf) < limit:
        chunk = await resp.content.read(limit - len(buf))
        if not chunk:
            break
        buf += chunk
    return buf


class HTTPAdapter(Adapter, Generic[P]):
    """A type that delivers by one HTTP POST; ``P`` is what it prepares per destination."""

    resolves_through_guard = True  # the sessions' resolver; behind a proxy, post() checks
    paces_on_the_wire = True  # post(): once the connection is ready

    def __init__(self, ctx: AdapterContext) -> None:
        super().__init__(ctx)
        self._sessions: list[aiohttp.ClientSession] = []
        self._clients: list[Client] = []
        self._session_turn = self._client_turn = 0
        """Which source address the next session (or client) request goes from."""
        self.prepared: PerDestination[P] = PerDestination(self.prepare, expires=self.expires)

    @property
    def timeout(self) -> float:
        return self.ctx.settings.delivery.webhook_timeout_seconds

    @property
    def proxy(self) -> Proxy | None:
        """The operator's HTTP proxy every POST goes through, if any."""
        return None

    def source_addresses(self) -> Sequence[str | None]:
        """Local addresses to send from, taken in turn (None: the system's choice)."""
        return (None,)

    @abstractmethod
    def prepare(self, dest: Any, config: Any) -> P:
        """What every attempt for ``dest`` needs from its config, derived once."""

    def expires(self, prepared: P) -> float:
        """When ``prepared`` must be derived afresh even if the destination is unchanged."""
        return float("inf")

    def session(self) -> aiohttp.ClientSession:
        """A shared client session, created on first use inside the running loop.

        With several source addresses there is one session per address and
        requests take them in turn (fixed egress for allow-lists).
        """
        if not self._sessions:
            settings = self.ctx.settings.delivery
            self._sessions = [
                new_session(
                    self.ctx.egress,
                    limit=settings.max_concurrency,
                    connect_timeout=settings.webhook_timeout_seconds,
                    local_address=address,
                    guarded=self.proxy is None,
                )
                for address in self.source_addresses()
            ]
        self._session_turn = (self._session_turn + 1) % len(self._sessions)
        return self._sessions[self._session_turn]

    def client(self) -> Client:
        """A lean client (:mod:`herald.adapters.http1`) for the POSTs that go direct,
        one per source address, taken in turn like the sessions."""
        if not self._clients:
            self._clients = [
                Client(
                    GuardedResolver(self.ctx.egress),
                    connect_timeout=self.ctx.settings.delivery.webhook_timeout_seconds,
                    local_address=address,
                )
                for address in self.source_addresses()
            ]
        self._client_turn = (self._client_turn + 1) % len(self._clients)
        return self._clients[self._client_turn]

    async def send(
        self,
        url: str,
        *,
        body: bytes,
        headers: Mapping[str, str],
        ssl: SSLContext | None = None,
        masked: Collection[str] = (),
    ) -> Result:
        """POST ``body`` to ``url`` once; the response (or failure) as a Result.
        ``masked``: lower-case names of the headers that carry credentials. Direct
        POSTs take the lean client; through the operator's proxy, aiohttp."""
        if self.proxy is None:
            return await post_direct(
                self.client(),
                url,
                body=body,
                headers=headers,
                egress=self.ctx.egress,
                ssl=ssl,
                masked=masked,
            )
        return await post(self.route(), url, body=body, headers=headers, ssl=ssl, masked=masked)

    def route(self) -> Route:
        """Through aiohttp: the next session, held to the egress policy, through the
        operator's proxy if there is one."""
        return Route(self.session(), self.ctx.egress, self.proxy, self._dial_checks)

    async def forget(self, dest_id: str) -> None:
        self.prepared.forget(dest_id)

    async def close(self) -> None:
        clients, self._clients = self._clients, []
        for client in clients:
            await client.close()
        sessions, self._sessions = self._sessions, []
        for session in sessions:
            await session.close()
