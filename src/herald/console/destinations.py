"""The destination pages: the filtered list, a destination's page and its actions
(pause, resume, test, re-verify, rotate, edit, delete), and the create form.

Every destination is looked up within the request's scope: a portal session asking
for another tenant's id gets the same 404 as for an id that does not exist."""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from aiohttp import web

from herald.audit import update_fields
from herald.console import charts, forms
from herald.console.pages import (
    PAGE_SIZE,
    Pages,
    base,
    choice,
    clear_flash,
    flashed,
    redirect,
    render,
    set_flash,
    with_notice,
)
from herald.console.scope import FORM
from herald.console.session import CSRF_FIELD
from herald.errors import HeraldError, NotFound
from herald.model import (
    DEFAULT_TENANT,
    DeliveryFilter,
    Destination,
    DestinationHealth,
    DestinationStatus,
)
from herald.views import (
    attempt_said,
    delivery_view,
    destination_view,
    health_view,
    rate_text,
    verification_attempt_view,
)

CATALOG_OFFERED = 200
"""Catalog types the events input offers (the catalog's first, in type order)."""


class DestinationPages(Pages):
    """``/destinations``, ``/destinations/new`` and ``/destinations/{id}[/…]``."""

    async def list(self, request: web.Request) -> web.StreamResponse:
        q = request.query
        scope = self.scope(request)
        filters = {k: q.get(k, "").strip() for k in ("tenant", "status", "type")}
        errors: dict[str, str] = {}
        status = choice(DestinationStatus, filters, errors, "Choose one of the listed statuses.")
        items: list[dict[str, Any]] = []
        more = False
        if not errors:
            try:
                found, more = await self.service.list_destinations(
                    scope.tenant(filters["tenant"]),
                    status=status,
                    type=filters["type"] or None,
                    before_id=q.get("cursor") or None,
                    limit=PAGE_SIZE,
                )
            except HeraldError as exc:
                errors["type"] = exc.message
                found = []
            health = await self.service.health(found)
            items = [{**self._view(d), **self._health(health.get(d.id))} for d in found]
        return self.list_page(
            request,
            "destinations",
            filters,
            errors,
            items,
            more,
            statuses=[s.value for s in DestinationStatus],
            types=[a.type_id for a in self.registry],
        )

    def _view(self, dest: Destination) -> dict[str, Any]:
        """The API's view (credentials masked) plus its tenant and its config's fields."""
        view = destination_view(dest, self.registry)
        return {**view, "tenant_id": dest.tenant_id, "config": view[dest.type]}

    @staticmethod
    def _health(health: DestinationHealth | None) -> dict[str, Any]:
        """How it has been answering (the recorder's counters), as the pages show it."""
        return {"health": health_view(health), "failure_rate": rate_text(health)}

    async def _get(self, request: web.Request) -> Destination:
        """The destination the path names, within the request's scope."""
        return await self.service.get(self.scope(request).tenant_id, request.match_info["id"])

    async def _page(
        self, request: web.Request, dest: Destination, *, status: int = 200, **extra: Any
    ) -> web.Response:
        dest = await self.service.get(dest.tenant_id, dest.id)  # as it is after a change
        recent, _ = await self.service.list_deliveries(
            DeliveryFilter(tenant_id=dest.tenant_id, destination_id=dest.id), limit=10
        )
        now = time.time()
        health = (await self.service.health([dest], now=now)).get(dest.id)
        hours = await self.service.hourly(dest, now=now)
        pending = None
        if dest.status is DestinationStatus.PENDING_VERIFICATION:
            attempt = verification_attempt_view(await self.service.verification_attempt(dest))
            pending = (
                {"at": attempt["started_at"], "said": attempt_said(attempt)} if attempt else {}
            )
        fields = forms.config_fields(self.registry, dest.type)
        form = extra.get("form")
        context: dict[str, Any] = {
            "dest": {**self._view(dest), **self._health(health)},
            "chart": charts.hourly_chart(hours, now=now, label="per hour, last 24 hours"),
            "fields": fields,
            "rows": {
                f.name: forms.shown_rows(
                    f,
                    form,
                    list(forms.stored_pairs(dest.secrets.get(f.name, dest.config.get(f.name)))),
                    retype=f.input_name in extra.get("errors", {}),
                )
                for f in fields
                if f.pairs
            },
            "recent": [delivery_view(d) for d in recent],
            "catalog_types": await self._catalog(dest.tenant_id),
            "blocked": await self.service.blocked_keys(dest) if dest.ordering == "key" else [],
            "pending": pending,
            "errors": {},
            "form": None,
            "test": None,
            "secret": None,
            "error": None,
        }
        context.update(extra)
        return render("destination.html", request, context, status=status)

    def _audit(self, request: web.Request, action: str, dest: Destination, **fields: Any) -> None:
        self.audit(request, action, tenant_id=dest.tenant_id, destination_id=dest.id, **fields)

    async def _refused(
        self, request: web.Request, dest: Destination, exc: HeraldError
    ) -> web.Response:
        """The destination's page, saying why the service refused an action."""
        return await self._page(request, dest, status=exc.status, error=exc.message)

    def _done(self, request: web.Request, dest: Destination, notice: str) -> web.Response:
        return redirect(with_notice(f"{base(request)}/destinations/{dest.id}", notice))

    async def show(self, request: web.Request) -> web.StreamResponse:
        dest = await self._get(request)
        extra: dict[str, Any] = {}
        test_id = request.query.get("test")
        if test_id:
            try:
                test = await self.service.get_delivery(dest.tenant_id, test_id)
            except NotFound:
                test = None
            if test is not None and test.destination_id == dest.id:
                extra["test"] = delivery_view(test, with_attempts=True)
        flash = flashed(request, "rotated")
        secret = dest.secrets.get("secret")
        if flash and secret and hmac.compare_digest(flash, self._rotated(request, dest.id, secret)):
            # The secret the rotation made, read once: the flash ends with this page.
            extra["secret"] = secret
        response = await self._page(request, dest, **extra)
        if flash is not None:
            clear_flash(request, response)
        return response

    def _rotated(self, request: web.Request, dest_id: str, secret: str) -> str:
        """The flash that shows ``dest``'s new secret once: its id and a MAC of the
        secret under the session's CSRF token (no secret in a cookie, and a flash made
        up by hand shows nothing)."""
        mac = hmac.new(
            self.scope(request).csrf.encode(), f"{dest_id}:{secret}".encode(), hashlib.sha256
        )
        return f"{dest_id}.{mac.hexdigest()[:32]}"

    async def _set_status(self, request: web.Request, status: DestinationStatus) -> web.Response:
        dest = await self._get(request)
        try:
            await self.service.update(dest.tenant_id, dest.id, {"status": status.value})
        except HeraldError as exc:
            return await self._refused(request, dest, exc)
        self._audit(request, "destination_updated", dest, **update_fields({"status": status.value}))
        return self._done(
            request, dest, "paused" if status is DestinationStatus.INACTIVE else "resumed"
        )

    async def pause(self, request: web.Request) -> web.StreamResponse:
        return await self._set_status(request, DestinationStatus.INACTIVE)

    async def resume(self, request: web.Request) -> web.StreamResponse:
        return await self._set_status(request, DestinationStatus.ACTIVE)

    async def send_test(self, request: web.Request) -> web.StreamResponse:
        dest = await self._get(request)
        try:
            delivery = await self.service.test(dest.tenant_id, dest.id)
        except HeraldError as exc:
            return await self._refused(request, dest, exc)
        self._audit(
            request,
            "destination_tested",
            dest,
            delivery_id=delivery.id,
            outcome=delivery.status.value,
        )
        # Its result is a delivery of its own: the page shows it by id (a reload reads it
        # again, and sends nothing).
        return redirect(
            f"{base(request)}/destinations/{dest.id}?{urlencode({'test': delivery.id})}"
        )

    async def verify(self, request: web.Request) -> web.StreamResponse:
        dest = await self._get(request)
        await self.service.verify(dest.tenant_id, dest.id)
        self._audit(request, "destination_verification_sent", dest)
        return self._done(request, dest, "verifying")

    async def rotate_secret(self, request: web.Request) -> web.StreamResponse:
        dest = await self._get(request)
        try:
            _, secret = await self.service.rotate_secret(dest.tenant_id, dest.id)
        except HeraldError as exc:
            return await self._refused(request, dest, exc)
        self._audit(request, "destination_secret_rotated", dest)
        # Shown by the page this redirects to, once (never in a URL or a cookie: the
        # flash names it by a MAC).
        response = redirect(f"{base(request)}/destinations/{dest.id}")
        set_flash(request, response, "rotated", self._rotated(request, dest.id, secret))
        return response

    async def edit(self, request: web.Request) -> web.StreamResponse:
        dest = await self._get(request)
        form = request[FORM]
        fields = forms.config_fields(self.registry, dest.type)
        body = forms.edit_body(form, dest.type, fields, {**dest.config, **dest.secrets})
        try:
            await self.service.update(dest.tenant_id, dest.id, body)
        except HeraldError as exc:
            errors, error = forms.form_errors(exc, dest.type)
            # Credentials typed are not sent back into the page: their inputs show the
            # stored ones masked again, or nothing where the change must give one again.
            sensitive = {f.input_name for f in fields if f.sensitive and not f.pairs}
            kept = forms.without_credentials(_unsigned(form), fields)
            kept.update(dict.fromkeys(sensitive & errors.keys(), ""))
            return await self._page(
                request, dest, status=exc.status, errors=errors, error=error, form=kept
            )
        self._audit(request, "destination_updated", dest, **update_fields(body))
        return self._done(request, dest, "saved")

    async def delete_page(self, request: web.Request) -> web.StreamResponse:
        return render("delete.html", request, {"dest": self._view(await self._get(request))})

    async def delete(self, request: web.Request) -> web.StreamResponse:
        dest = await self._get(request)
        await self.service.delete(dest.tenant_id, dest.id)
        self._audit(request, "destination_deleted", dest)
        return redirect(with_notice(f"{base(request)}/destinations", "deleted"))

    async def new(self, request: web.Request) -> web.StreamResponse:
        form = {k: v for k, v in request.query.items() if k in ("type", "tenant")}
        return await self._create_form(request, form, errors={}, status=200)

    async def _catalog(self, tenant_id: str) -> tuple[str, ...]:
        """The tenant's catalog types (Herald's own among them), offered by the events
        input of the create and edit forms."""
        entries, _ = await self.service.event_types.list(tenant_id, limit=CATALOG_OFFERED)
        return tuple(entry.type for entry in entries)

    async def _create_form(
        self,
        request: web.Request,
        form: Mapping[str, str],
        *,
        errors: Mapping[str, str],
        status: int,
        error: str | None = None,
    ) -> web.Response:
        types = [a.type_id for a in self.registry]
        chosen = self._type_or_first(form)
        fields = forms.config_fields(self.registry, chosen)
        tenant = self.scope(request).tenant(form.get("tenant") or None) or DEFAULT_TENANT
        return render(
            "destination_new.html",
            request,
            {
                "catalog_types": await self._catalog(tenant),
                "types": types,
                "chosen": chosen,
                "fields": fields,
                "rows": {f.name: forms.shown_rows(f, form, []) for f in fields if f.pairs},
                "form": form,
                "errors": errors,
                "error": error,
            },
            status=status,
        )

    async def create(self, request: web.Request) -> web.StreamResponse:
        form = request[FORM]
        tenant = self.scope(request).tenant(form.get("tenant")) or "default"
        fields = forms.config_fields(self.registry, self._type_or_first(form))
        try:
            dest = await self.service.create(tenant, forms.create_body(form, fields))
        except HeraldError as exc:
            errors, error = forms.form_errors(exc, form.get("type", ""))
            # Credentials typed are not sent back into the page.
            kept = forms.without_credentials(_unsigned(form), fields)
            return await self._create_form(
                request, kept, errors=errors, error=error, status=exc.status
            )
        self.audit(request, "destination_created", tenant_id=tenant, destination_id=dest.id)
        return self._done(request, dest, "created")

    def _type_or_first(self, form: Mapping[str, str]) -> str:
        try:
            return self.registry.canonical(form.get("type", ""))
        except HeraldError:
            return next(iter(self.registry)).type_id


def _unsigned(form: Mapping[str, str]) -> dict[str, str]:
    """A form posted, without its CSRF token (a page shown again carries its own)."""
    return {k: v for k, v in form.items() if k != CSRF_FIELD}
