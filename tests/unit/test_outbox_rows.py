from __future__ import annotations

from dataclasses import replace

import pytest

from herald.ingest import Reject, parse_row, traceparent_problem, valid_traceparent
from herald.model import OutboxRow


def row(**kw: bytes | None) -> OutboxRow:
    base: dict[str, bytes | None] = {
        "id": b"evt_1",
        "tenant_id": b"default",
        "type": b"task_run.completed",
        "data": b'{"task_run_id": "trun_1", "status": "completed"}',
        "created_at": b"2026-11-22 10:00:00.123",
    }
    traceparent = kw.pop("traceparent", None)
    base.update(kw)
    b = base
    return OutboxRow(
        1, b["id"], b["tenant_id"], b["type"], b["data"], b["created_at"], traceparent=traceparent
    )


def test_good_row_becomes_a_normalized_event() -> None:
    event = parse_row(row(), max_payload_bytes=1024)
    assert event.id == "evt_1"
    assert event.type == "task_run.completed"
    assert event.created_at == "2026-11-22T10:00:00.123Z"
    assert event.data == b'{"task_run_id": "trun_1", "status": "completed"}'
    assert event.envelope() == (
        b'{"id":"evt_1","type":"task_run.completed","created_at":"2026-11-22T10:00:00.123Z",'
        b'"data":{"task_run_id": "trun_1", "status": "completed"}}'
    )


def test_payload_goes_out_as_the_producer_wrote_it() -> None:
    big = b' {"n": 123456789012345678901234567890, "f": 1.10} \n'
    event = parse_row(row(data=big), max_payload_bytes=1024)
    assert event.data == b'{"n": 123456789012345678901234567890, "f": 1.10}'


def test_offset_timestamps_are_converted_to_utc() -> None:
    event = parse_row(row(created_at=b"2026-11-22T12:00:00.5+02:00"), max_payload_bytes=1024)
    assert event.created_at == "2026-11-22T10:00:00.5Z"


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"data": b"{not json"}, "invalid_json"),
        ({"data": b"[1, 2]"}, "invalid_data"),
        ({"data": b'"text"'}, "invalid_data"),
        ({"data": b"\xff\xfe{}"}, "invalid_json"),
        ({"data": b'{"a": "\x00"}'}, "invalid_json"),
        ({"data": None}, "missing_data"),
        ({"type": b""}, "invalid_type"),
        ({"type": b"Bad Type"}, "invalid_type"),
        ({"id": b"123"}, "invalid_id"),
        ({"id": b"evt_"}, "invalid_id"),
        ({"id": b"evt_\xff"}, "invalid_id"),
        ({"id": b"evt_a\x00b"}, "invalid_id"),
        # Control characters (C0, DEL, C1): a header injection, a broken log line.
        ({"id": b"evt_x\r\nX-Injected: yes"}, "invalid_id"),
        ({"id": b"evt_x\x7f"}, "invalid_id"),
        ({"id": "evt_x\u0085".encode()}, "invalid_id"),
        ({"type": b"a.b\r\nX-Injected: yes"}, "invalid_type"),
        ({"tenant_id": b"acme\x1b[2J"}, "invalid_tenant_id"),
        ({"tenant_id": b""}, "invalid_tenant_id"),
        ({"created_at": b"yesterday"}, "invalid_created_at"),
        ({"created_at": b"2026-02-30T00:00:00Z"}, "invalid_created_at"),
        ({"data": b'{"x": "' + b"a" * 2000 + b'"}'}, "payload_too_large"),
    ],
)
def test_poison_rows_are_rejected_with_a_coded_reason(
    fields: dict[str, bytes | None], code: str
) -> None:
    with pytest.raises(Reject) as info:
        parse_row(row(**fields), max_payload_bytes=1024)
    assert info.value.code == code
    assert str(info.value).startswith(code + ": ")


def test_deeply_nested_json_is_rejected_not_crashing() -> None:
    deep = b'{"a":' + b"[" * 5000 + b"]" * 5000 + b"}"
    with pytest.raises(Reject) as info:
        parse_row(row(data=deep), max_payload_bytes=1 << 20)
    assert info.value.code == "invalid_json"


@pytest.mark.parametrize(
    "type_",
    [b"herald.delivery.exhausted", b"herald.destination.failing", b"herald.anything.else"],
)
def test_a_producer_row_of_a_reserved_type_is_rejected(type_: bytes) -> None:
    with pytest.raises(Reject) as caught:
        parse_row(row(type=type_), max_payload_bytes=1024)
    assert caught.value.code == "reserved_type"
    assert "Herald's own operational events" in str(caught.value)


def test_herald_s_own_operational_row_is_an_event() -> None:
    herald_s = replace(row(type=b"herald.destination.failing"), about="evtd_1")
    event = parse_row(herald_s, max_payload_bytes=1024)
    assert event.type == "herald.destination.failing"


def test_a_type_that_only_starts_like_the_prefix_is_not_reserved() -> None:
    assert parse_row(row(type=b"heralding.x"), max_payload_bytes=1024).type == "heralding.x"
    assert parse_row(row(type=b"herald"), max_payload_bytes=1024).type == "herald"


TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.mark.parametrize(
    "value",
    [
        TRACEPARENT,
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00",  # not sampled
        "00-00000000000000000000000000000001-0000000000000001-ff",
    ],
)
def test_a_w3c_traceparent_is_carried(value: str) -> None:
    assert traceparent_problem(value) is None
    event = parse_row(row(traceparent=value.encode()), max_payload_bytes=1024)
    assert event.traceparent == value
    assert event.metadata()["traceparent"] == value


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("", "is not"),
        ("01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "is not"),  # version
        ("ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "is not"),
        ("00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01", "is not"),  # upper case
        ("00-0af7651916cd43dd8448eb211c8031-b7ad6b7169203331-01", "is not"),  # short trace id
        ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b716920333-01", "is not"),  # short parent
        ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-1", "is not"),  # short flags
        ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-x", "is not"),
        ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\n", "is not"),
        (" 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "is not"),
        ("00_0af7651916cd43dd8448eb211c80319c_b7ad6b7169203331_01", "is not"),
        ("00-0af7651916cd43dd8448eb211c80319g-b7ad6b7169203331-01", "is not"),  # not hex
        ("00-00000000000000000000000000000000-b7ad6b7169203331-01", "all-zero trace id"),
        ("00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01", "all-zero parent id"),
    ],
)
def test_an_invalid_traceparent_is_dropped_not_the_event(value: str, problem: str) -> None:
    found = traceparent_problem(value)
    assert found is not None
    assert problem in found
    event = parse_row(row(traceparent=value.encode()), max_payload_bytes=1024)
    assert event.traceparent is None
    assert "traceparent" not in event.metadata()
    assert event.data == parse_row(row(), max_payload_bytes=1024).data  # payload untouched


def test_undecodable_traceparent_bytes_are_dropped() -> None:
    bad = TRACEPARENT.encode()[:-2] + b"\xff\xfe"
    assert parse_row(row(traceparent=bad), max_payload_bytes=1024).traceparent is None
    assert valid_traceparent(None) is None
    assert valid_traceparent(TRACEPARENT) == TRACEPARENT
