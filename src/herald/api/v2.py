"""The /v2 REST API: event destinations, deliveries and events.

Conventions of spec 000, implemented once here: Bearer keys scoped to a
tenant, the ``errors`` shape with a ``request_id`` on every failure, cursor
pagination, ``Idempotency-Key`` on create endpoints, and a per-tenant rate
limit with the IETF RateLimit headers on every authenticated response.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
import structlog
from aiohttp import web
from pydantic import BaseModel

from herald.api import schemas
from herald.api.cursor import CursorCodec
from herald.api.errors import (
    PayloadTooLarge,
    RateLimited,
    RequestTimeout,
    Unauthorized,
    error_body,
)
from herald.api.ratelimit import request_limiters
from herald.api.request import DEFAULT_LIMIT as DEFAULT_LIMIT  # bench/query_plans.py reads it here
from herald.api.request import (
    DELIVERY_STATUSES,
    DESTINATION_STATUSES,
    json_body,
    page_limit,
    query_params,
    status_param,
    timestamp_param,
)
from herald.api.server import read_body
from herald.apikeys import API_KEY_PREFIX, hash_api_key
from herald.config import Settings
from herald.errors import (
    BadRequest,
    Conflict,
    HeraldError,
    NotFound,
    StorageError,
    ValidationError,
)
from herald.fields import MAX_TYPE_LENGTH, events_field, name_field
from herald.ids import new_id
from herald.logs import debug_enabled
from herald.metrics import Metrics
from herald.model import DeliveryFilter, DeliveryStatus, DestinationStatus
from herald.service import DestinationService, audit, update_fields
from herald.timeutil import format_epoch
from herald.tokens import IssuedToken, Tokens
from herald.views import (
    delivery_view,
    destination_view,
    event_view,
    list_view,
    replay_result_view,
    replay_view,
)

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


class Api:
    """Handlers and middlewares bound to one service."""

    def __init__(
        self,
        service: DestinationService,
        *,
        settings: Settings,
        cursor_key: bytes,
        wake: Callable[[], None] = lambda: None,
        metrics: Metrics | None = None,
    ) -> None:
        self.service = service
        self.metrics = metrics
        self.registry = service.registry
        self.settings = settings
        self.models = schemas.destination_models(service.registry)
        self.cursors = CursorCodec(cursor_key)
        store = service.store
        # Requests without a valid key are counted per client address, in memory.
        self.limiter, self.anonymous = request_limiters(
            settings.api, counter=store.count_request if store.shared else None
        )
        self.wake = wake
        self.tokens = Tokens(store)
        self._key_cache: dict[str, tuple[str | None, float]] = {}

    # --- wiring ---------------------------------------------------------------
    def setup(self, app: web.Application) -> None:
        if self.metrics is not None:
            app.middlewares.append(self.measure)
        app.middlewares.append(self.middleware)
        r = app.router
        p = PREFIX
        r.add_get(f"{p}/openapi.json", self.openapi)
        r.add_post(f"{p}/event-destinations", self.create_destination)
        r.add_get(f"{p}/event-destinations", self.list_destinations)
        r.add_get(f"{p}/event-destinations/{{id}}", self.get_destination)
        r.add_patch(f"{p}/event-destinations/{{id}}", self.update_destination)
        r.add_delete(f"{p}/event-destinations/{{id}}", self.delete_destination)
        r.add_post(f"{p}/event-destinations/{{id}}/test", self.test_destination)
        r.add_post(f"{p}/event-destinations/{{id}}/verify", self.verify_destination)
        r.add_post(f"{p}/event-destinations/{{id}}/rotate-secret", self.rotate_secret)
        r.add_get(f"{p}/event-destinations/{{id}}/event-deliveries", self.list_deliveries)
        r.add_post(f"{p}/event-destinations/{{id}}/replay", self.replay)
        r.add_get(f"{p}/event-deliveries/{{id}}", self.get_delivery)
        r.add_post(f"{p}/event-deliveries/{{id}}/retry", self.retry_delivery)
        r.add_post(f"{p}/events", self.publish_event)
        r.add_get(f"{p}/events/{{id}}", self.get_event)
        r.add_get(f"{p}/replays", self.list_replays)
        r.add_get(f"{p}/replays/{{id}}", self.get_replay)
        r.add_post(f"{p}/token", self.create_token)

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
            if request.path != f"{PREFIX}/openapi.json":
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
        address has sent ``api.unauthenticated_rate_limit_requests`` requests without
        a valid key in the window. A valid key is served from any address: a flood
        from behind the same proxy does not lock its users out."""
        address = request.remote or "unknown"
        try:
            return await self._tenant(request)
        except Unauthorized:
            decision = await self.anonymous.hit(address)
            if decision.allowed:
                raise
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
        now = time.monotonic()
        cached = self._key_cache.get(digest)
        if cached is not None and now - cached[1] < 5.0:
            tenant = cached[0]
        else:
            tenant = await self.service.store.tenant_for_key(digest)
            if len(self._key_cache) > 10_000:
                self._key_cache.clear()
            self._key_cache[digest] = (tenant, now)
        if tenant is None:
            raise Unauthorized("the API key is not valid", code="auth_invalid_key")
        request[KEY_HASH] = digest
        return tenant

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

    def _page(
        self,
        request: web.Request,
        items: list[dict[str, Any]],
        has_more: bool,
        *,
        endpoint: str,
        filters: Mapping[str, object],
        model: type[BaseModel],
    ) -> web.Response:
        next_cursor = None
        if has_more and items:
            next_cursor = self.cursors.encode(items[-1]["id"], endpoint=endpoint, filters=filters)
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
        canonical = body
        with contextlib.suppress(orjson.JSONDecodeError):
            canonical = orjson.dumps(orjson.loads(body), option=orjson.OPT_SORT_KEYS)
        fingerprint = hashlib.sha256(
            request.method.encode() + b" " + request.path.encode() + b"\n" + canonical
        ).hexdigest()
        store = self.service.store
        existing = await store.idempotency_begin(
            tenant_id=tenant,
            key=key,
            fingerprint=fingerprint,
            now=time.time(),
            ttl=self.settings.api.idempotency_ttl_seconds,
        )
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
                await store.idempotency_abort(tenant_id=tenant, key=key)
                raise
            response = self._error(exc, request[REQUEST_ID], status)
        except BaseException:
            await store.idempotency_abort(tenant_id=tenant, key=key)
            raise
        assert isinstance(response.body, bytes)
        kept = response.body
        if stored is not None and 200 <= response.status < 300:
            kept = stored(kept)
        await store.idempotency_finish(tenant_id=tenant, key=key, status=response.status, body=kept)
        return response

    # --- destinations ---------------------------------------------------------
    async def create_destination(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()

        async def run() -> web.Response:
            model = await json_body(
                request,
                self.models.create,
                precheck=self._known_type,
                field_checks=(name_field, functools.partial(events_field, required=True)),
            )
            dest = await self.service.create(request[TENANT], model.model_dump(exclude_unset=True))
            self._audit(request, "destination_created", destination_id=dest.id)
            return self._respond(self.models.destination, self._dest(dest), status=201)

        return await self._idempotent(request, raw, run)

    async def list_destinations(self, request: web.Request) -> web.StreamResponse:
        query = query_params(request, {"limit", "cursor", "status", "type"})
        limit = page_limit(query)
        status = status_param(query, DestinationStatus, DESTINATION_STATUSES)
        type_ = self.registry.canonical(query["type"]) if "type" in query else None
        filters = {"tenant": request[TENANT], "status": query.get("status"), "type": type_}
        before = None
        if "cursor" in query:
            before = self.cursors.decode(query["cursor"], endpoint="destinations", filters=filters)
        items, more = await self.service.list_destinations(
            request[TENANT], status=status, type=type_, before_id=before, limit=limit
        )
        return self._page(
            request,
            [self._dest(d) for d in items],
            more,
            endpoint="destinations",
            filters=filters,
            model=self.models.destination_list,
        )

    async def get_destination(self, request: web.Request) -> web.StreamResponse:
        query_params(request, set())
        dest = await self.service.get(request[TENANT], request.match_info["id"])
        return self._respond(self.models.destination, self._dest(dest))

    async def update_destination(self, request: web.Request) -> web.StreamResponse:
        model = await json_body(
            request,
            self.models.update,
            field_checks=(name_field, functools.partial(events_field, required=False)),
        )
        body = model.model_dump(exclude_unset=True)
        dest = await self.service.update(request[TENANT], request.match_info["id"], body)
        self._audit(request, "destination_updated", destination_id=dest.id, **update_fields(body))
        return self._respond(self.models.destination, self._dest(dest))

    async def delete_destination(self, request: web.Request) -> web.StreamResponse:
        dest = await self.service.delete(request[TENANT], request.match_info["id"])
        self._audit(request, "destination_deleted", destination_id=dest.id)
        return self._respond(self.models.destination, self._dest(dest))

    async def test_destination(self, request: web.Request) -> web.StreamResponse:
        delivery = await self.service.test(request[TENANT], request.match_info["id"])
        self._audit(
            request,
            "destination_tested",
            destination_id=delivery.destination_id,
            delivery_id=delivery.id,
            outcome=delivery.status.value,
        )
        return self._respond(schemas.Delivery, delivery_view(delivery, with_attempts=True))

    async def verify_destination(self, request: web.Request) -> web.StreamResponse:
        dest = await self.service.verify(request[TENANT], request.match_info["id"])
        self._audit(request, "destination_verification_sent", destination_id=dest.id)
        return self._respond(self.models.destination, self._dest(dest), status=202)

    async def rotate_secret(self, request: web.Request) -> web.StreamResponse:
        body = await json_body(request, schemas.RotateSecretRequest, optional=True)
        dest, secret = await self.service.rotate_secret(
            request[TENANT], request.match_info["id"], body.secret
        )
        self._audit(request, "destination_secret_rotated", destination_id=dest.id)
        view = self._dest(dest)
        if body.secret is None:
            view["secret"] = secret  # generated here: the caller's only chance to see it
        return self._respond(self.models.rotated, view)

    # --- deliveries -------------------------------------------------------------
    async def list_deliveries(self, request: web.Request) -> web.StreamResponse:
        query = query_params(request, {"limit", "cursor", "status", "event_type", "since", "until"})
        dest = await self.service.get(request[TENANT], request.match_info["id"], deleted=True)
        limit = page_limit(query)
        status = status_param(query, DeliveryStatus, DELIVERY_STATUSES)
        flt = DeliveryFilter(
            tenant_id=request[TENANT],
            destination_id=dest.id,
            status=status,
            event_types=(query["event_type"],) if "event_type" in query else (),
            since=timestamp_param(query, "since"),
            until=timestamp_param(query, "until"),
        )
        filters = {k: query.get(k) for k in ("status", "event_type", "since", "until")}
        filters["tenant"] = request[TENANT]
        endpoint = f"deliveries:{dest.id}"
        before = None
        if "cursor" in query:
            before = self.cursors.decode(query["cursor"], endpoint=endpoint, filters=filters)
        items, more = await self.service.list_deliveries(flt, before_id=before, limit=limit)
        return self._page(
            request,
            [delivery_view(d) for d in items],
            more,
            endpoint=endpoint,
            filters=filters,
            model=schemas.DeliveryList,
        )

    async def get_delivery(self, request: web.Request) -> web.StreamResponse:
        delivery = await self.service.get_delivery(request[TENANT], request.match_info["id"])
        return self._respond(schemas.Delivery, delivery_view(delivery, with_attempts=True))

    async def retry_delivery(self, request: web.Request) -> web.StreamResponse:
        delivery = await self.service.retry(request[TENANT], request.match_info["id"])
        self._audit(request, "delivery_retried", delivery_id=delivery.id)
        self.wake()
        return self._respond(
            schemas.Delivery, delivery_view(delivery, with_attempts=True), status=202
        )

    async def replay(self, request: web.Request) -> web.StreamResponse:
        body = await json_body(request, schemas.ReplayRequest, optional=True)
        dest = await self.service.get(request[TENANT], request.match_info["id"])
        event_types = tuple(body.event_types or ())
        flt = DeliveryFilter(
            tenant_id=request[TENANT],
            destination_id=dest.id,
            status=DeliveryStatus(body.status) if body.status else None,
            event_types=event_types,
            since=timestamp_param(body, "since"),
            until=timestamp_param(body, "until"),
        )
        # The same rate as `herald replay`: an API replay must not flood a recovering
        # endpoint either. Keys carry no id of their own, so the tenant names the caller.
        result = await self.service.replay(
            flt,
            by=f"api:{request[TENANT]}",
            dry_run=body.dry_run,
            rate_per_second=self.settings.delivery.replay_rate_per_second or None,
        )
        self.wake()
        view = {**replay_result_view(result), "request_id": request[REQUEST_ID]}
        return self._respond(schemas.ReplayResult, view, status=200 if body.dry_run else 202)

    async def get_replay(self, request: web.Request) -> web.StreamResponse:
        query_params(request, set())
        replay = await self.service.get_replay(request[TENANT], request.match_info["id"])
        view = {**replay_view(replay), "request_id": request[REQUEST_ID]}
        return self._respond(schemas.Replay, view)

    async def list_replays(self, request: web.Request) -> web.StreamResponse:
        query = query_params(request, {"limit", "cursor"})
        limit = page_limit(query)
        filters = {"tenant": request[TENANT]}
        before = None
        if "cursor" in query:
            before = self.cursors.decode(query["cursor"], endpoint="replays", filters=filters)
        items, more = await self.service.list_replays(
            request[TENANT], before_id=before, limit=limit
        )
        return self._page(
            request,
            [replay_view(r) for r in items],
            more,
            endpoint="replays",
            filters=filters,
            model=schemas.ReplayList,
        )

    # --- session tokens -------------------------------------------------------
    async def create_token(self, request: web.Request) -> web.StreamResponse:
        """A session token for the key's tenant (spec 000: 201, the token object). Only
        its hash is stored, so an idempotent repeat cannot answer the same value: it
        gives the same token a new one (the first stops working), as long as the token
        has not been traded, expired or been revoked (else 409 token_unavailable)."""
        raw = await request.read()
        tenant = request[TENANT]

        def answer(issued: IssuedToken, request_id: str) -> web.Response:
            view = {
                "id": issued.id,
                "object": "token",
                "token": issued.token,
                "expires_at": format_epoch(issued.expires_at),
                "created_at": format_epoch(issued.created_at),
                "request_id": request_id,
            }
            return self._respond(schemas.Token, view, status=201)

        async def run() -> web.Response:
            await json_body(request, schemas.TokenRequest, optional=True)
            issued = await self.tokens.create(tenant, key_hash=request[KEY_HASH])
            log.info("token_created", token_id=issued.id, tenant_id=tenant)
            return answer(issued, request[REQUEST_ID])

        def stored(body: bytes) -> bytes:
            return orjson.dumps({**orjson.loads(body), "token": None})

        async def replayed(body: bytes) -> web.Response:
            first = orjson.loads(body)
            issued = await self.tokens.reissue(tenant, first["id"])
            if issued is None:
                raise Conflict(
                    "the token made with this Idempotency-Key was exchanged, has expired or"
                    " was revoked; ask for a new one with another Idempotency-Key",
                    field="Idempotency-Key",
                    code="token_unavailable",
                )
            log.info("token_reissued", token_id=issued.id, tenant_id=tenant)
            return answer(issued, first["request_id"])

        return await self._idempotent(request, raw, run, stored=stored, replayed=replayed)

    # --- events -------------------------------------------------------------
    async def publish_event(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()

        async def run() -> web.Response:
            body = await json_body(request, schemas.EventCreate)
            event = await self.service.publish(
                request[TENANT],
                body.type,
                body.data,
                event_id=body.id,
                created_at=body.created_at,
                # Several traceparent headers are invalid (W3C): joined, they fail the check.
                traceparent=",".join(request.headers.getall("traceparent", ())) or None,
            )
            return self._respond(schemas.Event, event_view(event), status=202)

        return await self._idempotent(request, raw, run)

    async def get_event(self, request: web.Request) -> web.StreamResponse:
        event = await self.service.get_event(request[TENANT], request.match_info["id"])
        return self._respond(schemas.Event, event_view(event))

    # --- docs -----------------------------------------------------------------
    async def openapi(self, request: web.Request) -> web.StreamResponse:
        from herald.api.openapi import document

        return json_response(document(self.models))


def setup(
    app: web.Application,
    service: DestinationService,
    *,
    settings: Settings,
    cursor_key: bytes,
    wake: Callable[[], None] = lambda: None,
    metrics: Metrics | None = None,
) -> Api:
    api = Api(service, settings=settings, cursor_key=cursor_key, wake=wake, metrics=metrics)
    api.setup(app)
    return api
