"""The one middleware in front of every page of a face (console or portal).

It does once what no handler repeats: the security headers (a strict CSP with a
per-response nonce, framing only as the face allows, no sniffing, no referrer, no
caching), refusing control characters in the path (NUL in the query), reading the
form of a POST, opening the session through the face's door, the API's rate limits
(per key holder, and per address for cookies that open nothing), the CSRF check of
every POST, error pages for typed errors, and one access line per request (its path,
never its query string).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Protocol

import structlog
from aiohttp import web

from herald.access.ratelimit import RateLimiter
from herald.api.server import read_body
from herald.console.pages import elapsed_ms, error_page, limited, redirect
from herald.console.scope import FORM, NONCE, REQUEST_ID, SCOPE, Face, Scope
from herald.console.session import CSRF_FIELD, csrf_matches
from herald.errors import BadRequest, HeraldError
from herald.ids import new_id
from herald.ingest import CONTROL

log = structlog.get_logger("herald.console")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Door(Protocol):
    """How a face signs people in: the operator's key, or the tenant's token."""

    public: frozenset[str]
    """Paths served without a session."""

    async def enter(self, request: web.Request) -> web.StreamResponse | None:
        """A response to give before any session is looked at (the portal's token
        trade), or None."""

    async def resolve(self, request: web.Request) -> Scope | None:
        """The scope of the request's session cookie; None when it opens nothing."""

    def signed_out(self, request: web.Request) -> web.Response:
        """Where a request without a session is sent (the sign-in page), cookie cleared."""

    async def login_page(self, request: web.Request) -> web.StreamResponse:
        """``/login``: the sign-in page (the console's form; the portal's landing)."""

    async def logout(self, request: web.Request) -> web.StreamResponse:
        """``POST /logout``: the session ends."""


@dataclass(slots=True)
class Guard:
    """The middleware of one face."""

    face: Face
    door: Door
    _: KW_ONLY
    limiter: RateLimiter
    anonymous: RateLimiter
    body_timeout: float
    static: str = field(init=False)

    def __post_init__(self) -> None:
        self.static = f"{self.face.prefix}/static/"

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        request[REQUEST_ID] = request_id = new_id("req_")
        request[NONCE] = nonce = secrets.token_urlsafe(18)
        try:
            response = await self._handle(request, handler)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            message = "No such page." if exc.status == 404 else (exc.reason or "Bad request.")
            response = error_page(request, exc.status, message)
        except HeraldError as exc:
            if exc.status >= 500:
                log.error(f"{self.face.name}_error", code=exc.code, error=exc.message)
            response = error_page(request, exc.status, exc.message)
        except Exception:
            log.exception(
                f"{self.face.name}_unhandled_error", path=request.path, method=request.method
            )
            response = error_page(request, 500, "Internal error.")
        headers = response.headers
        headers["Content-Security-Policy"] = self.face.csp(nonce)
        if not self.face.framable:
            headers["X-Frame-Options"] = "DENY"
        headers["X-Content-Type-Options"] = "nosniff"
        headers["Referrer-Policy"] = "no-referrer"
        headers["Cross-Origin-Opener-Policy"] = "same-origin"
        headers["X-Request-Id"] = request_id
        if not request.path.startswith(self.static):
            headers["Cache-Control"] = "no-store"
        scope = request.get(SCOPE)
        log.info(
            f"{self.face.name}_request",
            method=request.method,
            path=request.path,
            status=response.status,
            request_id=request_id,
            by=scope.by if scope else None,
            duration_ms=elapsed_ms(started),
        )
        return response

    async def _handle(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.startswith(self.static):
            return await handler(request)
        # Before the door: a portal token in an address no answer can name (a CR/LF
        # in a Location) is refused unspent. The query's words are never echoed raw.
        if CONTROL.search(request.path) or "\x00" in request.query_string:
            raise BadRequest("The address contains a control character.")
        await read_body(request, self.body_timeout)
        if request.method == "POST":
            try:
                posted = await request.post()
            except ValueError as exc:  # a body that is no form (bad encoding, broken multipart)
                raise BadRequest("The form could not be read.") from exc
            request[FORM] = {k: v for k, v in posted.items() if isinstance(v, str)}
        early = await self.door.enter(request)
        if early is not None:
            return early
        if request.path in self.door.public:
            return await handler(request)
        cookie = request.cookies.get(self.face.cookie)
        scope = await self.door.resolve(request)
        if scope is None:
            if cookie is not None:
                # A cookie that opens no session is counted like a request without a
                # valid key: guessing session ids is held to the same per-address rate.
                decision = await self.anonymous.hit(request.remote or "unknown")
                if not decision.allowed:
                    return limited(request, decision, "Too many requests")
            if request.path == f"{self.face.prefix}/logout":
                return self.door.signed_out(request)
            if request.method in ("GET", "HEAD"):
                return redirect(f"{self.face.prefix}/login")
            return error_page(request, 403, "Your session has ended: sign in again.")
        request[SCOPE] = scope
        decision = await self.limiter.hit(scope.by if scope.tenant_id is None else scope.tenant_id)
        if not decision.allowed:
            what = f"More than {self.limiter.limit} requests in {self.limiter.window:g} s"
            return limited(request, decision, what)
        if request.method == "POST" and not csrf_matches(scope.csrf, request[FORM].get(CSRF_FIELD)):
            log.warning(f"{self.face.name}_csrf_refused", path=request.path, by=scope.by)
            return error_page(
                request, 403, "Refused: the form did not carry this session's CSRF token."
            )
        return await handler(request)
