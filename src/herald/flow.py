"""Flow control per destination: its rate limit and its circuit breaker, as pure logic.

A destination's :class:`Flow` is one row of ``herald_flow``, read under its row lock
by the claim (:func:`admit`: how many of its due deliveries this claim may take) and by
the recorder (``herald.signals.circuits``: what the outcomes do to its circuit), so on
PostgreSQL every instance shares one budget and one circuit. No clock here: ``now`` is
always given.

The rate is a token bucket of ``rate`` tokens a second holding at most one second's
worth (``max(1, rate)`` tokens), kept as a GCRA: ``tat`` is the time at which the
bucket would be full again; a delivery may start while ``tat - now`` is within the
tolerance, and each one taken moves ``tat`` on by ``1 / rate``. A claim spends a token
per event delivery it takes; a delivery that waits for its token is not claimed at all
(no attempt, nothing recorded, no retry spent).

The circuit (when ``breaker`` is on) is ``closed``, ``open`` (nothing is claimed before
``next_probe_at``) or ``half_open`` (one claim took the oldest due delivery as its one
probe; nothing else is claimed until its outcome is recorded, or until the probe's
lease would have run out, when another probe may go).

``gate_until`` is what claims read to skip the destination cheaply: no claim takes its
event deliveries before then (the next probe; for an empty bucket, a tenth of a
second's worth of tokens, :data:`GATE_SECONDS`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half_open"

_EPSILON = 1e-5
"""Seconds of slack in the bucket's arithmetic: epoch seconds as floats carry about
2e-7 s of rounding, which must not cost a token."""


GATE_SECONDS = 0.1
"""An empty bucket's gate opens once this much of the rate has come back (one token at
least): claims meet a backlogged destination a few times a second and take several
each, not once a token. At 50/s a token at a time, each of fifty claims a second took a
whole batch of the backlog and handed back all but one (and, between them, every
finished attempt's claim read past the backlog): half a core for 50 requests a second.
The requests still go out evenly (:class:`Pacer`)."""


def gate_tokens(rate: float) -> int:
    """Tokens an empty bucket of ``rate`` gathers before its gate opens."""
    return max(1, math.ceil(rate * GATE_SECONDS - _EPSILON))


@dataclass(frozen=True, slots=True)
class BreakerSettings:
    """``delivery.breaker_*``: when a circuit opens and how long it stays open."""

    failures: int = 5
    cooldown: float = 30.0
    max_cooldown: float = 900.0


@dataclass(slots=True)
class Flow:
    """One destination's flow-control settings and state, as stored."""

    destination_id: str
    rate: float | None = None
    breaker: bool = False
    tat: float = 0.0
    circuit: str = CLOSED
    opened_at: float | None = None
    next_probe_at: float | None = None
    cooldown: float | None = None
    gate_until: float = 0.0


def tolerance(rate: float) -> float:
    """How far ahead of ``now`` the GCRA's ``tat`` may be and still let one more start:
    a bucket of ``max(1, rate)`` tokens, less the one being taken."""
    return (max(1.0, rate) - 1.0) / rate


def tokens(flow: Flow, now: float) -> int:
    """Deliveries the rate lets start at ``now`` (unlimited: a large number)."""
    if flow.rate is None:
        return 1 << 30
    step = 1.0 / flow.rate
    ahead = max(flow.tat, now) - now
    tau = tolerance(flow.rate)
    if ahead > tau + _EPSILON:
        return 0
    return int((tau - ahead + _EPSILON) / step) + 1


def gate(flow: Flow) -> float:
    """Before when claims skip the destination: the next probe of an open or probing
    circuit, the :func:`gate_tokens` of a bucket short of them (in the past when
    neither waits)."""
    until = 0.0
    if flow.breaker and flow.circuit != CLOSED:
        until = flow.next_probe_at or 0.0
    if flow.rate is not None:
        rate = flow.rate
        until = max(until, flow.tat - tolerance(rate) + (gate_tokens(rate) - 1) / rate)
    return until


def allowance(flow: Flow, now: float) -> int:
    """How many event deliveries the destination may begin at ``now``: none while the
    circuit is open and not yet due a probe, one (the probe) when it is due, and never
    more than the rate has tokens for (unlimited: a large number)."""
    n = tokens(flow, now)
    if flow.breaker and flow.circuit != CLOSED:
        if flow.next_probe_at is not None and now < flow.next_probe_at:
            return 0
        return min(n, 1)
    return n


def admit(flow: Flow, wanted: int, now: float, *, probe_timeout: float) -> int:
    """How many of ``wanted`` claimed event deliveries (oldest first) the claim keeps:
    as many as its :func:`allowance`. Spends the tokens, marks the probe out
    (``half_open``, another allowed after ``probe_timeout``) and sets the gate."""
    n = min(wanted, allowance(flow, now))
    probing = bool(flow.breaker) and flow.circuit != CLOSED
    if n > 0 and flow.rate is not None:
        flow.tat = max(flow.tat, now) + n / flow.rate
    if probing and n > 0:
        flow.circuit = HALF_OPEN
        flow.next_probe_at = now + probe_timeout
    flow.gate_until = gate(flow)
    return max(n, 0)


def opened(flow: Flow, settings: BreakerSettings, now: float) -> None:
    """The circuit opens (from closed): the first probe after the base cooldown."""
    flow.circuit = OPEN
    flow.opened_at = now
    flow.cooldown = settings.cooldown
    flow.next_probe_at = now + settings.cooldown
    flow.gate_until = gate(flow)


def reopened(flow: Flow, settings: BreakerSettings, now: float) -> None:
    """The probe failed: open again, the cooldown doubled up to its most."""
    flow.circuit = OPEN
    flow.cooldown = min(2 * (flow.cooldown or settings.cooldown), settings.max_cooldown)
    flow.next_probe_at = now + flow.cooldown
    flow.gate_until = gate(flow)


def closed(flow: Flow) -> None:
    """A success: the circuit closes and the backlog flows (under the rate)."""
    flow.circuit = CLOSED
    flow.opened_at = None
    flow.next_probe_at = None
    flow.cooldown = None
    flow.gate_until = gate(flow)


def configured(flow: Flow, rate: float | None, breaker: bool, now: float) -> None:
    """The destination's settings changed: a breaker turned off forgets its circuit; a
    new rate keeps the tokens spent (a change never grants a burst), but the bucket
    waits no longer than the new rate's own empty bucket would (a slow rate raised
    does not keep its long wait)."""
    if rate is not None and rate != flow.rate:
        flow.tat = min(flow.tat, now + tolerance(rate) + 1.0 / rate)
    flow.rate = rate
    if not breaker:
        closed(flow)
    flow.breaker = breaker
    flow.gate_until = gate(flow)


class Held:
    """One dispatcher's own view of its breaker destinations' circuits, between the
    claim and the recorder: which claimed deliveries must not begin.

    The circuit opens in the database when the recorder writes the failure that opens
    it, a few milliseconds after the attempt ended; attempts that begin meanwhile would
    each be one more failure the receiver sees. So a destination whose own failures,
    counted here, reach ``failures`` is *suspect* until that record is written: nothing
    of it begins meanwhile, whenever it was claimed, and claims leave it out
    (:attr:`suspects`). Once written, either the circuit opened (what was claimed before
    that does not begin: only a probe, claimed after, does) or it did not (another
    instance's success intervened) and everything flows again. With a fast failing
    receiver and a busy recorder, the time to that record was long enough for hundreds
    of attempts claimed after the suspicion to begin (``bench partner``'s dead
    destination: up to 462 requests before its circuit opened, at 64 in flight). No
    clock here: ``now`` is given; pure and synchronous like ``herald.slots``.
    """

    def __init__(self, failures: int) -> None:
        self._failures = failures
        self._claimed: dict[str, float] = {}
        """Held deliveries of breaker destinations not yet begun: when claimed."""
        self._count: dict[str, int] = {}
        """Consecutive failed attempts per destination, as this process saw them end."""
        self._suspect: dict[str, str] = {}
        """Destination → the attempt that made it suspect (settled once it is written)."""
        self._opened: dict[str, float] = {}
        """Destination → when this process's recorder saw its circuit open."""

    def claimed(self, delivery_id: str, now: float) -> None:
        self._claimed[delivery_id] = now

    def may_begin(self, delivery_id: str, destination_id: str) -> bool:
        """Whether a delivery of a breaker destination may begin now (forgets it)."""
        claimed_at = self._claimed.pop(delivery_id, None)
        if claimed_at is None:
            return True  # not a breaker destination's event delivery
        if destination_id in self._suspect:
            return False
        opened = self._opened.get(destination_id)
        return opened is None or claimed_at > opened

    def ended(self, destination_id: str, attempt_id: str, ok: bool) -> None:
        """An attempt of a breaker destination's event delivery (or test ping) ended."""
        if ok:
            self._count.pop(destination_id, None)
            self._suspect.pop(destination_id, None)
            return
        n = self._count[destination_id] = self._count.get(destination_id, 0) + 1
        if n >= self._failures and destination_id not in self._opened:
            self._suspect[destination_id] = attempt_id

    @property
    def suspecting(self) -> bool:
        """Whether some destination waits for its record to be written."""
        return bool(self._suspect)

    @property
    def suspects(self) -> list[str]:
        """The destinations waiting for their record to be written: claims skip them."""
        return list(self._suspect)

    def written(self, attempt_ids: set[str]) -> list[str]:
        """The recorder wrote these attempts (and applied what they signal): the
        destinations whose suspicion is settled by now (their circuit opened, or not)."""
        settled = [d for d, a in self._suspect.items() if a in attempt_ids]
        for d in settled:
            del self._suspect[d]
        return settled

    def opened(self, destination_id: str, opened_at: float) -> None:
        """The recorder found its circuit open, since ``opened_at`` (as stored: the same
        through every failed probe, so a probe claimed since is not held back)."""
        self._opened[destination_id] = opened_at

    def closed(self, destination_id: str) -> None:
        """The recorder found its circuit closed."""
        if self._opened.pop(destination_id, None) is not None:
            self._count.pop(destination_id, None)


@dataclass(slots=True)
class Pacer:
    """One process's spacing of a rate-limited destination's requests at the moment
    they go on the wire: one every ``1/rate`` seconds, without the shared bucket's burst.

    The shared bucket (:func:`admit`) bounds how many attempts start, over every
    process and instance, when they are claimed. Between the claim and the wire a
    request can be held up (a cold connection, fifty TLS handshakes at once, an OAuth2
    token fetch, a stall of the process) and then go together with the ones claimed
    after it: the receiver, counting arrivals, sees a burst the bucket never allowed.
    So the attempt waits its turn here just before its request is written, and the
    receiver sees the rate. Each destination's attempts stay in one process (the
    worker pool pins them), so one pacer sees them all.

    The pacer spends no burst: a receiver that allows one second's worth at once and
    is sent its rate evenly keeps that allowance for the network's jitter. Sent in a
    burst and then at the rate, its bucket would stay full for the whole backlog, and
    any request arriving a little earlier than the one before it would be refused.
    """

    rate: float
    tat: float = 0.0

    def turn(self, now: float) -> float:
        """Take the next place: seconds to wait before sending (0: at once)."""
        tat = max(self.tat, now)
        self.tat = tat + 1.0 / self.rate
        wait = tat - now
        return wait if wait > _EPSILON else 0.0


class Pacers:
    """This process's :class:`Pacer` per destination. A change of rate keeps the
    places already taken (it grants no burst)."""

    def __init__(self) -> None:
        self._pacers: dict[str, Pacer] = {}

    def get(self, destination_id: str, rate: float) -> Pacer:
        pacer = self._pacers.get(destination_id)
        if pacer is None:
            pacer = self._pacers[destination_id] = Pacer(rate)
        pacer.rate = rate
        return pacer
