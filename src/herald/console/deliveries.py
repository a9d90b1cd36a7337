"""The pages that read what Herald delivered: the overview, the deliveries (filtered
list, one delivery with its attempts, "Retry now"), the events (newest first, and the
lookup by id), an event and its deliveries, and the rejected outbox rows (operators
only).

Every lookup is within the request's scope: another tenant's id is a 404."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal
from urllib.parse import urlencode

from aiohttp import web

from herald.console import charts, forms
from herald.console.filters import (
    RANGES,
    delivery_filter,
    event_filter,
    events_cursor,
    query_of,
)
from herald.console.pages import (
    PAGE_SIZE,
    Pages,
    base,
    clear_flash,
    flashed,
    path_segment,
    pretty,
    redirect,
    render,
    set_flash,
)
from herald.console.sent import sent_view
from herald.errors import HeraldError, NotFound
from herald.events import EventSummary
from herald.model import Attempt, Delivery, DeliveryStatus
from herald.timeutil import format_epoch

REJECTED_PAGE = 50
REJECTED_DATA_CHARS = 2000
"""A rejected row's data is shown up to this many characters (a row may hold 1 MB)."""


RETRY_REFRESH_SECONDS = 2
"""How often a delivery's page reloads itself while its retry's attempt is awaited."""


def retry_state(flash: str | None, d: Delivery) -> Attempt | Literal["pending", "held"] | None:
    """What the page says of a "Retry now" (``flash``: the delivery's id and its attempt
    count when it was retried): "pending" until an attempt after those lands, then that
    attempt; "held" when its destination is paused (no attempt comes until it is
    resumed); None when the flash is not this delivery's, or it ended without one (a
    destination deleted meanwhile)."""
    if flash is None:
        return None
    delivery_id, _, count = flash.rpartition(".")
    if delivery_id != d.id or not count.isdigit():
        return None
    landed = [a for a in d.attempts if a.number > int(count)]
    if landed:
        return landed[0]
    if d.status is not DeliveryStatus.PENDING:
        return None
    return "held" if d.held else "pending"


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
        attempts = charts.hourly_chart(
            ov.attempt_hours, now=ov.now, label="last 24 hours, per hour"
        )
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
            {
                "ov": ov,
                "attempts_chart": attempts,
                "charts": [hour, day],
                "rate": success_rate,
                "now": ov.now,
                "sources": sources,
            },
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
            names = await self.destination_names(flt.tenant_id, [d.destination_id for d in found])
            items = [self.delivery_item(d, names) for d in found]
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
        try:
            event = await self.service.get_event(d.tenant_id, d.event_id)
        except NotFound:
            event = None  # purged by retention before its deliveries
        # The body every attempt sent: the stored event's envelope, byte for byte.
        body = None if event is None else event.envelope()
        names = await self.destination_names(tenant, [d.destination_id])
        view = self.delivery_item(d, names, with_attempts=True)
        retried = retry_state(flashed(request, "retried"), d)
        response = render(
            "delivery.html",
            request,
            {
                "d": view,
                "envelope": None if body is None else pretty(body),
                "sent": [sent_view(a, body) for a in reversed(d.attempts)],
                "retryable": d.kind.value == "event",
                "retried": retried,
                "refresh": RETRY_REFRESH_SECONDS if retried == "pending" else None,
            },
        )
        if retried is not None and retried != "pending":
            clear_flash(request, response)  # the outcome is shown once
        return response

    async def retry(self, request: web.Request) -> web.StreamResponse:
        tenant = self.scope(request).tenant_id
        # The attempts made before: the retry's may land before its answer is read.
        before = await self.service.get_delivery(tenant, request.match_info["id"])
        d = await self.service.retry(tenant, before.id)
        self.audit(request, "delivery_retried", tenant_id=d.tenant_id, delivery_id=d.id)
        response = redirect(f"{base(request)}/deliveries/{d.id}")
        # The page waits for the attempt after those made so far, and shows its outcome.
        set_flash(request, response, "retried", f"{d.id}.{before.attempt_count}")
        return response

    async def events(self, request: web.Request) -> web.StreamResponse:
        """The events list, newest first; with ``id``, the lookup of one event."""
        event_id = request.query.get("id", "").strip()
        tenant = self.scope(request).tenant_id
        if event_id:
            asked = request.query.get("tenant") if tenant is None else None
            suffix = f"?{urlencode({'tenant': asked})}" if asked else ""
            return redirect(f"{base(request)}/events/{path_segment(event_id)}{suffix}")
        filters, errors, flt = event_filter(request.query, self.scope(request))
        found: list[EventSummary] = []
        more = False
        if flt is not None:
            try:
                found, more = await self.service.recent_events(
                    flt.tenant_id,
                    type=flt.type,
                    since=flt.since,
                    until=flt.until,
                    after=flt.after,
                    limit=PAGE_SIZE,
                )
            except HeraldError as exc:
                errors["type"] = exc.message
        next_url = None
        if more and found:
            kept = {k: v for k, v in filters.items() if v}
            cursor = events_cursor(found[-1])
            next_url = f"{base(request)}/events?{urlencode({**kept, 'cursor': cursor})}"
        return render(
            "events.html",
            request,
            {
                "filters": filters,
                "errors": errors,
                "items": found,
                "next_url": next_url,
                "ranges": list(RANGES),
            },
            status=400 if errors else 200,
        )

    async def event(self, request: web.Request) -> web.StreamResponse:
        tenant = self.scope(request).tenant(request.query.get("tenant"))
        event, deliveries = await self.service.find_event(tenant, request.match_info["id"])
        names = await self.destination_names(tenant, [d.destination_id for d in deliveries])
        return render(
            "event.html",
            request,
            {
                "event": event,
                "envelope": pretty(event.data),
                "deliveries": [self.delivery_item(d, names) for d in deliveries],
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
