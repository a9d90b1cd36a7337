"""The deliveries' filter as the pages take it: the query (or a form) of the
deliveries list, the replay form and its confirmation, to a ``DeliveryFilter``.

The values are kept as typed (to fill the form again and to carry them in links);
a value that cannot be read gets its message beside its field."""

from __future__ import annotations

import time
from collections.abc import Mapping
from urllib.parse import urlencode

from herald.console.pages import choice
from herald.console.scope import Scope
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


def query_of(filters: Mapping[str, str]) -> str:
    """The filled-in filters as a query string (empty ones left out)."""
    return urlencode({k: v for k, v in filters.items() if v})
