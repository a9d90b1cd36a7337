"""Tests for herald.signals: the episode rule and the operational events' shapes."""

from __future__ import annotations

import time

from herald.crypto import SecretBox
from herald.ingest import about_destination, parse_row
from herald.model import (
    DESTINATION_FAILING,
    DESTINATION_RECOVERED,
    Attempt,
    AttemptRecord,
    DeliveryKind,
    DeliveryStatus,
    DueDelivery,
    Event,
    OutboxRow,
    Outcome,
)
from herald.signals import DestinationState, destinations_of, episodes, exhausted, outbox_row

NOW = 1_800_000_000.0


def item(dest: str = "evtd_a", kind: DeliveryKind = DeliveryKind.EVENT, n: int = 0) -> DueDelivery:
    event = Event(f"evt_{n}", "acme", "a.b", "2026-11-22T10:00:00Z", NOW, b"{}")
    return DueDelivery(f"dlv_{n}", dest, kind, 0, 0, event)


def rec(
    ok: bool, *, dest: str = "evtd_a", kind: DeliveryKind = DeliveryKind.EVENT, n: int = 0
) -> AttemptRecord:
    attempt = Attempt(
        f"att_{n}_{time.perf_counter_ns()}",
        f"dlv_{n}",
        1,
        NOW,
        1.0,
        Outcome.SUCCESS if ok else Outcome.TIMEOUT,
        error=None if ok else "no response within 5 s",
    )
    status = DeliveryStatus.SUCCESS if ok else DeliveryStatus.PENDING
    return AttemptRecord(attempt, status, None, None, item(dest, kind, n))


def run(outcomes: list[bool], state: DestinationState, *, after: int = 3) -> list[str]:
    signals, _ = episodes(
        [rec(ok, n=i) for i, ok in enumerate(outcomes)],
        {"evtd_a": state},
        failing_after=after,
        now=NOW,
    )
    return [s.type for s in signals]


def test_the_threshold_opens_one_episode_and_a_success_closes_it() -> None:
    state = DestinationState("webhook", 0, None)
    assert run([False, False], state) == []
    assert (state.consecutive_failures, state.failing_since) == (2, None)
    assert run([False], state) == [DESTINATION_FAILING]
    assert (state.consecutive_failures, state.failing_since) == (3, NOW)
    assert run([False] * 10, state) == []  # once per episode
    assert state.consecutive_failures == 13
    assert run([True, True], state) == [DESTINATION_RECOVERED]
    assert (state.consecutive_failures, state.failing_since) == (0, None)
    assert run([False, False, False], state) == [DESTINATION_FAILING]  # a new episode


def test_a_success_before_the_threshold_starts_the_count_again() -> None:
    state = DestinationState("webhook", 0, None)
    assert run([False, False, True, False, False, True], state) == []
    assert state.consecutive_failures == 0


def test_a_lowered_threshold_takes_effect_at_the_next_failure() -> None:
    state = DestinationState("webhook", 7, None)
    assert run([False], state, after=5) == [DESTINATION_FAILING]


def test_what_changed_and_what_did_not() -> None:
    clean = DestinationState("webhook", 0, None)
    _, changed = episodes([rec(True)], {"evtd_a": clean}, failing_after=3, now=NOW)
    assert changed == set()
    _, changed = episodes([rec(False)], {"evtd_a": clean}, failing_after=3, now=NOW)
    assert changed == {"evtd_a"}


def test_verification_pings_do_not_count_test_pings_do() -> None:
    state = DestinationState("webhook", 0, None)
    records = [rec(False, kind=DeliveryKind.VERIFICATION), rec(False, kind=DeliveryKind.TEST)]
    episodes(records, {"evtd_a": state}, failing_after=3, now=NOW)
    assert state.consecutive_failures == 1


def test_a_deleted_destination_or_a_record_without_its_delivery_signals_nothing() -> None:
    bare = rec(False)
    bare.item = None
    signals, changed = episodes([bare, rec(False, dest="evtd_gone")], {}, failing_after=1, now=NOW)
    assert (signals, changed) == ([], set())


def test_the_failing_event_says_what_failed() -> None:
    state = DestinationState("aws_sqs", 0, None)
    r = rec(False)
    [signal], _ = episodes([r], {"evtd_a": state}, failing_after=1, now=NOW)
    assert signal.event_id == f"evt_destination_failing_{r.attempt.id}"
    assert (signal.tenant_id, signal.destination_id) == ("acme", "evtd_a")
    assert signal.data == {
        "destination_id": "evtd_a",
        "destination_type": "aws_sqs",
        "consecutive_failures": 1,
        "failing_since": "2027-01-15T08:00:00.000000Z",
        "last_delivery_id": "dlv_0",
        "last_error": "no response within 5 s",
        "last_response_status": None,
    }
    box = SecretBox(b"k" * 32)
    row = outbox_row(signal, NOW, box)
    assert row[:3] == (signal.event_id, "acme", DESTINATION_FAILING)
    assert about_destination(row[5]) == "evtd_a"  # and Herald's mark
    id_, tenant, type_, data, created_at = (f.encode() for f in row[:5])
    written = OutboxRow(1, id_, tenant, type_, data, created_at, about=row[5])
    assert parse_row(written, max_payload_bytes=1 << 20, marks=box).id == signal.event_id


def test_locks_cover_failures_and_activations_in_id_order() -> None:
    ok, bad = rec(True, dest="evtd_b"), rec(False, dest="evtd_c", n=1)
    ping = rec(True, dest="evtd_a", kind=DeliveryKind.VERIFICATION, n=2)
    ping.activates_destination = "evtd_a"
    assert destinations_of([bad, ok, ping]) == (
        ["evtd_a", "evtd_b", "evtd_c"],
        ["evtd_a", "evtd_c"],
    )


def test_the_exhaustion_of_an_operational_event_signals_nothing() -> None:
    r = rec(False)
    assert r.item is not None
    r.item.event.type = "herald.destination.failing"
    assert exhausted(r, "webhook") is None
