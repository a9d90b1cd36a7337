"""The store's part that keeps per-destination counters as attempts are recorded:
when each destination last answered well and badly, and its attempts per hour.

They are written inside :meth:`~herald.store.engine.EngineStore.record_attempts`'
transaction, last and in destination order (the lock order), so that concurrent
recorders add up without losing a count or deadlocking; the console and the CLI
read them by primary key and never scan ``herald_deliveries``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from herald.model import AttemptRecord, DestinationHealth, HourCount, Outcome
from herald.store.dialect import Conn, Dialect
from herald.store.part import StorePart

HOUR = 3600
RATE_HOURS = 24
"""The failure rate counts the attempts of the current hour and the 23 before it."""


def tally(
    records: Iterable[AttemptRecord],
) -> tuple[list[tuple[str, float | None, float | None]], list[tuple[str, int, int, int]]]:
    """What ``records`` add to the counters, sorted by destination (the lock order):
    (destination, last success, last failure) and (destination, hour, successes,
    failures) rows. An attempt counts at its start."""
    last: dict[str, list[float | None]] = {}
    hours: dict[tuple[str, int], list[int]] = {}
    for r in records:
        if r.item is None:
            continue
        dest, at = r.item.destination_id, r.attempt.started_at
        ok = r.attempt.outcome is Outcome.SUCCESS
        seen = last.setdefault(dest, [None, None])
        slot = 0 if ok else 1
        previous = seen[slot]
        if previous is None or at > previous:
            seen[slot] = at
        counts = hours.setdefault((dest, int(at // HOUR)), [0, 0])
        counts[slot] += 1
    return (
        [(dest, s, f) for dest, (s, f) in sorted(last.items())],
        [(dest, hour, s, f) for (dest, hour), (s, f) in sorted(hours.items())],
    )


async def count_attempts(d: Dialect, c: Conn, records: Sequence[AttemptRecord]) -> None:
    """Inside :meth:`~herald.store.engine.EngineStore.record_attempts`' transaction,
    after every other write."""
    last, hours = tally(records)
    if last:
        await d.executemany(c, "count_last", last)
        await d.executemany(c, "count_hour", hours)


async def purge_hours(d: Dialect, c: Conn, *, before: float, limit: int) -> None:
    """Inside the purge's transaction: hours that ended before ``before``."""
    await d.execute(c, "purge_hours", int(before // HOUR), limit)


class CounterStore(StorePart):
    """Per-destination counters, read by destination (written by the functions above)."""

    async def destination_health(
        self, ids: Sequence[str], *, now: float
    ) -> dict[str, DestinationHealth]:
        """The counters of the destinations ``ids`` (those without any attempt left out)."""
        if not ids:
            return {}
        d = self.dialect
        first = int(now // HOUR) - (RATE_HOURS - 1)
        last: dict[str, tuple[Any, Any]] = {
            str(r[0]): (r[1], r[2]) for r in await d.read("destination_last", list(ids))
        }
        rates: dict[str, tuple[int, int]] = {
            str(r[0]): (int(r[1]), int(r[2]))
            for r in await d.read("destination_rates", first, list(ids))
        }
        return {
            dest: DestinationHealth(
                last_success_at=_epoch(last.get(dest, (None, None))[0]),
                last_failure_at=_epoch(last.get(dest, (None, None))[1]),
                successes=rates.get(dest, (0, 0))[0],
                failures=rates.get(dest, (0, 0))[1],
            )
            for dest in {*last, *rates}
        }

    async def destination_hours(self, dest_id: str, *, now: float) -> list[HourCount]:
        """One destination's attempts per hour over the last 24 hours, oldest first
        (hours without an attempt left out)."""
        first = int(now // HOUR) - (RATE_HOURS - 1)
        rows = await self.dialect.read("destination_hours", dest_id, first)
        return [HourCount(int(r[0]), int(r[1]), int(r[2])) for r in rows]


def _epoch(value: Any) -> float | None:
    return None if value is None else float(value)
