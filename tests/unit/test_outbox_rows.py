from __future__ import annotations

from dataclasses import replace

import pytest

from herald.crypto import SecretBox
from herald.ingest import (
    Reject,
    about_column,
    about_destination,
    parse_row,
    traceparent_problem,
    valid_traceparent,
)
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


BOX = SecretBox(b"k" * 32)
OPERATIONAL = row(type=b"herald.destination.failing", data=b'{"destination_id": "evtd_1"}')


def herald_s(outbox_row: OutboxRow, box: SecretBox = BOX, dest: str = "evtd_1") -> OutboxRow:
    """``outbox_row`` as Herald writes its own: ``about_destination`` marked with its key."""
    r = outbox_row
    about = about_column(
        box,
        event_id=bytes(r.id or b"").decode(),
        tenant_id=bytes(r.tenant_id or b"").decode(),
        type_=bytes(r.type or b"").decode(),
        data=bytes(r.data or b"").decode(),
        destination_id=dest,
    )
    return replace(outbox_row, about=about)


def test_herald_s_own_operational_row_is_an_event() -> None:
    own = herald_s(OPERATIONAL)
    assert about_destination(own.about) == "evtd_1"
    event = parse_row(own, max_payload_bytes=1024, marks=BOX)
    assert event.type == "herald.destination.failing"
    # Its data as PostgreSQL's jsonb gives it back (other spacing, other key order).
    written = herald_s(replace(OPERATIONAL, data=b'{"a":1,"b":2}'))
    assert parse_row(replace(written, data=b'{"b": 2, "a": 1}'), max_payload_bytes=99, marks=BOX)
    # Marked before a key rotation: the previous key still vouches for it.
    rotated = SecretBox(b"n" * 32, [b"k" * 32])
    assert parse_row(own, max_payload_bytes=1024, marks=rotated).type == event.type


def forgeries() -> list[tuple[str, OutboxRow]]:
    own = herald_s(OPERATIONAL)
    tag = str(own.about).partition(" ")[2]
    return [
        ("a destination alone", replace(OPERATIONAL, about="evtd_1")),
        ("a made-up mark", replace(OPERATIONAL, about="evtd_1 " + "A" * 43)),
        ("an empty value", replace(OPERATIONAL, about="")),
        ("another key's mark", herald_s(OPERATIONAL, SecretBox(b"x" * 32))),
        # A real mark copied onto other data, another id, tenant, type or destination.
        ("other data", replace(own, data=b'{"destination_id": "evtd_2"}')),
        ("another id", replace(own, id=b"evt_2")),
        ("another tenant", replace(own, tenant_id=b"acme")),
        ("another type", replace(own, type=b"herald.destination.recovered")),
        ("another destination", replace(own, about=f"evtd_2 {tag}")),
        # An ordinary type: about_destination would drop one of its deliveries.
        ("an ordinary type", replace(row(), about="evtd_1")),
    ]


@pytest.mark.parametrize(("what", "forged"), forgeries(), ids=[w for w, _ in forgeries()])
def test_a_producer_row_that_sets_about_destination_without_herald_s_mark_is_rejected(
    what: str, forged: OutboxRow
) -> None:
    """A producer writes any column of its outbox table: ``about_destination`` set
    passed a ``herald.`` row off as Herald's own operational event."""
    with pytest.raises(Reject) as caught:
        parse_row(forged, max_payload_bytes=1024, marks=BOX)
    assert caught.value.code == "about_destination_refused", what


def test_an_outbox_herald_never_writes_into_carries_none_of_its_rows() -> None:
    """Without ``marks`` (another database's outbox), even a genuine mark is refused."""
    with pytest.raises(Reject) as caught:
        parse_row(herald_s(OPERATIONAL), max_payload_bytes=1024)
    assert caught.value.code == "about_destination_refused"


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
