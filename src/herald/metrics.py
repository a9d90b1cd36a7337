"""Every Prometheus metric of Herald, under the ``herald_`` prefix, in one place.

One method per action keeps label values bounded and in one vocabulary:
destination type, outcome, status, reason class — never event ids. A
per-destination label exists only behind ``metrics.per_destination``, since
tenants can create many destinations. Gauges that need a database count are
refreshed by a background task on an interval, not per scrape.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import cast

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Info,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from herald import __version__
from herald.model import (
    AttemptRecord,
    DeliveryKind,
    DeliveryStatus,
    DueDelivery,
    Instance,
    Outcome,
    Recorded,
    RelayPlan,
)

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
PENDING_STATES = ("due", "scheduled_retry", "held")

__all__ = ["CONTENT_TYPE", "Metrics"]

_go_float = cast(Callable[[float], str], floatToGoString)  # untyped in prometheus-client
ATTEMPT_LE = tuple(_go_float(b) for b in (*ATTEMPT_BUCKETS, float("inf")))
LATENCY_LE = tuple(_go_float(b) for b in (*LATENCY_BUCKETS, float("inf")))


class _Buckets:
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
        self.durations: dict[str, _Buckets] = {}
        self.latencies: dict[str, _Buckets] = {}

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
            series = self.durations[destination_type] = _Buckets(ATTEMPT_BUCKETS)
        series.observe(duration)
        if latency is not None:
            series = self.latencies.get(destination_type)
            if series is None:
                series = self.latencies[destination_type] = _Buckets(LATENCY_BUCKETS)
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


class Metrics:
    """The one container of every metric; a method per action that moves one."""

    def __init__(self, *, per_destination: bool = False) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.per_destination = per_destination
        r = self.registry
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        info = Info("herald_build", "Herald build information", registry=r)
        info.info({"version": __version__})
        counter, gauge = self._counter, self._gauge
        self.events_ingested = counter(
            "herald_events_ingested", "Events taken from the outbox and stored"
        )
        self.outbox_rejected = counter(
            "herald_outbox_rejected", "Outbox rows rejected, by reason", "reason"
        )
        self.outbox_pending = gauge("herald_outbox_pending", "Rows waiting in the outbox")
        self.outbox_lag = gauge(
            "herald_outbox_lag_seconds", "Age of the oldest unclaimed outbox row (0 when empty)"
        )
        self.attempts = AttemptCollector(per_destination=per_destination)
        r.register(self.attempts)
        self.pending = gauge(
            "herald_deliveries_pending",
            "Pending deliveries: due now, waiting for a scheduled retry, or held",
            "state",
        )
        self.destinations = gauge(
            "herald_destinations", "Event destinations by type and status", "type", "status"
        )
        self.inflight = gauge("herald_inflight_attempts", "Attempts in flight in this process")
        self.up = gauge(
            "herald_component_up", "1 when a component of the daemon is running", "component"
        )
        self.storage_errors = counter(
            "herald_storage_errors", "Database operations that failed and were retried", "operation"
        )
        self.replayed = counter(
            "herald_deliveries_replayed", "Deliveries re-queued by retry or replay"
        )
        self.instances = gauge(
            "herald_instances", "Herald instances on this database whose heartbeat is current"
        )
        self.instances_reaped = counter(
            "herald_instances_reaped",
            "Instances presumed dead after missing heartbeats (their leases released)",
        )
        self.exhausted = counter(
            "herald_deliveries_exhausted",
            "Event deliveries that ran out of attempts (status failure), by destination type",
            "type",
        )
        self.failing = gauge(
            "herald_destinations_failing",
            "Destinations in a failing episode (signals.failing_after_attempts consecutive"
            " failed attempts, no success since)",
        )
        self.leases_released = counter(
            "herald_leases_released",
            "Deliveries leased by a dead instance and released for others to attempt",
        )

    def _counter(self, name: str, documentation: str, *labels: str) -> Counter:
        return Counter(name, documentation, labels, registry=self.registry)

    def _gauge(self, name: str, documentation: str, *labels: str) -> Gauge:
        return Gauge(name, documentation, labels, registry=self.registry)

    # --- one method per action --------------------------------------------------
    def attempt_recorded(self, type_id: str, record: AttemptRecord, item: DueDelivery) -> None:
        """An attempt ended and its record goes to the database (once per attempt: hot)."""
        attempt = record.attempt
        final = None if record.status is DeliveryStatus.PENDING else record.status.value
        latency = None
        if attempt.outcome is Outcome.SUCCESS and item.kind is DeliveryKind.EVENT:
            latency = attempt.started_at + attempt.duration_ms / 1000 - item.event.created_ts
        self.attempts.observe(
            destination_type=type_id,
            destination_id=item.destination_id,
            outcome=attempt.outcome.value,
            duration=attempt.duration_ms / 1000,
            final_status=final if item.kind is DeliveryKind.EVENT else None,
            latency=latency,
        )

    def relayed(self, plan: RelayPlan) -> None:
        """The relay committed one batch: its events in, its rejected rows out."""
        if plan.events:
            self.events_ingested.inc(len(plan.events))
        for rejection in plan.rejected:
            # Reasons look like "invalid_json: detail"; only the code is a label.
            self.outbox_rejected.labels(reason=rejection.reason.split(":", 1)[0]).inc()

    def outbox_counted(self, pending: int, oldest: float | None, *, now: float) -> None:
        """The outbox holds ``pending`` rows, the oldest created at ``oldest``."""
        self.outbox_pending.set(pending)
        self.outbox_lag.set(0.0 if oldest is None else max(now - oldest, 0.0))

    def pending_counted(self, counts: Mapping[str, int]) -> None:
        for state in PENDING_STATES:
            self.pending.labels(state).set(counts.get(state, 0))

    def destinations_counted(self, rows: Iterable[tuple[str, str, int]]) -> None:
        self.destinations.clear()
        for type_, status, count in rows:
            self.destinations.labels(type_, status).set(count)

    def signals_recorded(self, recorded: Recorded) -> None:
        """A recording committed: the deliveries it exhausted (by destination type)."""
        for type_ in recorded.exhausted:
            self.exhausted.labels(type_).inc()

    def failing_counted(self, count: int) -> None:
        self.failing.set(count)

    def track_inflight(self, read: Callable[[], float]) -> None:
        self.inflight.set_function(read)

    def components_checked(self, *, relay: bool, workers: bool) -> None:
        """Whether the relay and the dispatcher (the workers) run now."""
        self.up.labels("relay").set(1 if relay else 0)
        self.up.labels("workers").set(1 if workers else 0)

    def instances_seen(self, instances: Iterable[Instance], *, now: float, timeout: float) -> None:
        """The instances registered on the database; those with a current heartbeat count."""
        self.instances.set(sum(1 for i in instances if now - i.heartbeat_at <= timeout))

    def reaped(self, released: Mapping[str, int]) -> None:
        """Dead instances, each with how many of its leases were released."""
        self.instances_reaped.inc(len(released))
        self.leases_released.inc(sum(released.values()))

    def storage_error(self, operation: str) -> None:
        self.storage_errors.labels(operation).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
