"""The operator console: server-rendered pages under ``/console/`` on the API listener.

Every page calls the same service layer as the API and the CLI; a handler only
reads the request, calls one service operation and renders the answer. The
middleware does the rest once: the session (:mod:`herald.console.session`), the
CSRF check of every POST, the API's rate limits, the security headers (a strict
CSP with a per-response nonce, no framing, no sniffing, no referrer, no caching)
and one access line per request. Every change writes one audit line naming the
operator's key as ``by=console:<key id>``.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp_jinja2
import jinja2
import orjson
import structlog
from aiohttp import web

from herald.api.ratelimit import Decision, request_limiters
from herald.api.server import read_body
from herald.audit import audit, update_fields
from herald.config import Settings
from herald.console import charts, forms
from herald.console.session import (
    CSRF_FIELD,
    LOGIN_CSRF_COOKIE,
    SESSION_COOKIE,
    Operator,
    Sessions,
    clear_cookie,
    csrf_matches,
    set_cookie,
)
from herald.errors import BadRequest, HeraldError, NotFound
from herald.ids import new_id
from herald.model import DeliveryFilter, DeliveryStatus, DestinationStatus
from herald.service import DestinationService
from herald.timeutil import format_epoch, parse_timestamp
from herald.views import delivery_view, destination_view

log = structlog.get_logger("herald.console")
audit_log = structlog.get_logger("herald.audit")

PREFIX = "/console"
PAGE_SIZE = 50
REJECTED_PAGE = 50
REJECTED_DATA_CHARS = 2000
"""A rejected row's data is shown up to this many characters (a row may hold 1 MB)."""
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

OPERATOR = web.RequestKey("console_operator", Operator)
NONCE = web.RequestKey("console_nonce", str)
REQUEST_ID = web.RequestKey("console_request_id", str)
FORM = web.RequestKey("console_form", dict)

PUBLIC = frozenset({f"{PREFIX}/login"})
"""Paths served without a session (static files are too)."""

NOTICES = {
    "retried": "The delivery was re-queued; it is attempted now.",
    "paused": "The destination is paused: its deliveries are held until it is resumed.",
    "resumed": "The destination is active again: its held deliveries are due now.",
    "deleted": "The destination was deleted; its pending deliveries ended as failures.",
    "saved": "Saved.",
    "verifying": "A verification ping was sent; the destination is pending until it succeeds.",
    "created": "Created. A verification ping was sent; it becomes active when it succeeds.",
    "signed_out": "You are signed out.",
}
"""What a redirect's ``notice`` parameter may show: fixed texts, never the URL's words."""

RANGES = {"15m": 900, "1h": 3600, "24h": 86_400, "7d": 7 * 86_400}


def _csp(nonce: str) -> str:
    return (
        "default-src 'none'; "
        f"script-src 'self' 'nonce-{nonce}'; "
        "style-src 'self'; img-src 'self'; connect-src 'self'; "
        "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    )


def _path_segment(value: str) -> str:
    """A value quoted to stand as one path segment of a link."""
    return quote(value, safe="")


def _redirect(location: str) -> web.Response:
    return web.Response(status=303, headers={"Location": location})


def _with_notice(path: str, notice: str) -> str:
    return f"{path}?{urlencode({'notice': notice})}"


def _elapsed_ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)


def _pretty(data: bytes) -> str:
    try:
        return orjson.dumps(orjson.loads(data), option=orjson.OPT_INDENT_2).decode()
    except orjson.JSONDecodeError:
        return data.decode(errors="replace")


class Console:
    """The console's handlers and middleware, bound to one service."""

    def __init__(
        self,
        service: DestinationService,
        *,
        settings: Settings,
        wake: Callable[[], None] = lambda: None,
    ) -> None:
        self.service = service
        self.registry = service.registry
        self.settings = settings
        self.sessions = Sessions(service.store, settings.console)
        store = service.store
        # The API's limits: the same budget per operator key as per tenant, the same
        # per address for failed sign-ins as for requests without a valid key.
        self.limiter, self.anonymous = request_limiters(
            settings.api, counter=store.count_request if store.shared else None
        )
        self.wake = wake

    # --- wiring ---------------------------------------------------------------
    def application(self) -> web.Application:
        app = web.Application(
            middlewares=[self.middleware], client_max_size=self.settings.api.max_body_bytes
        )
        aiohttp_jinja2.setup(
            app,
            loader=jinja2.PackageLoader("herald.console", "templates"),
            autoescape=True,
            context_processors=[self._context],
            filters={"path": _path_segment},
        )
        r = app.router
        r.add_get("/", self.overview)
        r.add_get("/login", self.login_page)
        r.add_post("/login", self.login)
        r.add_post("/logout", self.logout)
        r.add_get("/deliveries", self.deliveries)
        r.add_get("/deliveries/{id}", self.delivery)
        r.add_post("/deliveries/{id}/retry", self.retry)
        r.add_get("/destinations", self.destinations)
        r.add_post("/destinations", self.create_destination)
        r.add_get("/destinations/new", self.new_destination)
        r.add_get("/destinations/{id}", self.destination)
        r.add_post("/destinations/{id}/edit", self.edit_destination)
        r.add_post("/destinations/{id}/pause", self.pause)
        r.add_post("/destinations/{id}/resume", self.resume)
        r.add_post("/destinations/{id}/test", self.send_test)
        r.add_post("/destinations/{id}/verify", self.verify)
        r.add_post("/destinations/{id}/rotate-secret", self.rotate_secret)
        r.add_get("/destinations/{id}/delete", self.delete_page)
        r.add_post("/destinations/{id}/delete", self.delete)
        r.add_get("/events", self.event_lookup)
        # A producer's event id may hold any visible character, '/' included.
        r.add_get("/events/{id:.+}", self.event)
        r.add_get("/outbox/rejected", self.rejected)
        static = Path(str(resources.files("herald.console") / "static"))
        r.add_static("/static", static)
        return app

    async def _context(self, request: web.Request) -> dict[str, Any]:
        operator = request.get(OPERATOR)
        return {
            "operator": operator,
            "csrf_field": CSRF_FIELD,
            "csrf": operator.csrf if operator else "",
            "nonce": request[NONCE],
            "path": request.path,
            "notice": NOTICES.get(request.query.get("notice", "")),
        }

    # --- middleware -------------------------------------------------------------
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
            response = self._error_page(request, exc.status, message)
        except HeraldError as exc:
            if exc.status >= 500:
                log.error("console_error", code=exc.code, error=exc.message)
            response = self._error_page(request, exc.status, exc.message)
        except Exception:
            log.exception("console_unhandled_error", path=request.path, method=request.method)
            response = self._error_page(request, 500, "Internal error.")
        headers = response.headers
        headers["Content-Security-Policy"] = _csp(nonce)
        headers["X-Content-Type-Options"] = "nosniff"
        headers["X-Frame-Options"] = "DENY"
        headers["Referrer-Policy"] = "no-referrer"
        headers["Cross-Origin-Opener-Policy"] = "same-origin"
        headers["X-Request-Id"] = request_id
        if not request.path.startswith(f"{PREFIX}/static/"):
            headers["Cache-Control"] = "no-store"
        operator = request.get(OPERATOR)
        log.info(
            "console_request",
            method=request.method,
            path=request.path,
            status=response.status,
            request_id=request_id,
            key_id=operator.key_id if operator else None,
            duration_ms=_elapsed_ms(started),
        )
        return response

    async def _handle(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.startswith(f"{PREFIX}/static/"):
            return await handler(request)
        if "\x00" in request.path or "\x00" in request.query_string:
            raise BadRequest("The address contains a NUL character.")
        await read_body(request, self.settings.api.body_timeout_seconds)
        if request.method == "POST":
            try:
                posted = await request.post()
            except ValueError as exc:  # a body that is no form (bad encoding, broken multipart)
                raise BadRequest("The form could not be read.") from exc
            request[FORM] = {k: v for k, v in posted.items() if isinstance(v, str)}
        if request.path in PUBLIC:
            return await handler(request)
        cookie = request.cookies.get(SESSION_COOKIE)
        operator = await self.sessions.resolve(cookie)
        if operator is None:
            if cookie is not None:
                # A cookie that opens no session is counted like a request without a
                # valid key: guessing session ids is held to the same per-address rate.
                decision = await self.anonymous.hit(request.remote or "unknown")
                if not decision.allowed:
                    return self._limited(request, decision, "Too many requests")
            if request.path == f"{PREFIX}/logout":
                return self._signed_out()
            if request.method in ("GET", "HEAD"):
                return _redirect(f"{PREFIX}/login")
            return self._error_page(request, 403, "Your session has ended: sign in again.")
        request[OPERATOR] = operator
        decision = await self.limiter.hit(operator.by)
        if not decision.allowed:
            limit = f"More than {self.limiter.limit} requests in {self.limiter.window:g} s"
            return self._limited(request, decision, limit)
        if request.method == "POST" and not csrf_matches(
            operator.csrf, request[FORM].get(CSRF_FIELD)
        ):
            log.warning("console_csrf_refused", path=request.path, key_id=operator.key_id)
            return self._error_page(
                request, 403, "Refused: the form did not carry this session's CSRF token."
            )
        return await handler(request)

    def _limited(self, request: web.Request, decision: Decision, what: str) -> web.Response:
        """The 429 page, with the rate limit's headers."""
        response = self._error_page(request, 429, f"{what}; try again in {decision.reset} s.")
        response.headers.update(decision.headers)
        return response

    def _error_page(self, request: web.Request, status: int, message: str) -> web.Response:
        return aiohttp_jinja2.render_template(
            "error.html", request, {"status": status, "message": message}, status=status
        )

    def _render(
        self, name: str, request: web.Request, context: Mapping[str, Any], *, status: int = 200
    ) -> web.Response:
        return aiohttp_jinja2.render_template(name, request, dict(context), status=status)

    def _list_page(
        self,
        request: web.Request,
        name: str,
        filters: dict[str, str],
        errors: dict[str, str],
        items: list[dict[str, Any]],
        more: bool,
        **extra: Any,
    ) -> web.Response:
        """A filtered list page; its next page keeps the filters and starts past the
        last item shown (ids order the lists, newest first)."""
        next_url = None
        if more and items:
            kept = {k: v for k, v in filters.items() if v}
            next_url = f"{PREFIX}/{name}?{urlencode({**kept, 'cursor': items[-1]['id']})}"
        context = {"filters": filters, "errors": errors, "items": items, "next_url": next_url}
        return self._render(
            f"{name}.html", request, {**context, **extra}, status=400 if errors else 200
        )

    def _audit(self, request: web.Request, action: str, *, tenant_id: str, **fields: Any) -> None:
        """The audit line of a change, the same the CLI and the API write."""
        by = request[OPERATOR].by
        audit(action, by=by, tenant_id=tenant_id, request_id=request[REQUEST_ID], **fields)

    # --- sign-in ----------------------------------------------------------------
    async def login_page(self, request: web.Request) -> web.StreamResponse:
        operator = await self.sessions.resolve(request.cookies.get(SESSION_COOKIE))
        if operator is not None:
            return _redirect(f"{PREFIX}/")
        return self._login_form(request, error=None, status=200)

    def _login_form(self, request: web.Request, *, error: str | None, status: int) -> web.Response:
        token = secrets.token_urlsafe(24)
        response = self._render(
            "login.html", request, {"login_csrf": token, "error": error}, status=status
        )
        set_cookie(response, request, self.settings.console, LOGIN_CSRF_COOKIE, token)
        return response

    async def login(self, request: web.Request) -> web.StreamResponse:
        form = request[FORM]
        if not csrf_matches(request.cookies.get(LOGIN_CSRF_COOKIE, ""), form.get(CSRF_FIELD)):
            return self._login_form(
                request, error="The sign-in form expired; sign in again.", status=403
            )
        address = request.remote or "unknown"
        key = form.get("key", "")
        signed = await self.sessions.sign_in(key)
        if signed is None:
            decision = await self.anonymous.hit(address)
            if not decision.allowed:
                response = self._login_form(
                    request,
                    error=f"Too many failed sign-ins; try again in {decision.reset} s.",
                    status=429,
                )
                response.headers.update(decision.headers)
                return response
            tenant_key = await self.sessions.is_tenant_key(key)
            log.info("console_sign_in_refused", address=address, tenant_key=tenant_key)
            error = (
                "This is a tenant's API key. The console opens only with an operator key"
                " (herald keys create --operator)."
                if tenant_key
                else "This key is not a valid operator key."
            )
            return self._login_form(request, error=error, status=401)
        session_id, key_id = signed
        audit_log.info("console_signed_in", by=f"console:{key_id}", address=address)
        response = _redirect(f"{PREFIX}/")
        set_cookie(response, request, self.settings.console, SESSION_COOKIE, session_id)
        clear_cookie(response, LOGIN_CSRF_COOKIE)
        return response

    async def logout(self, request: web.Request) -> web.StreamResponse:
        operator = request[OPERATOR]
        await self.sessions.sign_out(operator)
        audit_log.info("console_signed_out", by=operator.by, request_id=request[REQUEST_ID])
        return self._signed_out()

    @staticmethod
    def _signed_out() -> web.Response:
        response = _redirect(_with_notice(f"{PREFIX}/login", "signed_out"))
        clear_cookie(response, SESSION_COOKIE)
        return response

    # --- overview -----------------------------------------------------------------
    async def overview(self, request: web.Request) -> web.StreamResponse:
        ov = await self.service.overview()
        hour = charts.bar_chart(
            ov.last_hour, now=ov.now, bucket_seconds=60, buckets=60, label="last hour, per minute"
        )
        day = charts.bar_chart(
            ov.last_day,
            now=ov.now,
            bucket_seconds=900,
            buckets=96,
            label="last 24 hours, per 15 minutes",
        )
        return self._render(
            "overview.html", request, {"ov": ov, "charts": [hour, day], "rate": _success_rate}
        )

    # --- deliveries -------------------------------------------------------------
    async def deliveries(self, request: web.Request) -> web.StreamResponse:
        q = request.query
        filters = {
            k: q.get(k, "").strip()
            for k in ("status", "destination", "event_type", "tenant", "range", "since", "until")
        }
        errors: dict[str, str] = {}
        status = None
        if filters["status"]:
            try:
                status = DeliveryStatus(filters["status"])
            except ValueError:
                errors["status"] = "Choose pending, success or failure."
        since = until = None
        if filters["range"]:
            if filters["range"] not in RANGES:
                errors["range"] = "Choose one of the listed ranges."
            else:
                since = time.time() - RANGES[filters["range"]]
        for name in ("since", "until"):
            if filters[name]:
                try:
                    instant = parse_timestamp(filters[name]).epoch
                except ValueError as exc:
                    errors[name] = str(exc)
                    continue
                if name == "since":
                    since = instant if since is None else max(since, instant)
                else:
                    until = instant
        items: list[dict[str, Any]] = []
        more = False
        if not errors:
            flt = DeliveryFilter(
                tenant_id=filters["tenant"] or None,
                destination_id=filters["destination"] or None,
                status=status,
                event_types=(filters["event_type"],) if filters["event_type"] else (),
                since=since,
                until=until,
            )
            try:
                found, more = await self.service.list_deliveries(
                    flt, before_id=q.get("cursor") or None, limit=PAGE_SIZE
                )
            except HeraldError as exc:
                errors[forms.form_field_of(exc.field, "") or "event_type"] = exc.message
                found = []
            items = [{**delivery_view(d), "tenant_id": d.tenant_id} for d in found]
        return self._list_page(
            request,
            "deliveries",
            filters,
            errors,
            items,
            more,
            statuses=[s.value for s in DeliveryStatus],
            ranges=list(RANGES),
        )

    async def delivery(self, request: web.Request) -> web.StreamResponse:
        d = await self.service.get_delivery(None, request.match_info["id"])
        envelope = None
        try:
            event = await self.service.get_event(d.tenant_id, d.event_id)
        except NotFound:
            event = None  # purged by retention before its deliveries
        if event is not None:
            envelope = _pretty(
                orjson.dumps(
                    {
                        "id": event.id,
                        "type": event.type,
                        "created_at": event.created_at,
                        "data": orjson.Fragment(event.data),
                    }
                )
            )
        view = {**delivery_view(d, with_attempts=True), "tenant_id": d.tenant_id}
        return self._render(
            "delivery.html",
            request,
            {"d": view, "envelope": envelope, "retryable": d.kind.value == "event"},
        )

    async def retry(self, request: web.Request) -> web.StreamResponse:
        d = await self.service.retry(None, request.match_info["id"])
        self.wake()
        self._audit(request, "delivery_retried", tenant_id=d.tenant_id, delivery_id=d.id)
        return _redirect(_with_notice(f"{PREFIX}/deliveries/{d.id}", "retried"))

    # --- destinations -------------------------------------------------------------
    async def destinations(self, request: web.Request) -> web.StreamResponse:
        q = request.query
        filters = {k: q.get(k, "").strip() for k in ("tenant", "status", "type")}
        errors: dict[str, str] = {}
        status = None
        if filters["status"]:
            try:
                status = DestinationStatus(filters["status"])
            except ValueError:
                errors["status"] = "Choose one of the listed statuses."
        items: list[dict[str, Any]] = []
        more = False
        if not errors:
            try:
                found, more = await self.service.list_destinations(
                    filters["tenant"] or None,
                    status=status,
                    type=filters["type"] or None,
                    before_id=q.get("cursor") or None,
                    limit=PAGE_SIZE,
                )
            except HeraldError as exc:
                errors["type"] = exc.message
                found = []
            items = [self._dest(d) for d in found]
        return self._list_page(
            request,
            "destinations",
            filters,
            errors,
            items,
            more,
            statuses=[s.value for s in DestinationStatus],
            types=[a.type_id for a in self.registry],
        )

    def _dest(self, dest: Any) -> dict[str, Any]:
        """The API's view (credentials masked) plus its tenant and its config's fields."""
        view = destination_view(dest, self.registry)
        return {**view, "tenant_id": dest.tenant_id, "config": view[dest.type]}

    async def _destination_page(
        self, request: web.Request, dest_id: str, *, status: int = 200, **extra: Any
    ) -> web.Response:
        dest = await self.service.get(None, dest_id)
        recent, _ = await self.service.list_deliveries(
            DeliveryFilter(tenant_id=dest.tenant_id, destination_id=dest.id), limit=10
        )
        context: dict[str, Any] = {
            "dest": self._dest(dest),
            "recent": [delivery_view(d) for d in recent],
            "errors": {},
            "form": None,
            "test": None,
            "secret": None,
            "error": None,
        }
        context.update(extra)
        return self._render("destination.html", request, context, status=status)

    async def destination(self, request: web.Request) -> web.StreamResponse:
        return await self._destination_page(request, request.match_info["id"])

    async def _tenant_of(self, request: web.Request) -> str:
        dest = await self.service.get(None, request.match_info["id"])
        return dest.tenant_id

    async def _set_status(self, request: web.Request, status: DestinationStatus) -> web.Response:
        dest_id = request.match_info["id"]
        tenant = await self._tenant_of(request)
        try:
            await self.service.update(tenant, dest_id, {"status": status.value})
        except HeraldError as exc:
            return await self._destination_page(
                request, dest_id, status=exc.status, error=exc.message
            )
        action = "paused" if status is DestinationStatus.INACTIVE else "resumed"
        self.wake()
        self._audit(
            request,
            "destination_updated",
            tenant_id=tenant,
            destination_id=dest_id,
            **update_fields({"status": status.value}),
        )
        return _redirect(_with_notice(f"{PREFIX}/destinations/{dest_id}", action))

    async def pause(self, request: web.Request) -> web.StreamResponse:
        return await self._set_status(request, DestinationStatus.INACTIVE)

    async def resume(self, request: web.Request) -> web.StreamResponse:
        return await self._set_status(request, DestinationStatus.ACTIVE)

    async def send_test(self, request: web.Request) -> web.StreamResponse:
        dest_id = request.match_info["id"]
        tenant = await self._tenant_of(request)
        try:
            delivery = await self.service.test(tenant, dest_id)
        except HeraldError as exc:
            return await self._destination_page(
                request, dest_id, status=exc.status, error=exc.message
            )
        self._audit(
            request,
            "destination_tested",
            tenant_id=tenant,
            destination_id=dest_id,
            delivery_id=delivery.id,
            outcome=delivery.status.value,
        )
        return await self._destination_page(
            request, dest_id, test=delivery_view(delivery, with_attempts=True)
        )

    async def verify(self, request: web.Request) -> web.StreamResponse:
        dest_id = request.match_info["id"]
        tenant = await self._tenant_of(request)
        await self.service.verify(tenant, dest_id)
        self.wake()
        self._audit(
            request, "destination_verification_sent", tenant_id=tenant, destination_id=dest_id
        )
        return _redirect(_with_notice(f"{PREFIX}/destinations/{dest_id}", "verifying"))

    async def rotate_secret(self, request: web.Request) -> web.StreamResponse:
        dest_id = request.match_info["id"]
        tenant = await self._tenant_of(request)
        try:
            _, secret = await self.service.rotate_secret(tenant, dest_id)
        except HeraldError as exc:
            return await self._destination_page(
                request, dest_id, status=exc.status, error=exc.message
            )
        self._audit(request, "destination_secret_rotated", tenant_id=tenant, destination_id=dest_id)
        # Shown in this response only (never stored in clear, never in a URL).
        return await self._destination_page(request, dest_id, secret=secret)

    async def edit_destination(self, request: web.Request) -> web.StreamResponse:
        dest_id = request.match_info["id"]
        dest = await self.service.get(None, dest_id)
        form = request[FORM]
        try:
            body = forms.edit_body(form)
            await self.service.update(dest.tenant_id, dest_id, body)
        except HeraldError as exc:
            field = forms.form_field_of(exc.field, dest.type)
            return await self._destination_page(
                request,
                dest_id,
                status=exc.status,
                errors={field: exc.message} if field else {},
                error=None if field else exc.message,
                form=form,
            )
        self._audit(
            request, "destination_updated", tenant_id=dest.tenant_id, destination_id=dest_id
        )
        return _redirect(_with_notice(f"{PREFIX}/destinations/{dest_id}", "saved"))

    async def delete_page(self, request: web.Request) -> web.StreamResponse:
        dest = await self.service.get(None, request.match_info["id"])
        return self._render("delete.html", request, {"dest": self._dest(dest)})

    async def delete(self, request: web.Request) -> web.StreamResponse:
        dest_id = request.match_info["id"]
        tenant = await self._tenant_of(request)
        await self.service.delete(tenant, dest_id)
        self._audit(request, "destination_deleted", tenant_id=tenant, destination_id=dest_id)
        return _redirect(_with_notice(f"{PREFIX}/destinations", "deleted"))

    async def new_destination(self, request: web.Request) -> web.StreamResponse:
        form = {k: v for k, v in request.query.items() if k in ("type", "tenant")}
        return self._create_form(request, form, errors={}, status=200)

    def _create_form(
        self,
        request: web.Request,
        form: Mapping[str, str],
        *,
        errors: Mapping[str, str],
        status: int,
        error: str | None = None,
    ) -> web.Response:
        types = [a.type_id for a in self.registry]
        chosen = form.get("type") or types[0]
        try:
            chosen = self.registry.canonical(chosen)
        except HeraldError:
            chosen = types[0]
        return self._render(
            "destination_new.html",
            request,
            {
                "types": types,
                "chosen": chosen,
                "fields": forms.config_fields(self.registry, chosen),
                "form": form,
                "errors": errors,
                "error": error,
            },
            status=status,
        )

    async def create_destination(self, request: web.Request) -> web.StreamResponse:
        form = request[FORM]
        tenant = form.get("tenant", "").strip() or "default"
        try:
            dest = await self.service.create(tenant, forms.create_body(form))
        except HeraldError as exc:
            field = forms.form_field_of(exc.field, form.get("type", ""))
            # Credentials typed are not sent back into the page.
            kept = {k: v for k, v in form.items() if k != CSRF_FIELD}
            sensitive = {
                f.input_name
                for f in forms.config_fields(self.registry, self._type_or_first(form))
                if f.sensitive
            }
            kept = {k: v for k, v in kept.items() if k not in sensitive}
            return self._create_form(
                request,
                kept,
                errors={field: exc.message} if field else {},
                error=None if field else exc.message,
                status=exc.status,
            )
        self.wake()
        self._audit(request, "destination_created", tenant_id=tenant, destination_id=dest.id)
        return _redirect(_with_notice(f"{PREFIX}/destinations/{dest.id}", "created"))

    def _type_or_first(self, form: Mapping[str, str]) -> str:
        try:
            return self.registry.canonical(form.get("type", ""))
        except HeraldError:
            return next(iter(self.registry)).type_id

    # --- events and rejected rows ---------------------------------------------------
    async def event_lookup(self, request: web.Request) -> web.StreamResponse:
        event_id = request.query.get("id", "").strip()
        if not event_id:
            return self._render("event_lookup.html", request, {})
        query = {"tenant": request.query["tenant"]} if request.query.get("tenant") else {}
        suffix = f"?{urlencode(query)}" if query else ""
        return _redirect(f"{PREFIX}/events/{_path_segment(event_id)}{suffix}")

    async def event(self, request: web.Request) -> web.StreamResponse:
        tenant = request.query.get("tenant", "").strip() or None
        event, deliveries = await self.service.find_event(tenant, request.match_info["id"])
        return self._render(
            "event.html",
            request,
            {
                "event": event,
                "envelope": _pretty(event.data),
                "deliveries": [delivery_view(d) for d in deliveries],
            },
        )

    async def rejected(self, request: web.Request) -> web.StreamResponse:
        rows = await self.service.rejected_rows(limit=REJECTED_PAGE)
        shown = []
        for row in rows:
            data = row.get("data")
            text = data.decode(errors="replace") if isinstance(data, bytes) else str(data or "")
            rejected_at = row.get("rejected_at")
            shown.append(
                {
                    **row,
                    "data": text[:REJECTED_DATA_CHARS],
                    "cut": len(text) > REJECTED_DATA_CHARS,
                    "rejected": format_epoch(rejected_at)
                    if isinstance(rejected_at, int | float)
                    else None,
                }
            )
        return self._render("rejected.html", request, {"rows": shown, "chars": REJECTED_DATA_CHARS})


def _success_rate(totals: Mapping[str, int]) -> str:
    finished = totals.get("success", 0) + totals.get("failure", 0)
    if not finished:
        return "–"
    return f"{100 * totals.get('success', 0) / finished:.1f} %"


def setup(
    app: web.Application,
    service: DestinationService,
    *,
    settings: Settings,
    wake: Callable[[], None] = lambda: None,
) -> Console | None:
    """Mount the console under ``/console/`` (unless ``console.enabled`` is false)."""
    if not settings.console.enabled:
        return None
    console = Console(service, settings=settings, wake=wake)

    async def to_index(request: web.Request) -> web.StreamResponse:
        return _redirect(f"{PREFIX}/")

    app.router.add_get(PREFIX, to_index)
    app.add_subapp(PREFIX, console.application())
    return console
