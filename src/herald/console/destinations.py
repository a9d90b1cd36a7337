"""The destination pages: the filtered list, a destination's page and its actions
(pause, resume, test, re-verify, rotate, edit, delete), and the create form.

Every destination is looked up within the request's scope: a portal session asking
for another tenant's id gets the same 404 as for an id that does not exist."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from herald.audit import update_fields
from herald.console import charts, forms
from herald.console.pages import PAGE_SIZE, Pages, base, choice, redirect, render, with_notice
from herald.console.scope import FORM
from herald.console.session import CSRF_FIELD
from herald.errors import HeraldError
from herald.model import DeliveryFilter, Destination, DestinationHealth, DestinationStatus
from herald.views import (
    attempt_said,
    delivery_view,
    destination_view,
    health_view,
    rate_text,
    verification_attempt_view,
)


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
        context: dict[str, Any] = {
            "dest": {**self._view(dest), **self._health(health)},
            "chart": charts.hourly_chart(hours, now=now, label="per hour, last 24 hours"),
            "fields": forms.config_fields(self.registry, dest.type),
            "recent": [delivery_view(d) for d in recent],
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
        return await self._page(request, await self._get(request))

    async def _set_status(self, request: web.Request, status: DestinationStatus) -> web.Response:
        dest = await self._get(request)
        try:
            await self.service.update(dest.tenant_id, dest.id, {"status": status.value})
        except HeraldError as exc:
            return await self._refused(request, dest, exc)
        self.wake()
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
        return await self._page(request, dest, test=delivery_view(delivery, with_attempts=True))

    async def verify(self, request: web.Request) -> web.StreamResponse:
        dest = await self._get(request)
        await self.service.verify(dest.tenant_id, dest.id)
        self.wake()
        self._audit(request, "destination_verification_sent", dest)
        return self._done(request, dest, "verifying")

    async def rotate_secret(self, request: web.Request) -> web.StreamResponse:
        dest = await self._get(request)
        try:
            _, secret = await self.service.rotate_secret(dest.tenant_id, dest.id)
        except HeraldError as exc:
            return await self._refused(request, dest, exc)
        self._audit(request, "destination_secret_rotated", dest)
        # Shown in this response only (never stored in clear, never in a URL).
        return await self._page(request, dest, secret=secret)

    async def edit(self, request: web.Request) -> web.StreamResponse:
        dest = await self._get(request)
        form = request[FORM]
        try:
            await self.service.update(dest.tenant_id, dest.id, forms.edit_body(form, dest.type))
        except HeraldError as exc:
            errors, error = forms.form_errors(exc, dest.type)
            # Credentials typed are not sent back into the page: their inputs show the
            # stored ones masked again, or nothing where the change must give one again.
            sensitive = self._sensitive_inputs(dest.type)
            kept = {k: v for k, v in form.items() if k != CSRF_FIELD and k not in sensitive}
            kept.update(dict.fromkeys(sensitive & errors.keys(), ""))
            return await self._page(
                request, dest, status=exc.status, errors=errors, error=error, form=kept
            )
        self._audit(
            request, "destination_updated", dest, **update_fields(forms.edit_body(form, dest.type))
        )
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
        chosen = self._type_or_first(form)
        return render(
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

    async def create(self, request: web.Request) -> web.StreamResponse:
        form = request[FORM]
        tenant = self.scope(request).tenant(form.get("tenant")) or "default"
        try:
            dest = await self.service.create(tenant, forms.create_body(form))
        except HeraldError as exc:
            errors, error = forms.form_errors(exc, form.get("type", ""))
            # Credentials typed are not sent back into the page.
            sensitive = self._sensitive_inputs(self._type_or_first(form))
            kept = {k: v for k, v in form.items() if k != CSRF_FIELD and k not in sensitive}
            return self._create_form(request, kept, errors=errors, error=error, status=exc.status)
        self.wake()
        self.audit(request, "destination_created", tenant_id=tenant, destination_id=dest.id)
        return self._done(request, dest, "created")

    def _sensitive_inputs(self, type_name: str) -> set[str]:
        """The form inputs of ``type_name``'s credentials."""
        return {f.input_name for f in forms.config_fields(self.registry, type_name) if f.sensitive}

    def _type_or_first(self, form: Mapping[str, str]) -> str:
        try:
            return self.registry.canonical(form.get("type", ""))
        except HeraldError:
            return next(iter(self.registry)).type_id
