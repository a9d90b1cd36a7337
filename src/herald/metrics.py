"""Every Prometheus metric of Herald, under the ``herald_`` prefix, in one place.

One method per action keeps label values bounded and in one vocabulary:
destination type, outcome, status, reason class — never event ids. A
per-destination label exists only behind ``metrics.per_destination``, since
tenants can create many destinations. Gauges that need a database count are
refreshed by a background task on an interval, not per scrape; while that refresh
fails they are left out of the scrape (Prometheus marks them stale), never frozen
at the last values read. ``herald_database_up`` and ``herald_component_up`` say
why: every component reports each of its database round trips here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)

from herald import __version__
from herald.collectors import DATABASE_FAILURE_MEMORY, AttemptCollector, Health, Snapshots, Taken
from herald.model import (
    CIRCUIT_OPENED,
    AttemptRecord,
    DeliveryKind,
    DeliveryStatus,
    DueDelivery,
    Instance,
    Outcome,
    Recorded,
    RelayPlan,
)

API_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
PENDING_STATES = ("due", "scheduled_retry", "held")
STORAGE_COMPONENTS = (
    "relay",
    "claim",
    "recorder",
    "renewal",
    "gauges",
    "heartbeat",
    "retention",
    "readiness",
    "api",
    "shutdown",
)
"""What reports its database round trips (``database_result``): each series exists from
the start at 0, so ``increase()`` sees the first error."""
SOURCE_COMPONENT = "source"
"""``herald_storage_errors_total``'s component for outbox sources' databases (not
Herald's: they never move ``herald_database_up``)."""
BUILTIN_SOURCE = "herald"
"""The ``source`` label of the built-in outbox's series."""
LOOPS = frozenset({"relay", "claim", "recorder", "renewal", "gauges", "heartbeat"})
"""Components that keep making round trips on their own: a failure of theirs holds
``herald_database_up`` at 0 until they succeed again (reads can work while their writes
fail). A failure of an occasional caller (an API request, ``/readyz``, retention) is
cleared by the next success of any component: it may never call again."""
REPLAY_SOURCES = ("cli", "api", "console", "portal")
"""Who may ask for a replay (the service's ``by``, before its colon); anything else
counts as ``other``, so the label stays bounded."""
__all__ = [
    "CONTENT_TYPE",
    "DATABASE_FAILURE_MEMORY",
    "DatabaseCounts",
    "Metrics",
    "replay_source",
]


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
        self.events_filtered = counter(
            "herald_events_filtered",
            "Deliveries not made because the event did not pass the destination's filter"
            + (", by destination" if per_destination else ""),
            *(["destination_id"] if per_destination else []),
        )
        self.attempts = AttemptCollector(per_destination=per_destination)
        r.register(self.attempts)
        self.inflight = gauge("herald_inflight_attempts", "Attempts in flight in this process")
        self.storage_errors = counter(
            "herald_storage_errors",
            "Database round trips that failed (each is retried or reported), by component",
            "component",
        )
        for component in (*STORAGE_COMPONENTS, SOURCE_COMPONENT):
            self.storage_errors.labels(component)
        self.source_up = gauge(
            "herald_source_up",
            "1 when this instance can read the outbox source (or another instance relays it)",
            "source",
        )
        self._sources: dict[str, tuple[int, float | None]] = {}
        """Outbox source -> (rows waiting, oldest created_at epoch), as last read."""
        self.health = Health()
        r.register(self.health)
        self.snapshots = Snapshots()
        r.register(self.snapshots)
        self.api_requests = counter(
            "herald_api_requests",
            "HTTP requests answered, by route pattern, method and status",
            "route",
            "method",
            "status",
        )
        self.api_durations = Histogram(
            "herald_api_request_duration_seconds",
            "Time to answer an HTTP request, by route pattern and method",
            ["route", "method"],
            buckets=API_BUCKETS,
            registry=r,
        )
        self.circuits_opened = counter(
            "herald_circuits_opened",
            "Circuits this instance's recorder opened (herald.destination.circuit_opened)",
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
        if plan.filtered:
            if self.per_destination:
                for dest_id in plan.filtered:
                    self.events_filtered.labels(destination_id=dest_id).inc()
            else:
                self.events_filtered.inc(len(plan.filtered))

    def database_counted(self, counts: DatabaseCounts, *, now: float) -> None:
        """The background refresh read the database's counts (see :class:`DatabaseCounts`)."""
        outbox_pending = GaugeMetricFamily(
            "herald_outbox_pending",
            "Rows waiting in an outbox (source: herald, the built-in one, or an outbox source)",
            labels=["source"],
        )
        lag = GaugeMetricFamily(
            "herald_outbox_lag_seconds",
            "Age of the oldest unclaimed row of an outbox (0 when empty)",
            labels=["source"],
        )
        outboxes = {BUILTIN_SOURCE: (counts.outbox_pending, counts.outbox_oldest)}
        for source, (count, oldest) in {**self._sources, **outboxes}.items():
            outbox_pending.add_metric([source], count)
            lag.add_metric([source], _age(oldest, now))
        pending = GaugeMetricFamily(
            "herald_deliveries_pending",
            "Pending deliveries: due now, waiting for a scheduled retry, or held",
            labels=["state"],
        )
        for state in PENDING_STATES:
            pending.add_metric([state], counts.deliveries.get(state, 0))
        oldest_due = GaugeMetricFamily(
            "herald_oldest_due_delivery_age_seconds",
            "How long the longest-waiting due delivery has been due (0 when none is)",
        )
        oldest_due.add_metric([], _age(counts.next_due_at, now))
        destinations = GaugeMetricFamily(
            "herald_destinations",
            "Event destinations by type and status",
            labels=["type", "status"],
        )
        for type_, status, count in counts.destinations:
            destinations.add_metric([type_, status], count)
        failing = GaugeMetricFamily(
            "herald_destinations_failing",
            "Destinations in a failing episode (signals.failing_after_attempts consecutive"
            " failed attempts, no success since)",
        )
        failing.add_metric([], counts.failing)
        circuits = GaugeMetricFamily(
            "herald_circuits_open",
            "Destinations whose circuit breaker is open or probing (docs/flow-control.md)",
        )
        circuits.add_metric([], len(counts.open_circuits))
        families: list[Metric] = [circuits]
        if self.per_destination:
            per = GaugeMetricFamily(
                "herald_circuit_open",
                "1 for each destination whose circuit is open or probing",
                labels=["destination"],
            )
            for dest_id in counts.open_circuits:
                per.add_metric([dest_id], 1)
            families.append(per)
        replays = CounterMetricFamily(
            "herald_replays",
            "Replays that re-queued deliveries, by who asked (CLI, API, console), all instances",
            labels=["source"],
        )
        replayed = CounterMetricFamily(
            "herald_deliveries_replayed",
            "Deliveries re-queued by replays, by who asked, all instances",
            labels=["source"],
        )
        for source in (*REPLAY_SOURCES, "other"):
            runs, deliveries = counts.replays.get(source, (0, 0))
            replays.add_metric([source], runs)
            replayed.add_metric([source], deliveries)
        self.snapshots.set(
            "counts",
            [
                outbox_pending,
                lag,
                pending,
                oldest_due,
                destinations,
                failing,
                *families,
                replays,
                replayed,
            ],
        )

    def source_state(
        self, source: str, *, up: bool, pending: int | None = None, oldest: float | None = None
    ) -> None:
        """An outbox source's state: reachable or not, and (when known) its rows waiting
        and the oldest one's ``created_at`` epoch, shown at the next counts' refresh."""
        self.source_up.labels(source).set(1 if up else 0)
        if up and pending is not None:
            self._sources[source] = (pending, oldest)
        else:
            self._sources.pop(source, None)

    def source_failed(self) -> None:
        """A round trip with an outbox source's database failed."""
        self.storage_errors.labels(SOURCE_COMPONENT).inc()

    def database_count_failed(self) -> None:
        """The refresh could not read the counts: their series leave the scrape."""
        self.snapshots.drop("counts")

    def signals_recorded(self, recorded: Recorded) -> None:
        """A recording committed: the deliveries it exhausted (by destination type)."""
        for type_ in recorded.exhausted:
            self.exhausted.labels(type_).inc()
        for signal in recorded.signals:
            if signal.type == CIRCUIT_OPENED:
                self.circuits_opened.inc()

    def track_inflight(self, read: Callable[[], float]) -> None:
        self.inflight.set_function(read)

    def track_taken(self, read: Callable[[], Mapping[str, int]]) -> None:
        """The dispatcher's count of deliveries taken to attempt, by how they came
        (``handover``, ``claim``), read at every scrape."""
        self.registry.register(Taken(read))

    def track_components(self, **checks: Callable[[], bool]) -> None:
        """Whether each component runs and can do its work now, read at every scrape."""
        self.health.components.update(checks)

    def instances_seen(self, instances: Iterable[Instance], *, now: float, timeout: float) -> None:
        """The instances registered on the database; those with a current heartbeat count."""
        family = GaugeMetricFamily(
            "herald_instances", "Herald instances on this database whose heartbeat is current"
        )
        family.add_metric([], sum(1 for i in instances if now - i.heartbeat_at <= timeout))
        self.snapshots.set("instances", [family])

    def instances_unknown(self) -> None:
        self.snapshots.drop("instances")

    def reaped(self, released: Mapping[str, int]) -> None:
        """Dead instances, each with how many of its leases were released."""
        self.instances_reaped.inc(len(released))
        self.leases_released.inc(sum(released.values()))

    def database_result(self, component: str, ok: bool) -> None:
        """A component's database round trip succeeded or failed (``StorageError``)."""
        health = self.health
        if ok:
            health.reached = True
            if health.failures:
                health.failures.pop(component, None)
                for other in [c for c in health.failures if c not in LOOPS]:
                    del health.failures[other]
            return
        health.failures[component] = time.monotonic()
        self.storage_errors.labels(component).inc()

    def api_answered(self, route: str, method: str, status: int, seconds: float) -> None:
        """An HTTP request was answered (``route``: the pattern, never the raw path)."""
        self.api_requests.labels(route, method, str(status)).inc()
        self.api_durations.labels(route, method).observe(seconds)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def _age(since: float | None, now: float) -> float:
    return 0.0 if since is None or since > now else now - since


@dataclass(frozen=True, slots=True)
class DatabaseCounts:
    """What the background refresh reads from the database in one pass."""

    outbox_pending: int
    outbox_oldest: float | None
    """``created_at`` epoch of the oldest outbox row."""
    deliveries: Mapping[str, int]
    """Pending deliveries by state (:data:`PENDING_STATES`)."""
    next_due_at: float | None
    """Earliest ``next_attempt_at`` of an unheld pending delivery."""
    destinations: list[tuple[str, str, int]]
    replays: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    """Source -> (replays, deliveries re-queued)."""
    failing: int = 0
    """Destinations in a failing episode (herald.destination.failing sent, no success since)."""
    open_circuits: Sequence[str] = ()
    """Destinations whose circuit is open or probing (herald.flow)."""


def replay_source(by: str) -> str:
    """The bounded ``source`` label of a replay asked for ``by`` (``cli:alice``)."""
    source = by.split(":", 1)[0]
    return source if source in REPLAY_SOURCES else "other"
