"""The console's front page: every tenant's (or one tenant's) delivery counts,
from indexed reads and counters only, never a scan of the deliveries."""

from __future__ import annotations

import time
from dataclasses import dataclass

from herald.store import Store

OVERVIEW_REJECTED_MAX = 1000
"""The overview counts rejected outbox rows up to this many ("1000+" past it)."""
OVERVIEW_FAILING_MAX = 5
"""The overview names this many of the destinations failing most."""


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


async def read(store: Store, *, now: float | None = None, tenant_id: str | None = None) -> Overview:
    """What the console's front page shows (of every tenant, or of ``tenant_id``'s
    destinations for the portal), from indexed reads only: finished deliveries by
    outcome per minute over the last hour and per 15 minutes over the last day, the
    pending backlog, the oldest due delivery, rejected rows (operators only)."""
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
    )
