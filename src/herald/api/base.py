"""What every /v2 handler stands on: spec 000's conventions, implemented once.

Bearer keys scoped to a tenant, the ``errors`` shape with a ``request_id`` on every
failure, one access line per request, the per-tenant rate limit with the IETF
RateLimit headers on every authenticated response, cursor pagination, validated
responses, and ``Idempotency-Key`` on create endpoints. The handlers are
:mod:`~herald.api.destinations`, :mod:`~herald.api.deliveries` and
:mod:`~herald.api.events`, joined with the routes in :mod:`~herald.api.v2`.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
import structlog
from aiohttp import web
from pydantic import BaseModel

from herald.access import Access
from herald.access.idempotency import fingerprint as request_fingerprint
from herald.access.keys import API_KEY_PREFIX, TENANT_KIND, hash_api_key
from herald.api import schemas
from herald.api.cursor import CursorCodec, Pages
from herald.api.errors import PayloadTooLarge, RateLimited, RequestTimeout, Unauthorized, error_body
from herald.api.server import read_body
from herald.audit import audit
from herald.config import Settings
from herald.errors import BadRequest, Conflict, HeraldError, NotFound, StorageError, ValidationError
from herald.fields import MAX_TYPE_LENGTH
from herald.ids import new_id
from herald.logs import debug_enabled
from herald.metrics import Metrics
from herald.service import Operations
from herald.views import destination_view, list_view

log = structlog.get_logger("herald.api")

PREFIX = "/v2"
IDEMPOTENCY_KEY = re.compile(r"^[\x21-\x7e]{1,255}$")
# Visible ASCII after the prefix: anything else (a non-ASCII or undecodable byte)
# cannot be a key Herald issued, and is refused before it is hashed or looked up.
API_KEY = re.compile(API_KEY_PREFIX + r"[\x21-\x7e]{1,192}")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
"""Methods counted as themselves; any other is ``other`` (a label value per request
line a client invents would be unbounded)."""

REQUEST_ID = web.RequestKey("request_id", str)
TENANT = web.RequestKey("tenant", str)
KEY_HASH = web.RequestKey("key_hash", str)
"""The hash of the request's API key: a session token remembers the key that made it."""
QUIET = web.RequestKey("quiet", bool)
"""Set on a request refused for an address's flood of unauthenticated requests:
one line per address and window says so, not one per request."""


def _elapsed_ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)


def json_response(data: Any, *, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


class ApiBase:
    """The middlewares and helpers every handler of one service's API shares."""

    def __init__(
        self,
        service: Operations,
        *,
        access: Access,
        settings: Settings,
        cursor_key: bytes,
        metrics: Metrics | None = None,
    ) -> None:
        self.service = service
        self.access = access
        self.metrics = metrics
        self.registry = service.registry
        self.settings = settings
        self.models = schemas.destination_models(service.registry)
        self.cursors = CursorCodec(cursor_key)
        # The process's budgets, which the console shares; requests without a valid key
        # are counted per client address, in memory.
        self.limiter, self.anonymous = access.limiter, access.anonymous
        self.tokens = access.tokens

    # --- middleware -------------------------------------------------------------
    @web.middleware
    async def measure(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Count every answer by route pattern (``/v2/event-deliveries/{id}``, never the
        path: ids would make a series per delivery), method and status."""
        assert self.metrics is not None
        started = time.perf_counter()
        status = 500
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as exc:  # the ops routes' own 404 and 405
            status = exc.status
            raise
        except asyncio.CancelledError:
            status = 499
            raise
        finally:
            resource = request.match_info.route.resource
            route = resource.canonical if resource is not None else "unmatched"
            method = request.method if request.method in _METHODS else "other"
            self.metrics.api_answered(route, method, status, time.perf_counter() - started)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        if not request.path.startswith(PREFIX + "/") and request.path != PREFIX:
            # /healthz, /readyz and /metrics are polled every few seconds by probes and
            # scrapers: at info level they would drown the API's own lines.
            if not debug_enabled():
                return await handler(request)
            plain = await handler(request)
            log.debug(
                "http_request",
                method=request.method,
                path=request.path,
                status=plain.status,
                duration_ms=_elapsed_ms(started),
            )
            return plain
        request_id = new_id("req_")
        request[REQUEST_ID] = request_id
        response: web.StreamResponse | None = None
        status = 500  # _handle answers every error itself; this is for its own failure
        try:
            response = await self._handle(request, handler, request_id)
            status = response.status
            return response
        except asyncio.CancelledError:
            status = 499  # the client went away first (nginx's code for it)
            raise
        finally:
            if not request.get(QUIET):
                self._access_log(request, request_id, status, response, started)

    @staticmethod
    def _access_log(
        request: web.Request,
        request_id: str,
        status: int,
        response: web.StreamResponse | None,
        started: float,
    ) -> None:
        """One line per API request, keyed by the request id the caller got back.

        Never the body or the headers: both may carry secrets (Authorization,
        webhook secrets, custom_headers)."""
        fields: dict[str, Any] = {
            "method": request.method,
            "path": request.path,
            "status": status,
            "request_id": request_id,
            "duration_ms": _elapsed_ms(started),
        }
        if TENANT in request:
            fields["tenant_id"] = request[TENANT]
        if response is not None:
            # An idempotent replay answers with the first request's id (header and body).
            answered = response.headers.get("X-Request-Id", request_id)
            if answered != request_id:
                fields["replayed_request_id"] = answered
        log.info("api_request", **fields)

    async def _handle(
        self, request: web.Request, handler: Handler, request_id: str
    ) -> web.StreamResponse:
        structlog.contextvars.bind_contextvars(request_id=request_id)
        extra_headers: dict[str, str] = {}
        try:
            if request.path == f"{PREFIX}/openapi.json":
                # It needs no key: counted like any request without one.
                await self._limit_address(request, extra_headers)
            else:
                tenant = await self._authenticate(request, extra_headers)
                request[TENANT] = tenant
                decision = await self.limiter.hit(tenant)
                extra_headers.update(decision.headers)
                if not decision.allowed:
                    raise RateLimited(
                        f"more than {self.limiter.limit} requests in"
                        f" {self.limiter.window:g} s; retry in {decision.reset} s"
                    )
            if "\x00" in request.path or "\x00" in request.query_string:
                # No id or filter holds one, and PostgreSQL cannot even compare one.
                raise BadRequest("the URL contains a NUL character", code="invalid_character")
            await read_body(request, self.settings.api.body_timeout_seconds)
            response = await handler(request)
            if self.metrics is not None and TENANT in request:
                self.metrics.database_result("api", True)  # its key and its call were answered
        except HeraldError as exc:
            if isinstance(exc, StorageError) and self.metrics is not None:
                self.metrics.database_result("api", False)
            response = self._error(exc, request_id)
            if isinstance(exc, Unauthorized):
                challenge = 'Bearer realm="herald"'
                if exc.code == "auth_invalid_key":
                    challenge += ', error="invalid_token"'
                response.headers["WWW-Authenticate"] = challenge
            elif isinstance(exc, RequestTimeout):
                response.force_close()  # the rest of the body is not waited for
        except web.HTTPException as exc:
            response = self._http_error(exc, request_id)
        except Exception:
            log.exception("api_unhandled_error", path=request.path, method=request.method)
            response = self._error(HeraldError("internal error"), request_id, status=500)
        finally:
            structlog.contextvars.unbind_contextvars("request_id")
        # A replayed idempotent response keeps the request id its body carries.
        response.headers.setdefault("X-Request-Id", request_id)
        response.headers.update(extra_headers)
        return response

    def _error(self, exc: HeraldError, request_id: str, status: int | None = None) -> web.Response:
        status = status or exc.status
        if status >= 500:
            log.error("api_error", code=exc.code, error=exc.message)
        return json_response(error_body(exc, request_id, status), status=status)

    def _http_error(self, exc: web.HTTPException, request_id: str) -> web.Response:
        status = exc.status
        if status == 413:
            err: HeraldError = PayloadTooLarge(
                f"the body is larger than {self.settings.api.max_body_bytes} bytes"
            )
        elif status == 404:
            err = NotFound("no such endpoint", code="endpoint_not_found")
        elif status == 405:
            err = BadRequest(
                f"method not allowed; use {exc.headers.get('Allow', '')}", code="method_not_allowed"
            )
        else:
            err = BadRequest(exc.reason or "bad request", code="invalid_request")
        response = json_response(error_body(err, request_id, status), status=status)
        if "Allow" in exc.headers:
            response.headers["Allow"] = exc.headers["Allow"]
        return response

    async def _authenticate(self, request: web.Request, headers: dict[str, str]) -> str:
        """The tenant of the request's key; Unauthorized, or RateLimited once its client
        address has sent too many requests without a valid key (:meth:`_limit_address`).
        A valid key is served from any address: a flood from behind the same proxy does
        not lock its users out."""
        try:
            return await self._tenant(request)
        except Unauthorized:
            await self._limit_address(request, headers)
            raise

    async def _limit_address(self, request: web.Request, headers: dict[str, str]) -> None:
        """Count one request without a valid key against its client address;
        RateLimited past ``api.unauthenticated_rate_limit_requests`` in the window."""
        address = request.remote or "unknown"
        decision = await self.anonymous.hit(address)
        if decision.allowed:
            return
        request[QUIET] = True
        if decision.refused == 1:
            log.warning(
                "unauthenticated_requests_limited",
                address=address,
                limit=self.anonymous.limit,
                window_seconds=self.anonymous.window,
            )
        headers.update(decision.headers)
        raise RateLimited(
            f"more than {self.anonymous.limit} requests without a valid API key from this"
            f" address in {self.anonymous.window:g} s; retry in {decision.reset} s"
        )

    async def _tenant(self, request: web.Request) -> str:
        if len(request.headers.getall("Authorization", ())) > 1:
            # Which one wins would be a proxy's choice or the parser's, not the client's.
            raise BadRequest(
                "send one Authorization header, not several", code="auth_header_repeated"
            )
        header = request.headers.get("Authorization", "")
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise Unauthorized(
                "missing 'Authorization: Bearer <API key>' header", code="auth_missing"
            )
        key = key.strip()
        if not API_KEY.fullmatch(key):
            raise Unauthorized("the API key is not valid", code="auth_invalid_key")
        digest = hash_api_key(key)
        found = await self.access.keys.lookup(digest)
        # Only tenant keys: an operator key opens the console, not the API.
        if found is None or found.kind != TENANT_KIND:
            raise Unauthorized("the API key is not valid", code="auth_invalid_key")
        request[KEY_HASH] = digest
        return found.tenant_id

    @staticmethod
    def _audit(request: web.Request, action: str, **fields: object) -> None:
        # Keys carry no id of their own: the tenant names the caller, as for replays.
        tenant = request[TENANT]
        audit(
            action, by=f"api:{tenant}", tenant_id=tenant, request_id=request[REQUEST_ID], **fields
        )

    # --- parsing helpers ----------------------------------------------------------
    def _known_type(self, data: dict[str, Any]) -> None:
        # An unknown type is an invalid value (422 naming `type`), even when the body
        # also carries a config object under that unknown name. One too long to be a
        # type is left to the service, which says so without echoing it.
        if isinstance(data.get("type"), str) and len(data["type"]) <= MAX_TYPE_LENGTH:
            self.registry.canonical(data["type"])

    def _pages(
        self, query: Mapping[str, str], *, endpoint: str, filters: Mapping[str, object]
    ) -> Pages:
        """Where a list's page starts (its ``cursor``, checked against ``endpoint`` and
        ``filters``), and the scope its next cursor is bound to."""
        return self.cursors.pages(query.get("cursor"), endpoint=endpoint, filters=filters)

    def _page(
        self,
        request: web.Request,
        pages: Pages,
        items: list[dict[str, Any]],
        has_more: bool,
        *,
        model: type[BaseModel],
        key: str = "id",
    ) -> web.Response:
        """A page of ``items``, with the cursor of its last item's ``key`` if more follow."""
        next_cursor = pages.cursor(items[-1][key]) if has_more and items else None
        body = list_view(
            items, has_more=has_more, next_cursor=next_cursor, request_id=request[REQUEST_ID]
        )
        return self._respond(model, body)

    @staticmethod
    def _respond(
        model: type[BaseModel], data: dict[str, Any], *, status: int = 200
    ) -> web.Response:
        checked = model.model_validate(data).model_dump(mode="json", exclude_unset=True)
        return json_response(checked, status=status)

    def _dest(self, dest: Any) -> dict[str, Any]:
        return destination_view(dest, self.registry)

    async def _idempotent(
        self,
        request: web.Request,
        body: bytes,
        run: Callable[[], Awaitable[web.Response]],
        *,
        stored: Callable[[bytes], bytes] | None = None,
        replayed: Callable[[bytes], Awaitable[web.Response]] | None = None,
    ) -> web.Response:
        """Run a create once per ``Idempotency-Key`` and body; a repeat answers the
        first response. ``stored`` turns a success body into what is kept (a secret it
        shows must not be stored), and ``replayed`` answers a repeat from that."""
        key = request.headers.get("Idempotency-Key")
        if key is None:
            return await run()
        if not IDEMPOTENCY_KEY.match(key):
            raise BadRequest(
                "Idempotency-Key must be 1 to 255 visible ASCII characters",
                field="Idempotency-Key",
                code="idempotency_key_invalid",
            )
        tenant = request[TENANT]
        fingerprint = request_fingerprint(request.method, request.path, body)
        records = self.access.idempotency
        existing = await records.begin(tenant, key, fingerprint)
        if existing is not None:
            if existing.fingerprint != fingerprint:
                raise ValidationError(
                    "this Idempotency-Key was used with a different request",
                    field="Idempotency-Key",
                    code="idempotency_key_reused",
                )
            if existing.status is None or existing.body is None:
                raise Conflict(
                    "a request with this Idempotency-Key is still in progress",
                    field="Idempotency-Key",
                    code="idempotency_key_in_use",
                )
            if replayed is not None and 200 <= existing.status < 300:
                response = await replayed(existing.body)
            else:
                response = web.Response(
                    body=existing.body, status=existing.status, content_type="application/json"
                )
            response.headers["Idempotent-Replayed"] = "true"
            with contextlib.suppress(orjson.JSONDecodeError, AttributeError, TypeError):
                original = orjson.loads(existing.body).get("request_id")
                if isinstance(original, str):
                    response.headers["X-Request-Id"] = original
            return response
        try:
            response = await run()
        except HeraldError as exc:
            status = exc.status
            if status >= 500:
                await records.abort(tenant, key)
                raise
            response = self._error(exc, request[REQUEST_ID], status)
        except BaseException:
            await records.abort(tenant, key)
            raise
        assert isinstance(response.body, bytes)
        kept = response.body
        if stored is not None and 200 <= response.status < 300:
            kept = stored(kept)
        await records.finish(tenant, key, status=response.status, body=kept)
        return response
