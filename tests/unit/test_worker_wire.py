"""The parent ↔ worker wire format round-trips every field, bytes of the payload included."""

from __future__ import annotations

import pytest

from herald.model import (
    Attempt,
    AttemptRecord,
    DeliveryKind,
    DeliveryStatus,
    DueDelivery,
    Event,
    Outcome,
)
from herald.workers import decode_item, decode_record, encode_item, encode_record, is_item


@pytest.mark.parametrize(
    "traceparent", [None, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"]
)
def test_a_claimed_delivery_round_trips(traceparent: str | None) -> None:
    event = Event(
        "evt_1",
        "acme",
        "task_run.completed",
        "2026-11-22T04:00:00.123456Z",
        1795320000.123456,
        '{"big":12345678901234567890123,"s":"é\\u2028\\n"}'.encode(),
        traceparent,
    )
    item = DueDelivery("dlv_1", "evtd_1", DeliveryKind.VERIFICATION, 3, 11, event)
    line = encode_item(item)
    assert b"\n" not in line  # one message per line
    assert is_item(line)
    assert decode_item(line) == item


def test_an_attempt_record_round_trips() -> None:
    for record in (
        AttemptRecord(
            Attempt(
                "att_1",
                "dlv_1",
                2,
                1795320000.5,
                12.345,
                Outcome.FAILURE_RETRYABLE,
                503,
                "HTTP 503",
                "busy\nlater",
            ),
            DeliveryStatus.PENDING,
            1795320060.5,
        ),
        AttemptRecord(
            Attempt("att_2", "dlv_2", 1, 1795320000.0, 1.0, Outcome.SUCCESS, 204),
            DeliveryStatus.SUCCESS,
            None,
            "evtd_9",
        ),
    ):
        line = encode_record(record, "webhook")
        assert b"\n" not in line
        delivery_id, got, type_id = decode_record(line)
        assert (delivery_id, got, type_id) == (record.attempt.delivery_id, record, "webhook")
