"""Herald's own Prometheus collectors: plain state counted where it happens (on the
event loop, without prometheus-client's lock per increment) and turned into metric
families only when Prometheus scrapes (``herald.metrics`` registers them).
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import cast

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

__all__ = ["DATABASE_FAILURE_MEMORY", "AttemptCollector", "Health", "Snapshots", "Taken"]

# Resolves the 5 s webhook deadline: fine steps below it, a few above for other types.
ATTEMPT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 3, 4, 4.5, 5, 7.5, 10, 30, 60)
LATENCY_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    300,
    900,
    3600,
    14400,
    86400,
)
DATABASE_FAILURE_MEMORY = 30.0
"""Seconds a component's failed database round trip keeps ``herald_database_up`` at 0
unless that component succeeds first. Components that keep failing retry within 5 s
and renew it; a rare caller (retention, an API request) that failed once during an
outage cannot hold the gauge at 0 long after the database is back."""

_go_float = cast(Callable[[float], str], floatToGoString)  # untyped in prometheus-client
ATTEMPT_LE = tuple(_go_float(b) for b in (*ATTEMPT_BUCKETS, float("inf")))
LATENCY_LE = tuple(_go_float(b) for b in (*LATENCY_BUCKETS, float("inf")))


class Buckets:
    """One histogram series: counts per bucket (not cumulative) and the sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # a bucket is "<= its bound"
        self.sum += value

    def cumulative(self, le: tuple[str, ...]) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip(le, self.counts, strict=True):
            running += count
            out.append((bound, running))
        return out


class Taken(Collector):
    """``herald_deliveries_taken_total``: plain ints the dispatcher counts, read at a
    scrape (no lock and no call per delivery)."""

    def __init__(self, read: Callable[[], Mapping[str, int]]) -> None:
        self._read = read

    def describe(self) -> Iterable[Metric]:
        return [self._family()]

    def collect(self) -> Iterable[Metric]:
        family = self._family()
        for via, count in self._read().items():
            family.add_metric([via], count)
        return [family]

    @staticmethod
    def _family() -> CounterMetricFamily:
        return CounterMetricFamily(
            "herald_deliveries_taken",
            "Deliveries taken to attempt, by how: handover (stored leased by the relay,"
            " started without a claim) or claim (claimed from the table)",
            labels=["via"],
        )


class AttemptCollector(Collector):
    """The metrics counted once per attempt, kept in plain ints and floats.

    prometheus-client's Counter and Histogram take a lock per increment (four per
    attempt here); at thousands of attempts a second that was a measurable share
    of the engine's time. Attempts are counted on the event loop's thread, and a
    scrape reads the counts on that same thread, so no lock is needed."""

    def __init__(self, *, per_destination: bool) -> None:
        self.per_destination = per_destination
        self._created = time.time()
        self.attempts: dict[tuple[str, ...], int] = {}
        self.completed: dict[tuple[str, ...], int] = {}
        self.durations: dict[str, Buckets] = {}
        self.latencies: dict[str, Buckets] = {}

    def observe(
        self,
        *,
        destination_type: str,
        destination_id: str,
        outcome: str,
        duration: float,
        final_status: str | None,
        latency: float | None,
    ) -> None:
        per_dest = self.per_destination
        key = (
            (destination_type, outcome, destination_id) if per_dest else (destination_type, outcome)
        )
        attempts = self.attempts
        attempts[key] = attempts.get(key, 0) + 1
        if final_status is not None:
            key = (
                (destination_type, final_status, destination_id)
                if per_dest
                else (destination_type, final_status)
            )
            completed = self.completed
            completed[key] = completed.get(key, 0) + 1
        series = self.durations.get(destination_type)
        if series is None:
            series = self.durations[destination_type] = Buckets(ATTEMPT_BUCKETS)
        series.observe(duration)
        if latency is not None:
            series = self.latencies.get(destination_type)
            if series is None:
                series = self.latencies[destination_type] = Buckets(LATENCY_BUCKETS)
            series.observe(max(latency, 0.0))

    def describe(self) -> Iterable[Metric]:
        return self._families()

    def collect(self) -> Iterable[Metric]:
        return self._families(with_samples=True)

    def _families(self, *, with_samples: bool = False) -> Iterator[Metric]:
        extra = ["destination_id"] if self.per_destination else []
        attempts = CounterMetricFamily(
            "herald_delivery_attempts",
            "Delivery attempts by outcome",
            labels=["destination_type", "outcome", *extra],
        )
        completed = CounterMetricFamily(
            "herald_deliveries_completed",
            "Deliveries that reached a final status",
            labels=["destination_type", "status", *extra],
        )
        durations = HistogramMetricFamily(
            "herald_delivery_attempt_duration_seconds",
            "Duration of one attempt",
            labels=["destination_type"],
        )
        latencies = HistogramMetricFamily(
            "herald_event_delivery_latency_seconds",
            "From the event's created_at to its first successful delivery",
            labels=["destination_type"],
        )
        if with_samples:
            for labels, value in list(self.attempts.items()):
                attempts.add_metric(labels, value, created=self._created)
            for labels, value in list(self.completed.items()):
                completed.add_metric(labels, value, created=self._created)
            for type_id, series in list(self.durations.items()):
                durations.add_metric([type_id], series.cumulative(ATTEMPT_LE), series.sum)
            for type_id, series in list(self.latencies.items()):
                latencies.add_metric([type_id], series.cumulative(LATENCY_LE), series.sum)
        yield from (attempts, completed, durations, latencies)


class Snapshots(Collector):
    """Values read from the database, each group exposed only while its last read
    succeeded: a group whose read fails is dropped, so its series go stale."""

    def __init__(self) -> None:
        self._groups: dict[str, list[Metric]] = {}

    def set(self, group: str, families: list[Metric]) -> None:
        self._groups[group] = families

    def drop(self, group: str) -> None:
        self._groups.pop(group, None)

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        for families in list(self._groups.values()):
            yield from families


class Health(Collector):
    """``herald_database_up`` and ``herald_component_up``, computed at scrape time."""

    def __init__(self) -> None:
        self.failures: dict[str, float] = {}
        """Component -> when its last database round trip failed (none since succeeded)."""
        self.reached = False
        self.components: dict[str, Callable[[], bool]] = {}

    def database_up(self) -> bool:
        horizon = time.monotonic() - DATABASE_FAILURE_MEMORY
        return self.reached and not any(t > horizon for t in self.failures.values())

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        db = GaugeMetricFamily(
            "herald_database_up",
            "1 when the last database round trip of every component succeeded",
        )
        db.add_metric([], 1.0 if self.database_up() else 0.0)
        up = GaugeMetricFamily(
            "herald_component_up",
            "1 when a component of the daemon runs and can do its work",
            labels=["component"],
        )
        for name, check in list(self.components.items()):
            up.add_metric([name], 1.0 if check() else 0.0)
        yield from (db, up)
