"""The store's part that reads what is happening now, for the console's and the
portal's overview and their events list: the destinations in a failing episode and
the error of their latest failed attempt, attempts per hour from the counters, and a
page of recent events.

Every read is by an index (``herald_destinations_failing``, the counters' keys,
``herald_events_ingested``) and bounded by a limit; none counts ``herald_deliveries``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from herald.model import HourCount
from herald.store.counters import HOUR
from herald.store.part import StorePart

NO_END = 1e18
"""The upper bound of a time range left open (an index range needs a value, not NULL)."""


@dataclass(frozen=True, slots=True)
class FailingDestination:
    """A destination in a failing episode (``herald.destination.failing``)."""

    id: str
    tenant_id: str
    name: str
    failing_since: float
    consecutive_failures: int


@dataclass(frozen=True, slots=True)
class FailedAttempt:
    """What a destination answered last time it failed."""

    started_at: float
    response_status: int | None
    error: str | None


@dataclass(frozen=True, slots=True)
class EventSummary:
    """One line of the events list (without the data, which may be a megabyte)."""

    id: str
    tenant_id: str
    type: str
    created_at: str
    ingested_at: float


@dataclass(frozen=True, slots=True)
class EventsPage:
    """Where a page of events starts: past this (ingested_at, id, tenant) of the
    previous page's last event."""

    ingested_at: float
    id: str
    tenant_id: str


class RecentStore(StorePart):
    """Failing destinations, attempts per hour and recent events, as they are now."""

    async def failing_now(
        self, *, limit: int, tenant_id: str | None = None
    ) -> list[FailingDestination]:
        """Destinations in a failing episode, the longest failing first (every
        tenant's, or ``tenant_id``'s)."""
        rows = await self.dialect.read("failing_now", tenant_id, limit)
        return [
            FailingDestination(str(r[0]), str(r[1]), str(r[2]), float(r[3]), int(r[4]))
            for r in rows
        ]

    async def last_failed_attempt(self, dest_id: str) -> FailedAttempt | None:
        """The last attempt of ``dest_id``'s newest delivery that failed its last
        attempt (the error a failing destination answers with now)."""
        rows = await self.dialect.read("last_failed_attempt", dest_id)
        if not rows:
            return None
        started, status, error = rows[0]
        return FailedAttempt(float(started), None if status is None else int(status), error)

    async def attempt_hours(self, *, since: float, tenant_id: str | None = None) -> list[HourCount]:
        """The attempts of every hour since ``since``'s, the oldest first, from the
        recorder's counters (of ``tenant_id``'s destinations when given); hours without
        an attempt left out."""
        first = int(since // HOUR)
        rows = await self._read_for("attempt_hours", "tenant_attempt_hours", tenant_id, first)
        counts = sorted((int(r[0]), int(r[1] or 0), int(r[2] or 0)) for r in rows)
        return [HourCount(*c) for c in counts]

    async def attempts_since(
        self, ids: Sequence[str], *, since: float
    ) -> dict[str, tuple[int, int]]:
        """Destination -> (successful, failed attempts) since ``since``'s hour."""
        if not ids:
            return {}
        rows = await self.dialect.read("destination_rates", int(since // HOUR), list(ids))
        return {str(r[0]): (int(r[1] or 0), int(r[2] or 0)) for r in rows}

    async def list_events(
        self,
        *,
        tenant_id: str | None,
        type: str | None,
        since: float | None,
        until: float | None,
        after: EventsPage | None,
        limit: int,
    ) -> list[EventSummary]:
        """Events newest first (by when Herald stored them, then id, then tenant),
        received within [``since``, ``until``], past ``after``; every tenant's or
        ``tenant_id``'s, every type or ``type``."""
        upper = NO_END if until is None else until
        if after is not None:
            upper = min(upper, after.ingested_at)
        args: list[Any] = [
            tenant_id,
            type,
            0.0 if since is None else since,
            upper,
            None if after is None else after.id,
            None if after is None else after.tenant_id,
            limit,
        ]
        rows = await self.dialect.read("list_events", *args)
        return [EventSummary(str(r[0]), str(r[1]), str(r[2]), str(r[3]), float(r[4])) for r in rows]
