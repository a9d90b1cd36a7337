"""The console's front page: every tenant's (or one tenant's) delivery counts,
from indexed reads and counters only, never a scan of the deliveries.

A delivery ends as ``failure`` only after its last retry (hours after its first
failed attempt), so the page also reads what attempts are doing now: the
destinations in a failing episode (with since when and their last error) and the
recorder's attempts per hour."""

from __future__ import annotations

import time
from dataclasses import dataclass

from herald.model import HourCount
from herald.store import Store
from herald.store.counters import HOUR
from herald.store.recent import FailedAttempt, FailingDestination

OVERVIEW_REJECTED_MAX = 1000
"""The overview counts rejected outbox rows up to this many ("1000+" past it)."""
OVERVIEW_FAILING_MAX = 5
"""The overview names this many of the destinations failing most."""
OVERVIEW_FAILING_NOW_MAX = 20
"""The overview names this many destinations in a failing episode (the longest first)."""


@dataclass(frozen=True, slots=True)
class FailingNow:
    """A destination in a failing episode, as the overview shows it."""

    destination: FailingDestination
    failed_attempts: int
    """Its failed attempts since the overview's ``attempts_since``."""
    last: FailedAttempt | None
    """Its latest failed attempt (None if retention removed it)."""


@dataclass(frozen=True, slots=True)
class Overview:
    """The operator console's front page: counts, never rows."""

    now: float
    last_hour: list[tuple[str, int, int]]
    """(outcome, minute number since the epoch, finished deliveries) over the last hour."""
    last_day: list[tuple[str, int, int]]
    """The same in 15-minute buckets over the last 24 hours."""
    due: int
    scheduled_retry: int
    held: int
    oldest_due_age: float | None
    rejected: int
    in_flight: int
    failing: list[tuple[str, str, int]]
    """(destination id, name, failed deliveries) over the last hour, the most first."""
    failing_now: list[FailingNow]
    """Destinations in a failing episode now, the longest failing first."""
    attempts_since: float
    """The start of the previous clock hour: the attempt counters count by hour."""
    attempts: int
    failed_attempts: int
    """Every attempt (and the failed ones) since ``attempts_since``."""
    attempt_hours: list[HourCount]
    """The attempts of each hour over the last 24 hours (hours without one left out)."""


async def read(store: Store, *, now: float | None = None, tenant_id: str | None = None) -> Overview:
    """What the console's front page shows (of every tenant, or of ``tenant_id``'s
    destinations for the portal), from indexed reads only: finished deliveries by
    outcome per minute over the last hour and per 15 minutes over the last day, the
    pending backlog, the oldest due delivery, rejected rows (operators only), the
    destinations failing now and the attempts per hour from the counters."""
    now = time.time() if now is None else now
    one = {"tenant_id": tenant_id}
    hour = await store.outcome_counts(since=now - 3600, bucket_seconds=60, **one)
    day = await store.outcome_counts(since=now - 86_400, bucket_seconds=900, **one)
    backlog = await store.delivery_counts(now=now, **one)
    next_due = await store.next_due_at(**one)
    oldest_due_age = None if next_due is None or next_due > now else now - next_due
    rejected = 0
    if tenant_id is None:
        rejected = await store.count_rejected(up_to=OVERVIEW_REJECTED_MAX + 1)
    failing = []
    for dest_id, failures in await store.failing_destinations(
        since=now - 3600, limit=OVERVIEW_FAILING_MAX, **one
    ):
        dest = await store.get_destination(tenant_id, dest_id)
        failing.append((dest_id, dest.name if dest else dest_id, failures))
    failing_now = await _failing_now(store, now=now, tenant_id=tenant_id)
    hours = await store.attempt_hours(since=now - 23 * HOUR, tenant_id=tenant_id)
    since = (int(now // HOUR) - 1) * HOUR
    recent = [h for h in hours if h.hour * HOUR >= since]
    return Overview(
        now=now,
        last_hour=hour,
        last_day=day,
        due=backlog["due"],
        scheduled_retry=backlog["scheduled_retry"],
        held=backlog["held"],
        oldest_due_age=oldest_due_age,
        rejected=rejected,
        in_flight=await store.in_flight(**one),
        failing=failing,
        failing_now=failing_now,
        attempts_since=since,
        attempts=sum(h.successes + h.failures for h in recent),
        failed_attempts=sum(h.failures for h in recent),
        attempt_hours=hours,
    )


async def _failing_now(store: Store, *, now: float, tenant_id: str | None) -> list[FailingNow]:
    """The destinations in a failing episode, each with its failed attempts since the
    previous clock hour and its last error."""
    found = await store.failing_now(limit=OVERVIEW_FAILING_NOW_MAX, tenant_id=tenant_id)
    since = (int(now // HOUR) - 1) * HOUR
    counts = await store.attempts_since([f.id for f in found], since=since)
    return [
        FailingNow(
            f,
            failed_attempts=counts.get(f.id, (0, 0))[1],
            last=await store.last_failed_attempt(f.id),
        )
        for f in found
    ]
