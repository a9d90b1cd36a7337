"""The pages that read what Herald delivered: the overview, the deliveries (filtered
list, one delivery with its attempts, "Retry now"), an event and its deliveries, and
the rejected outbox rows (operators only).

Every lookup is within the request's scope: another tenant's id is a 404."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlencode

import orjson
from aiohttp import web

from herald.console import charts, forms
from herald.console.filters import RANGES, delivery_filter, query_of
from herald.console.pages import (
    PAGE_SIZE,
    Pages,
    base,
    path_segment,
    pretty,
    redirect,
    render,
    with_notice,
)
from herald.errors import HeraldError, NotFound
from herald.model import DeliveryStatus
from herald.timeutil import format_epoch
from herald.views import delivery_view

REJECTED_PAGE = 50
REJECTED_DATA_CHARS = 2000
"""A rejected row's data is shown up to this many characters (a row may hold 1 MB)."""


def success_rate(totals: Mapping[str, int]) -> str:
    finished = totals.get("success", 0) + totals.get("failure", 0)
    if not finished:
        return "–"
    return f"{100 * totals.get('success', 0) / finished:.1f} %"


class DeliveryPages(Pages):
    """``/``, ``/deliveries[/{id}]``, ``/events[/{id}]`` and ``/outbox/rejected``."""

    sources: Callable[[], list[dict[str, object]]] = staticmethod(lambda: [])
    """The outbox sources' state for the overview (the daemon's readers; none without)."""

    async def overview(self, request: web.Request) -> web.StreamResponse:
        ov = await self.service.overview(tenant_id=self.scope(request).tenant_id)
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
        # The outbox sources' state as this daemon's readers last found it (operators).
        sources = self.sources() if self.scope(request).tenant_id is None else []
        return render(
            "overview.html",
            request,
            {"ov": ov, "charts": [hour, day], "rate": success_rate, "sources": sources},
        )

    async def list(self, request: web.Request) -> web.StreamResponse:
        filters, errors, flt = delivery_filter(request.query, self.scope(request))
        items: list[dict[str, Any]] = []
        more = False
        if flt is not None:
            try:
                found, more = await self.service.list_deliveries(
                    flt, before_id=request.query.get("cursor") or None, limit=PAGE_SIZE
                )
            except HeraldError as exc:
                errors[forms.form_field_of(exc.field, "") or "event_type"] = exc.message
                found = []
            items = [{**delivery_view(d), "tenant_id": d.tenant_id} for d in found]
        return self.list_page(
            request,
            "deliveries",
            filters,
            errors,
            items,
            more,
            statuses=[s.value for s in DeliveryStatus],
            ranges=list(RANGES),
            # The same filters, to replay what they match (a dry run first).
            replay_url=f"{base(request)}/replays/new?{query_of(filters)}",
        )

    async def show(self, request: web.Request) -> web.StreamResponse:
        tenant = self.scope(request).tenant_id
        d = await self.service.get_delivery(tenant, request.match_info["id"])
        envelope = None
        try:
            event = await self.service.get_event(d.tenant_id, d.event_id)
        except NotFound:
            event = None  # purged by retention before its deliveries
        if event is not None:
            envelope = pretty(
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
        return render(
            "delivery.html",
            request,
            {"d": view, "envelope": envelope, "retryable": d.kind.value == "event"},
        )

    async def retry(self, request: web.Request) -> web.StreamResponse:
        tenant = self.scope(request).tenant_id
        d = await self.service.retry(tenant, request.match_info["id"])
        self.wake()
        self.audit(request, "delivery_retried", tenant_id=d.tenant_id, delivery_id=d.id)
        return redirect(with_notice(f"{base(request)}/deliveries/{d.id}", "retried"))

    async def event_lookup(self, request: web.Request) -> web.StreamResponse:
        event_id = request.query.get("id", "").strip()
        if not event_id:
            return render("event_lookup.html", request, {})
        tenant = self.scope(request).tenant_id
        asked = request.query.get("tenant") if tenant is None else None
        suffix = f"?{urlencode({'tenant': asked})}" if asked else ""
        return redirect(f"{base(request)}/events/{path_segment(event_id)}{suffix}")

    async def event(self, request: web.Request) -> web.StreamResponse:
        tenant = self.scope(request).tenant(request.query.get("tenant"))
        event, deliveries = await self.service.find_event(tenant, request.match_info["id"])
        return render(
            "event.html",
            request,
            {
                "event": event,
                "envelope": pretty(event.data),
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
        return render("rejected.html", request, {"rows": shown, "chars": REJECTED_DATA_CHARS})
