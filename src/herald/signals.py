"""Operational events: what recorded attempts signal, as pure functions.

Herald emits events of its own (``herald.…``, see :mod:`herald.model`) in the
tenant they concern. The store calls these functions inside the transaction that
records the attempts, with each destination's signal state read under its row
lock, and writes what they return in that same transaction: the signal state,
and the events into the outbox, from where the relay fans them out like any
producer's. Nothing is lost or doubled across a crash: the event ids are derived
from their cause (a delivery, an attempt), so a recording written twice writes
each event once.

The episode rule: every failed attempt of an event or a test ping adds one to the
destination's consecutive failures, every successful one resets them. The attempt
that brings them to ``failing_after`` opens a failing episode
(``herald.destination.failing``, once); the first success after that closes it
(``herald.destination.recovered``). Verification pings have their own signal.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from herald.flow import CLOSED, HALF_OPEN, BreakerSettings, Flow, closed, opened, reopened
from herald.ingest import Marks, about_column
from herald.model import (
    CIRCUIT_CLOSED,
    CIRCUIT_OPENED,
    DELIVERY_EXHAUSTED,
    DESTINATION_FAILING,
    DESTINATION_RECOVERED,
    VERIFICATION_FAILED,
    AttemptRecord,
    DeliveryKind,
    DeliveryStatus,
    DueDelivery,
    Outcome,
    Signal,
    is_operational,
)
from herald.timeutil import format_epoch

DEFAULT_FAILING_AFTER = 5

_COUNTED = (DeliveryKind.EVENT, DeliveryKind.TEST)

REVERIFY = "POST /v2/event-destinations/{id}/verify"
"""How to send a new verification ping (the API; ``herald destinations verify`` at a shell)."""


@dataclass(slots=True)
class DestinationState:
    """A destination's signal state as stored, changed in place by :func:`episodes`."""

    type: str
    consecutive_failures: int
    failing_since: float | None


def destinations_of(records: Iterable[AttemptRecord]) -> tuple[list[str], list[str]]:
    """The destinations whose signal state recording ``records`` may read or change,
    and those of them it must lock whatever their state (an attempt failed, or a
    verification activates one), both sorted (the lock order)."""
    every: set[str] = set()
    must: set[str] = set()
    for r in records:
        if r.activates_destination is not None:
            every.add(r.activates_destination)
            must.add(r.activates_destination)
        if r.item is None:
            continue
        every.add(r.item.destination_id)
        if r.attempt.outcome is not Outcome.SUCCESS:
            must.add(r.item.destination_id)
    return sorted(every), sorted(must)


def _item(r: AttemptRecord) -> DueDelivery:
    assert r.item is not None
    return r.item


def _counted(records: Sequence[AttemptRecord]) -> Iterator[tuple[AttemptRecord, str]]:
    """The records whose attempts count toward a destination's health (an event's or a
    test ping's, not a verification's), each with its destination id, in order."""
    for r in records:
        if r.item is not None and r.item.kind in _COUNTED:
            yield r, r.item.destination_id


def episodes(
    records: Sequence[AttemptRecord],
    states: dict[str, DestinationState],
    *,
    failing_after: int,
    now: float,
) -> tuple[list[Signal], set[str]]:
    """Apply ``records``, in order, to ``states`` (destination id → state; a destination
    missing is deleted, or healthy and only succeeding); returns the failing and
    recovered signals and the ids of the states that changed."""
    signals: list[Signal] = []
    changed: set[str] = set()
    for r, dest_id in _counted(records):
        state = states.get(dest_id)
        if state is None:
            continue
        if r.attempt.outcome is Outcome.SUCCESS:
            if state.failing_since is not None:
                signals.append(_recovered(r, state, now))
            if state.consecutive_failures or state.failing_since is not None:
                state.consecutive_failures, state.failing_since = 0, None
                changed.add(dest_id)
            continue
        state.consecutive_failures += 1
        changed.add(dest_id)
        if state.failing_since is None and state.consecutive_failures >= failing_after:
            state.failing_since = now
            signals.append(_failing(r, state))
    return signals, changed


def circuits(
    records: Sequence[AttemptRecord],
    flows: dict[str, Flow],
    failures: dict[str, int],
    types: dict[str, str],
    *,
    settings: BreakerSettings,
    now: float,
) -> tuple[list[Signal], set[str]]:
    """Apply ``records``, in order, to the circuits of ``flows`` (destination id → flow,
    read under its row lock), given each destination's consecutive failures before
    them (``failures``, changed in place, counted as :func:`episodes` does); returns
    the circuit events and the ids of the flows that changed.

    A closed circuit opens at ``settings.failures`` consecutive failures
    (``herald.destination.circuit_opened``, once); a failed probe opens it again with
    the cooldown doubled (no event); a success closes it
    (``herald.destination.circuit_closed``). Attempts already in flight when it
    opened end while it is open: they count, and change nothing else."""
    signals: list[Signal] = []
    changed: set[str] = set()
    for r, dest_id in _counted(records):
        before = failures.get(dest_id, 0)
        ok = r.attempt.outcome is Outcome.SUCCESS
        count = failures[dest_id] = 0 if ok else before + 1
        flow = flows.get(dest_id)
        if flow is None or not flow.breaker:
            continue
        dest_type = types.get(dest_id, "")
        if ok:
            if flow.circuit != CLOSED:
                opened_at = flow.opened_at
                closed(flow)
                changed.add(dest_id)
                signals.append(
                    _signal(
                        r,
                        CIRCUIT_CLOSED,
                        r.attempt.id,
                        dest_type,
                        consecutive_failures=before,
                        opened_at=None if opened_at is None else format_epoch(opened_at),
                        closed_at=format_epoch(now),
                        delivery_id=r.attempt.delivery_id,
                    )
                )
            continue
        if flow.circuit == HALF_OPEN:
            reopened(flow, settings, now)
            changed.add(dest_id)
        elif flow.circuit == CLOSED and count >= settings.failures:
            opened(flow, settings, now)
            changed.add(dest_id)
            assert flow.next_probe_at is not None
            signals.append(
                _signal(
                    r,
                    CIRCUIT_OPENED,
                    r.attempt.id,
                    dest_type,
                    consecutive_failures=count,
                    opened_at=format_epoch(now),
                    next_probe_at=format_epoch(flow.next_probe_at),
                    cooldown_seconds=flow.cooldown,
                    last_delivery_id=r.attempt.delivery_id,
                    last_error=r.attempt.error,
                    last_response_status=r.attempt.response_status,
                )
            )
    return signals, changed


def _signal(r: AttemptRecord, type_: str, cause: str, dest_type: str, **data: Any) -> Signal:
    item = _item(r)
    return Signal(
        type=type_,
        event_id=f"evt_{type_.removeprefix('herald.').replace('.', '_')}_{cause}",
        tenant_id=item.event.tenant_id,
        destination_id=item.destination_id,
        destination_type=dest_type,
        data={"destination_id": item.destination_id, "destination_type": dest_type, **data},
    )


def _episode(r: AttemptRecord, type_: str, state: DestinationState, **data: Any) -> Signal:
    """``…failing`` or ``…recovered``, caused by attempt ``r`` (its id is the event's)."""
    assert state.failing_since is not None
    return _signal(
        r,
        type_,
        r.attempt.id,
        state.type,
        consecutive_failures=state.consecutive_failures,
        failing_since=format_epoch(state.failing_since),
        **data,
    )


def _failing(r: AttemptRecord, state: DestinationState) -> Signal:
    a = r.attempt
    return _episode(
        r,
        DESTINATION_FAILING,
        state,
        last_delivery_id=a.delivery_id,
        last_error=a.error,
        last_response_status=a.response_status,
    )


def _recovered(r: AttemptRecord, state: DestinationState, now: float) -> Signal:
    return _episode(
        r,
        DESTINATION_RECOVERED,
        state,
        recovered_at=format_epoch(now),
        delivery_id=r.attempt.delivery_id,
    )


def ended_in_failure(records: Iterable[AttemptRecord]) -> list[AttemptRecord]:
    """The records that end an event delivery or a verification as ``failure``: the
    candidates for ``herald.delivery.exhausted`` and ``…verification_failed``."""
    return [
        r
        for r in records
        if r.status is DeliveryStatus.FAILURE
        and r.item is not None
        and r.item.kind in (DeliveryKind.EVENT, DeliveryKind.VERIFICATION)
    ]


def exhausted(r: AttemptRecord, dest_type: str) -> Signal | None:
    """``herald.delivery.exhausted`` for an event delivery that ran out of attempts;
    None for a delivery of an operational event, which signals nothing (two failing
    destinations subscribed to each other's signals would feed each other forever)."""
    item = _item(r)
    if is_operational(item.event.type):
        return None
    a = r.attempt
    return _signal(
        r,
        DELIVERY_EXHAUSTED,
        f"{a.delivery_id}_{a.number}",
        dest_type,
        delivery_id=a.delivery_id,
        event_id=item.event.id,
        event_type=item.event.type,
        attempts=a.number,
        last_error=a.error,
        last_response_status=a.response_status,
        last_outcome=a.outcome.value,
    )


def verification_failed(r: AttemptRecord, dest_type: str) -> Signal:
    """``herald.destination.verification_failed``: the ping ran out of attempts."""
    a = r.attempt
    return _signal(
        r,
        VERIFICATION_FAILED,
        a.delivery_id,
        dest_type,
        delivery_id=a.delivery_id,
        attempts=a.number,
        last_error=a.error,
        last_response_status=a.response_status,
        reverify=REVERIFY.format(id=_item(r).destination_id),
    )


def outbox_row(signal: Signal, now: float, marks: Marks) -> tuple[str, str, str, str, str, str]:
    """The outbox row of ``signal``: id, tenant, type, data, created_at, and
    ``about_destination`` marked with Herald's key (:func:`herald.ingest.about_column`)."""
    data = orjson.dumps(signal.data).decode()
    about = about_column(
        marks,
        event_id=signal.event_id,
        tenant_id=signal.tenant_id,
        type_=signal.type,
        data=data,
        destination_id=signal.destination_id,
    )
    return (signal.event_id, signal.tenant_id, signal.type, data, format_epoch(now), about)
