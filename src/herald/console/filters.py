"""The lists' filters as the pages take them: the query (or a form) of the
deliveries list, the replay form and its confirmation, to a ``DeliveryFilter``; the
events list's query to an ``EventFilter``.

The values are kept as typed (to fill the form again and to carry them in links);
a value that cannot be read gets its message beside its field."""

from __future__ import annotations

import base64
import binascii
import time
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlencode

import orjson

from herald.console.pages import choice
from herald.console.scope import Scope
from herald.events import EventsPage, EventSummary
from herald.model import DeliveryFilter, DeliveryStatus
from herald.timeutil import parse_timestamp

FILTER_FIELDS = (
    "status",
    "destination",
    "event_type",
    "replay",
    "tenant",
    "range",
    "since",
    "until",
)
RANGES = {"15m": 900, "1h": 3600, "24h": 86_400, "7d": 7 * 86_400}
"""The "created in the last" choices, in seconds."""


def delivery_filter(
    given: Mapping[str, str], scope: Scope, *, now: float | None = None
) -> tuple[dict[str, str], dict[str, str], DeliveryFilter | None]:
    """The filter fields as typed, the problems by field, and the filter (None when
    there are problems). The tenant is the scope's for a portal session, whatever
    was asked."""
    filters = {k: str(given.get(k, "")).strip() for k in FILTER_FIELDS}
    errors: dict[str, str] = {}
    status = choice(DeliveryStatus, filters, errors, "Choose pending, success or failure.")
    since, until = time_range(filters, errors, now=now)
    if errors:
        return filters, errors, None
    flt = DeliveryFilter(
        tenant_id=scope.tenant(filters["tenant"]),
        destination_id=filters["destination"] or None,
        status=status,
        event_types=(filters["event_type"],) if filters["event_type"] else (),
        replay_id=filters["replay"] or None,
        since=since,
        until=until,
    )
    return filters, errors, flt


def time_range(
    filters: Mapping[str, str], errors: dict[str, str], *, now: float | None = None
) -> tuple[float | None, float | None]:
    """The ``range`` ("in the last …"), ``since`` and ``until`` fields as epoch bounds
    (the later start of the two), their problems put in ``errors``."""
    since = until = None
    if filters["range"]:
        if filters["range"] not in RANGES:
            errors["range"] = "Choose one of the listed ranges."
        else:
            since = (time.time() if now is None else now) - RANGES[filters["range"]]
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
    return since, until


EVENT_FILTER_FIELDS = ("type", "tenant", "range", "since", "until")


@dataclass(frozen=True, slots=True)
class EventFilter:
    """What the events list asks for: one tenant (None: every tenant's, operators only),
    one type, a time range of when Herald received them, and where the page starts."""

    tenant_id: str | None
    type: str | None
    since: float | None
    until: float | None
    after: EventsPage | None


def event_filter(
    given: Mapping[str, str], scope: Scope, *, now: float | None = None
) -> tuple[dict[str, str], dict[str, str], EventFilter | None]:
    """The events list's fields as typed, their problems by field, and the filter (None
    when there are problems). A portal session's tenant is its own, whatever was asked."""
    filters = {k: str(given.get(k, "")).strip() for k in EVENT_FILTER_FIELDS}
    errors: dict[str, str] = {}
    since, until = time_range(filters, errors, now=now)
    after = None
    cursor = str(given.get("cursor", "")).strip()
    if cursor:
        after = _events_page(cursor)
        if after is None:
            errors["cursor"] = "This page link is damaged; start again from the first page."
    if errors:
        return filters, errors, None
    flt = EventFilter(
        tenant_id=scope.tenant(filters["tenant"]),
        type=filters["type"] or None,
        since=since,
        until=until,
        after=after,
    )
    return filters, errors, flt


def events_cursor(last: EventSummary) -> str:
    """Where the page after the one ending with ``last`` starts (a position, not a
    secret: the scope still decides whose events are read)."""
    raw = orjson.dumps([last.ingested_at, last.id, last.tenant_id])
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _events_page(cursor: str) -> EventsPage | None:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        at, event_id, tenant = orjson.loads(raw)
    except (binascii.Error, ValueError, TypeError):
        return None
    if not isinstance(at, int | float) or not isinstance(event_id, str):
        return None
    if not isinstance(tenant, str):
        return None
    return EventsPage(float(at), event_id, tenant)


def query_of(filters: Mapping[str, str]) -> str:
    """The filled-in filters as a query string (empty ones left out)."""
    return urlencode({k: v for k, v in filters.items() if v})
