"""What a replay stores of its filter, and how its outcome is read from the counts."""

from __future__ import annotations

from herald.model import DeliveryFilter, DeliveryStatus, ReplayOutcome
from herald.replays import REPLAY_IDS_KEPT, replay_filter
from herald.store.rows import replay_outcomes


def test_the_stored_filter_names_only_what_narrowed_the_replay() -> None:
    assert replay_filter(DeliveryFilter(tenant_id="acme")) == {}
    flt = DeliveryFilter(
        tenant_id="acme",
        destination_id="evtd_1",
        status=DeliveryStatus.FAILURE,
        event_types=("a.b", "c.*"),
        since=0.0,
        until=1.5,
        ids=("dlv_1",),
    )
    assert replay_filter(flt) == {
        "destination_id": "evtd_1",
        "status": "failure",
        "event_types": ["a.b", "c.*"],
        "since": "1970-01-01T00:00:00.000000Z",
        "until": "1970-01-01T00:00:01.500000Z",
        "delivery_ids": ["dlv_1"],
    }


def test_a_long_list_of_ids_is_kept_as_its_count_and_the_first_few() -> None:
    ids = tuple(f"dlv_{i}" for i in range(REPLAY_IDS_KEPT + 1))
    stored = replay_filter(DeliveryFilter(ids=ids))
    assert stored["delivery_ids"] == list(ids[:REPLAY_IDS_KEPT])
    assert stored["delivery_id_count"] == REPLAY_IDS_KEPT + 1
    assert "delivery_id_count" not in replay_filter(DeliveryFilter(ids=ids[:-1]))


def test_outcomes_are_read_per_replay_and_status() -> None:
    rows = [("rpl_a", "success", 3), ("rpl_a", "pending", 1), ("rpl_b", "failure", 2)]
    assert replay_outcomes(rows) == {
        "rpl_a": ReplayOutcome(pending=1, succeeded=3),
        "rpl_b": ReplayOutcome(failed=2),
    }
