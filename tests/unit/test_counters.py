"""What recorded attempts add to the per-destination counters, and how pages say it."""

from __future__ import annotations

from herald.model import (
    Attempt,
    AttemptRecord,
    DeliveryKind,
    DeliveryStatus,
    DestinationHealth,
    DueDelivery,
    Event,
    Outcome,
)
from herald.store.counters import HOUR, tally
from herald.views import health_view, rate_text

EVENT = Event("evt_1", "default", "a.b", "2026-11-25T00:00:00Z", 0.0, b"{}")


def record(dest: str, at: float, outcome: Outcome, *, item: bool = True) -> AttemptRecord:
    attempt = Attempt("att_x", "dlv_x", 1, at, 1.0, outcome)
    due = DueDelivery("dlv_x", dest, DeliveryKind.EVENT, 0, 11, EVENT) if item else None
    return AttemptRecord(attempt, DeliveryStatus.PENDING, None, None, due)


def test_tally_adds_per_destination_and_hour_in_lock_order() -> None:
    h = 1000 * HOUR
    last, hours = tally(
        [
            record("evtd_b", h + 10, Outcome.SUCCESS),
            record("evtd_a", h + 20, Outcome.TIMEOUT),
            record("evtd_b", h + 5, Outcome.SUCCESS),  # earlier: not the last success
            record("evtd_b", h + HOUR + 1, Outcome.FAILURE_PERMANENT),
            record("evtd_a", h + 30, Outcome.SUCCESS),
            record("evtd_c", h, Outcome.SUCCESS, item=False),  # no delivery: not counted
        ]
    )
    assert last == [("evtd_a", h + 30, h + 20), ("evtd_b", h + 10, h + HOUR + 1)]
    assert hours == [
        ("evtd_a", 1000, 1, 1),
        ("evtd_b", 1000, 2, 0),
        ("evtd_b", 1001, 0, 1),
    ]
    assert tally([]) == ([], [])


def test_the_failure_rate_in_words_and_in_json() -> None:
    assert rate_text(None) == "-"
    assert rate_text(DestinationHealth()) == "-"
    assert rate_text(DestinationHealth(successes=3, failures=1)) == "25 % (1 of 4)"
    assert rate_text(DestinationHealth(successes=2, failures=1)) == "33.3 % (1 of 3)"
    assert rate_text(DestinationHealth(successes=0, failures=2)) == "100 % (2 of 2)"
    assert health_view(None) == {
        "last_success_at": None,
        "last_failure_at": None,
        "attempts_24h": 0,
        "failed_24h": 0,
        "failure_rate": None,
    }
    view = health_view(DestinationHealth(last_success_at=0.0, successes=2, failures=1))
    assert view["last_success_at"] == "1970-01-01T00:00:00.000000Z"
    assert (view["attempts_24h"], view["failed_24h"], view["failure_rate"]) == (3, 1, 0.3333)
