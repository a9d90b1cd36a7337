"""The parent ↔ worker wire format round-trips every field, bytes of the payload included."""

from __future__ import annotations

import asyncio

import pytest

from herald import wire
from herald.model import (
    Attempt,
    AttemptRecord,
    DeliveryKind,
    DeliveryStatus,
    DueDelivery,
    Event,
    Outcome,
)
from herald.wire import (
    decode_item,
    decode_record,
    encode_item,
    encode_record,
    is_item,
    read_lines,
)


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


async def _lines_of(chunks: list[bytes]) -> list[list[bytes]]:
    reader = asyncio.StreamReader()
    for chunk in chunks:
        reader.feed_data(chunk)
    reader.feed_eof()
    return [batch async for batch in read_lines(reader)]


async def test_lines_are_read_whole_however_the_pipe_cuts_them() -> None:
    """A pipe's reads end anywhere: a line is yielded only once its newline came, and
    the lines that arrived together come together."""
    got = await _lines_of([b'["a",1]\n["b"', b',2]\n["c",3]\n', b"tail"])
    assert [line for batch in got for line in batch] == [
        b'["a",1]',
        b'["b",2]',
        b'["c",3]',
        b"tail",  # a last line without its newline still comes, at the end
    ]
    assert await _lines_of([]) == []
    assert await _lines_of([b"x\n"]) == [[b"x"]]


async def test_a_record_line_from_a_worker_decodes_from_a_batch() -> None:
    record = AttemptRecord(
        Attempt("att_1", "dlv_1", 1, 1.0, 2.0, Outcome.SUCCESS, 204),
        DeliveryStatus.SUCCESS,
        None,
    )
    line = encode_record(record, "webhook")
    [batch] = await _lines_of([line + b"\n" + line + b"\n"])
    assert [decode_record(x)[1] for x in batch] == [record, record]


async def test_a_line_over_the_limit_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wire, "LINE_LIMIT", 8)
    with pytest.raises(ValueError, match="longer than"):
        await _lines_of([b"0123456789abcdef"])
