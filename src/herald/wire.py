"""What crosses the pipes between the daemon and its attempt processes (herald.workers):
a claimed delivery one way, an attempt's record the other, a flat JSON array a line,
written in batches once per loop turn and read in chunks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import orjson

from herald.model import (
    Attempt,
    AttemptRecord,
    DeliveryKind,
    DeliveryStatus,
    DueDelivery,
    Event,
    Outcome,
)
from herald.store.rows import attempt_to_row

LINE_LIMIT = 1 << 26  # an event of up to relay.max_payload_bytes, and then some


def encode_item(item: DueDelivery) -> bytes:
    """A claimed delivery and its event as a flat JSON array (a control message is an
    object: the child tells them apart by the first byte)."""
    e = item.event
    return orjson.dumps(
        [
            item.id,
            item.destination_id,
            item.kind.value,
            item.attempt_count,
            item.max_attempts,
            e.id,
            e.tenant_id,
            e.type,
            e.created_at,
            e.created_ts,
            e.data.decode(),
            e.traceparent,
            e.ordering_key,
            item.ordering_key,
            item.owner,
        ]
    )


def is_item(line: bytes) -> bool:
    """Whether a line to a child is an attempt (:func:`encode_item`), not a control message."""
    return line[:1] == b"["


_KINDS = {k.value: k for k in DeliveryKind}


def decode_item(line: bytes) -> DueDelivery:
    (
        id_,
        destination_id,
        kind,
        attempt_count,
        max_attempts,
        eid,
        tenant,
        type_,
        created_at,
        created_ts,
        data,
        traceparent,
        event_key,
        ordering_key,
        owner,
    ) = orjson.loads(line)
    event = Event(
        eid, tenant, type_, created_at, float(created_ts), data.encode(), traceparent, event_key
    )
    return DueDelivery(
        id_,
        destination_id,
        _KINDS[kind],
        int(attempt_count),
        int(max_attempts),
        event,
        ordering_key=ordering_key,
        owner=owner,
    )


def encode_record(record: AttemptRecord, type_id: str) -> bytes:
    """One attempt's record as a flat JSON array: the delivery's next state, then the
    attempt's row in :data:`~herald.store.rows.ATTEMPT_COLUMNS` order, its exchange
    as the JSON text the column holds (the parent writes it without parsing it)."""
    return orjson.dumps(
        [
            type_id,
            record.status.value,
            record.next_attempt_at,
            record.activates_destination,
            *attempt_to_row(record.attempt),
        ]
    )


_OUTCOMES = {o.value: o for o in Outcome}
_STATUSES = {s.value: s for s in DeliveryStatus}


def decode_record(line: bytes) -> tuple[str, AttemptRecord, str]:
    """:func:`encode_record`'s line back: (delivery id, record, destination type id).
    The exchange stays the text it came as (``Attempt.exchange`` as a str)."""
    msg = orjson.loads(line)
    type_id, status, next_attempt_at, activates, att_id, delivery_id, *rest = msg
    number, started_at, duration_ms, outcome, response_status, error, excerpt, exchange = rest
    attempt = Attempt(
        att_id,
        delivery_id,
        number,
        started_at,
        duration_ms,
        _OUTCOMES[outcome],
        response_status,
        error,
        excerpt,
        exchange,
    )
    record = AttemptRecord(attempt, _STATUSES[status], next_attempt_at, activates)
    return delivery_id, record, type_id


READ_CHUNK = 1 << 18


async def read_lines(reader: asyncio.StreamReader) -> AsyncIterator[list[bytes]]:
    """The lines of a pipe, as many at a time as have arrived (one read and one wake-up
    for all of them, where ``readline`` costs a coroutine each); a line is yielded
    only once whole, its newline cut. A last line without a newline comes at the end;
    a line longer than :data:`LINE_LIMIT` is an error (``ValueError``), as with
    ``readline``."""
    rest = b""
    while chunk := await reader.read(READ_CHUNK):
        if rest:
            chunk = rest + chunk
        *lines, rest = chunk.split(b"\n")
        if len(rest) > LINE_LIMIT:
            raise ValueError(f"a line longer than {LINE_LIMIT} bytes")
        if lines:
            yield lines
    if rest:
        yield [rest]


class LineBatcher:
    """Lines sent to one pipe in the same loop turn go out in one write (one system
    call and one wake-up on the other side instead of one per line)."""

    def __init__(self, writer: asyncio.StreamWriter, loop: asyncio.AbstractEventLoop) -> None:
        self._writer = writer
        self._loop = loop
        self._lines: list[bytes] = []

    def send(self, line: bytes) -> None:
        if not self._lines:
            self._loop.call_soon(self.flush)
        self._lines.append(line)

    def flush(self) -> None:
        if not self._lines:
            return
        data = b"".join(self._lines)
        self._lines.clear()
        if not self._writer.is_closing():
            self._writer.write(data)
