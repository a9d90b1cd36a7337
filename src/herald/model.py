"""The data Herald moves: events, destinations, deliveries and attempts.

Times are Unix epoch seconds (floats) everywhere inside Herald, except an event's
``created_at``, which keeps the producer's RFC 3339 text (up to nanoseconds)
because receivers and S3 object keys see it verbatim.

The records built for every delivery on the hot path (:class:`OutboxRow`,
:class:`Event`, :class:`NewDelivery`, :class:`DueDelivery`, :class:`Attempt`,
:class:`AttemptRecord`) are slotted but not frozen: a frozen dataclass sets each
field through ``object.__setattr__``, 1.06 µs against 0.19 µs for eleven fields,
several times per delivery. Nothing changes them after they are built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

import orjson


class DestinationStatus(StrEnum):
    PENDING_VERIFICATION = "pending_verification"
    ACTIVE = "active"
    INACTIVE = "inactive"


class DeliveryStatus(StrEnum):
    PENDING = "pending"
    SUCCESS = "success"
    FAILURE = "failure"


class DeliveryKind(StrEnum):
    EVENT = "event"
    VERIFICATION = "verification"
    TEST = "test"


class Outcome(StrEnum):
    SUCCESS = "success"
    FAILURE_RETRYABLE = "failure_retryable"
    FAILURE_PERMANENT = "failure_permanent"
    TIMEOUT = "timeout"


VERIFICATION_EVENT_TYPE = "destination.verification"
TEST_EVENT_TYPE = "test.ping"
DEFAULT_TENANT = "default"

OPERATIONAL_PREFIX = "herald."
"""Event types under this prefix are Herald's own operational events: only Herald
emits them (producers and API clients are refused), ``*`` does not match them, and
one about a destination is never delivered to that destination."""
DELIVERY_EXHAUSTED = "herald.delivery.exhausted"
DESTINATION_FAILING = "herald.destination.failing"
DESTINATION_RECOVERED = "herald.destination.recovered"
VERIFICATION_FAILED = "herald.destination.verification_failed"
CIRCUIT_OPENED = "herald.destination.circuit_opened"
CIRCUIT_CLOSED = "herald.destination.circuit_closed"
OPERATIONAL_TYPES = (
    DELIVERY_EXHAUSTED,
    DESTINATION_FAILING,
    DESTINATION_RECOVERED,
    VERIFICATION_FAILED,
    CIRCUIT_OPENED,
    CIRCUIT_CLOSED,
)


def is_operational(event_type: str) -> bool:
    """Whether ``event_type`` is under Herald's reserved ``herald.`` prefix."""
    return event_type.startswith(OPERATIONAL_PREFIX)


@dataclass(slots=True)
class Event:
    id: str
    tenant_id: str
    type: str
    created_at: str
    created_ts: float
    data: bytes
    """The payload as compact JSON (an object), exactly as it goes on the wire."""
    traceparent: str | None = None
    """The producer's W3C trace context (``00-<trace id>-<parent id>-<flags>``), checked
    at ingestion; None when it came without one (or with an invalid one). Attempts
    carry it as the ``traceparent`` header / attribute (see docs/observability.md)."""
    ordering_key: str | None = None
    """The producer's ordering key (docs/ordering.md): a destination with ``ordering =
    "key"`` receives the events of one key one at a time, in the relay's order; the
    adapters of types with native ordering carry it (docs/destinations.md, "Ordering
    per destination type"). None: no order asked."""

    def envelope(self) -> bytes:
        """The message body every adapter sends: ``{"id","type","created_at","data"}``."""
        return b"".join(
            (
                b'{"id":',
                orjson.dumps(self.id),
                b',"type":',
                orjson.dumps(self.type),
                b',"created_at":',
                orjson.dumps(self.created_at),
                b',"data":',
                self.data,
                b"}",
            )
        )

    def metadata(self) -> dict[str, str]:
        """Event metadata carried as headers / attributes / application properties,
        with ``traceparent`` when the event has one."""
        meta = {
            "event-id": self.id,
            "event-type": self.type,
            "event-created-at": self.created_at,
            "tenant-id": self.tenant_id,
        }
        if self.traceparent is not None:
            meta["traceparent"] = self.traceparent
        return meta


@dataclass(frozen=True, slots=True)
class Destination:
    id: str
    tenant_id: str
    name: str
    type: str
    config: dict[str, Any]
    """Non-secret fields of the type-keyed object (plus Herald's own bookkeeping)."""
    secrets: dict[str, str]
    """Credential fields, in clear in memory; the store encrypts them at rest."""
    events: tuple[str, ...]
    status: DestinationStatus
    created_at: float
    updated_at: float
    deleted_at: float | None = None
    consecutive_failures: int = 0
    """Failed attempts (events and test pings) since the last success."""
    failing_since: float | None = None
    """When its current failing episode began (``signals.failing_after_attempts``
    consecutive failures); None when it is not failing."""
    verification_failed_at: float | None = None
    """When its current verification ping ran out of attempts (it stays
    ``pending_verification``); None while one is pending or after it succeeded."""
    verification_error: str | None = None
    """The last error of that failed verification."""
    filter: dict[str, Any] | None = None
    """Its payload filter (``payload_filter.py``'s syntax), or None: every event of its
    types."""
    rate_limit_per_second: float | None = None
    """Attempts start no faster than this (``herald.flow``); None: no limit."""
    circuit_breaker: bool = False
    """Whether its circuit breaker is on (``herald.flow``)."""
    circuit: Circuit | None = None
    """Its circuit as last stored (read only; None when the breaker is off)."""
    ordering: Literal["none", "key"] = "none"
    """``key``: the events of one ordering key are delivered one at a time, each only
    after every earlier one of its key ended (docs/ordering.md), and the adapters with
    native ordering use the key; ``none``: no order."""

    @property
    def deleted(self) -> bool:
        return self.deleted_at is not None


Headers = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Exchange:
    """What one HTTP attempt put on the wire and the headers that came back, as recorded:
    credentials masked and sizes bounded where it was noted (``herald.adapters.base``).
    The body is not kept: it is the event's envelope, byte for byte."""

    method: str
    url: str
    request_headers: Headers
    response_headers: Headers | None = None
    """None: no response came (refused, timed out, cut off)."""
    omitted: int = 0
    """Response headers left out past the bound."""

    def to_json(self) -> str:
        return orjson.dumps(
            {
                "method": self.method,
                "url": self.url,
                "request_headers": self.request_headers,
                "response_headers": self.response_headers,
                "omitted": self.omitted,
            }
        ).decode()

    @classmethod
    def from_json(cls, text: str) -> Exchange:
        obj = orjson.loads(text)
        response = obj.get("response_headers")
        return cls(
            method=str(obj["method"]),
            url=str(obj["url"]),
            request_headers=tuple((str(n), str(v)) for n, v in obj["request_headers"]),
            response_headers=None
            if response is None
            else tuple((str(n), str(v)) for n, v in response),
            omitted=int(obj.get("omitted", 0)),
        )


@dataclass(frozen=True, slots=True)
class EventType:
    """One entry of a tenant's event-type catalog (``herald.eventtypes``)."""

    tenant_id: str
    type: str
    description: str
    schema: dict[str, Any] | None
    """A JSON Schema (2020-12) every payload of the type must match; None: any."""
    created_at: float
    updated_at: float
    builtin: bool = False
    """Herald's own (``herald.…``): described for every tenant, never stored."""


@dataclass(frozen=True, slots=True)
class Circuit:
    """A destination's circuit breaker as stored: ``closed``, ``open`` or ``half_open``."""

    state: str
    opened_at: float | None
    next_probe_at: float | None


@dataclass(slots=True)
class Attempt:
    id: str
    delivery_id: str
    number: int
    started_at: float
    duration_ms: float
    outcome: Outcome
    response_status: int | None = None
    error: str | None = None
    response_excerpt: str | None = None
    exchange: Exchange | str | None = None
    """The HTTP request and response headers, for the HTTP types (None for the others,
    and for attempts made before Herald recorded them). A str is the exchange already
    encoded as its column holds it (``Exchange.to_json``): an attempt process's record
    carries it so, and the parent writes it as it came, never parsing it on the way."""

    def exchange_parsed(self) -> Exchange | None:
        """:attr:`exchange` as an :class:`Exchange`, whichever form it is held in."""
        ex = self.exchange
        return Exchange.from_json(ex) if isinstance(ex, str) else ex


@dataclass(frozen=True, slots=True)
class Delivery:
    id: str
    tenant_id: str
    event_id: str
    event_type: str
    destination_id: str
    kind: DeliveryKind
    status: DeliveryStatus
    attempt_count: int
    max_attempts: int
    """Where its current round of attempts starts (see ``NewDelivery.max_attempts``)."""
    next_attempt_at: float | None
    held: bool
    created_at: float
    updated_at: float
    last_attempt: Attempt | None = None
    attempts: tuple[Attempt, ...] = field(default=())
    replay_id: str | None = None
    """The latest replay that re-queued it, if any (``rpl_…``)."""
    leased: bool = False
    """Claimed by a daemon now: ``next_attempt_at`` is then its lease's end, not a
    next attempt (read where it is shown)."""


@dataclass(slots=True)
class NewDelivery:
    """A delivery to insert: the relay's and the service's unit of fan-out."""

    id: str
    tenant_id: str
    event_id: str
    event_type: str
    destination_id: str
    kind: DeliveryKind
    max_attempts: int
    """Despite the (column's) name, where the delivery's current round of attempts
    starts: 0, or 1 for a test ping's fixed single attempt. The budget is the
    attempting daemon's config (``RetryPolicy.round_start``)."""
    next_attempt_at: float | None
    """None for a test ping, which the API attempts itself and workers never claim.
    For a delivery leased at insert (``lease_owner``), the lease's end."""
    held: bool
    created_at: float
    lease_owner: str | None = None
    """Set when the relay hands the delivery straight to its own dispatcher: it is
    inserted claimed, and the claim query never has to find it."""
    ordering_key: str | None = None
    """The event's ordering key: kept on the delivery (with its ``order_seq``) only if
    its destination, as committed, is ordered (``herald.store.part``)."""


@dataclass(slots=True)
class OutboxRow:
    """One raw outbox row; every field may be malformed until the relay checks it."""

    seq: int
    id: bytes | None
    tenant_id: bytes | None
    type: bytes | None
    data: bytes | None
    created_at: bytes | None
    about: str | None = None
    """Set by Herald alone, on its operational events: the destination the event is
    about (never delivered to it). A ``herald.`` type without it is refused."""
    traceparent: bytes | None = None
    """The producer's W3C ``traceparent``, if it wrote one: an invalid one is dropped
    (with a warning), never a reason to reject the row."""
    ordering_key: bytes | None = None
    """The producer's ordering key, if it wrote one (checked: ``invalid_ordering_key``)."""


@dataclass(frozen=True, slots=True)
class Rejection:
    """An outbox row that cannot become an event, kept with the reason."""

    seq: int
    id: str | None
    tenant_id: str | None
    type: str | None
    data: str | None
    created_at: str | None
    reason: str
    source: str = "herald"
    """The outbox it came from: ``herald`` (Herald's own) or an ``[[outbox.sources]]`` name."""


@dataclass(slots=True)
class RelayPlan:
    """What one relay batch writes, in one transaction."""

    events: list[Event] = field(default_factory=list)
    deliveries: list[NewDelivery] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)
    untraced: list[tuple[int, str, bytes]] = field(default_factory=list)
    """(seq, event id, value) of the rows whose ``traceparent`` was invalid: their events
    go without it, and the relay says so once the batch is committed."""
    filtered: list[str] = field(default_factory=list)
    """Destination ids, once per event of the batch that did not pass the destination's
    payload filter (no delivery made)."""
    leased: list[str] = field(default_factory=list)
    """Ids of the deliveries stored leased (``NewDelivery.lease_owner``) and not held:
    the store's answer, after checking against the committed destination status."""


@dataclass(slots=True)
class DueDelivery:
    """A claimed delivery, with what the engine needs to attempt it."""

    id: str
    destination_id: str
    kind: DeliveryKind
    attempt_count: int
    max_attempts: int
    event: Event
    due_at: float = 0.0
    """When it was due (its ``next_attempt_at`` before the claim leased it)."""
    ordering_key: str | None = None
    """Set when the delivery is ordered (its destination's ``ordering`` is ``key``): the
    recording that ends it releases the next of its key, and only while its lease is
    still ``owner``'s."""
    owner: str | None = None
    """Who leased it (this instance's id), for that check."""
    flow_lane: bool = False
    """Claimed from its destination's flow lane (herald.flow): not in due order with
    the others (see ``herald.claims``)."""


@dataclass(frozen=True, slots=True)
class BlockedKey:
    """An ordered destination's key whose next deliveries wait for its head."""

    key: str
    head_id: str
    """The delivery they wait for (pending: retrying, or in flight)."""
    head_attempts: int
    head_next_attempt_at: float | None
    in_flight: bool
    waiting: int
    """Deliveries of the key behind it."""


@dataclass(slots=True)
class AttemptRecord:
    """One finished attempt and the delivery state it leads to."""

    attempt: Attempt
    status: DeliveryStatus
    next_attempt_at: float | None
    activates_destination: str | None = None
    item: DueDelivery | None = None
    """The delivery attempted: its destination, kind and event decide the operational
    events the record causes (none without it)."""


@dataclass(frozen=True, slots=True)
class Signal:
    """An operational event written with the outcome that caused it (one transaction)."""

    type: str
    event_id: str
    tenant_id: str
    destination_id: str
    destination_type: str
    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Recorded:
    """What one recording transaction committed beyond the attempts themselves."""

    signals: list[Signal] = field(default_factory=list)
    """The operational events it wrote into the outbox."""
    exhausted: list[str] = field(default_factory=list)
    """The destination type of each event delivery it moved to ``failure``."""
    circuits: dict[str, float | None] = field(default_factory=dict)
    """The circuit of each breaker destination it recorded attempts of, as it left it
    (``herald.flow``): when it opened, or None when closed. Another instance may have
    opened it: the dispatcher holds back what it claimed before then."""


@dataclass(frozen=True, slots=True)
class Instance:
    """A running ``herald run`` as the database knows it, by its heartbeats."""

    id: str
    hostname: str
    pid: int
    version: str
    started_at: float
    heartbeat_at: float


@dataclass(frozen=True, slots=True)
class DeliveryFilter:
    """Selects deliveries for listing and replay; every field narrows."""

    tenant_id: str | None = None
    destination_id: str | None = None
    status: DeliveryStatus | None = None
    event_types: tuple[str, ...] = ()
    since: float | None = None
    until: float | None = None
    ids: tuple[str, ...] = ()
    kind: DeliveryKind | None = None
    replay_id: str | None = None
    """Only the deliveries this replay re-queued (and no later replay took over)."""


@dataclass(frozen=True, slots=True)
class ReplayOutcome:
    """A replay's deliveries by status, counted when asked."""

    pending: int = 0
    succeeded: int = 0
    failed: int = 0


@dataclass(frozen=True, slots=True)
class Replay:
    """One replay (``rpl_…``): who asked, with which filter, and what it re-queued.

    ``tenant_id`` is None for an operator-wide replay; ``finished_at`` is None while it
    runs (or if its process died); ``requeued`` grows as it goes. ``cut_short``: the
    daemon stopped it before it had re-queued every match (``finished_at`` is then
    when it stopped, ``requeued`` how far it got)."""

    id: str
    tenant_id: str | None
    filter: dict[str, Any]
    by: str
    created_at: float
    matched: int
    requeued: int = 0
    finished_at: float | None = None
    outcome: ReplayOutcome = ReplayOutcome()
    cut_short: bool = False


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """What a replay request did: a dry run counts and samples; a real one also has
    its stored :class:`Replay`."""

    matched: int
    requeued: int
    sample: list[Delivery]
    dry_run: bool
    replay: Replay | None = None
    """The stored replay (None for a dry run, which stores nothing)."""


@dataclass(frozen=True, slots=True)
class DestinationHealth:
    """How a destination has been answering, from the counters the recorder keeps:
    when it last answered well and badly, and its attempts over the last 24 hours."""

    last_success_at: float | None = None
    last_failure_at: float | None = None
    successes: int = 0
    failures: int = 0

    @property
    def failure_rate(self) -> float | None:
        """Failed attempts over all attempts in the last 24 hours; None without any."""
        total = self.successes + self.failures
        return None if total == 0 else self.failures / total


@dataclass(frozen=True, slots=True)
class HourCount:
    """The attempts of one hour (``hour`` × 3600 is its start): one destination's, or
    the overview's over every destination (or a tenant's)."""

    hour: int
    successes: int
    failures: int
