"""Row layouts and mappers shared by the SQL backends (same columns in both).

The ``*_COLUMNS`` are the column orders the named queries of both dialects select
and insert in; tests/unit/test_queries.py holds the two together."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import orjson

from herald.crypto import SecretBox
from herald.errors import CryptoError
from herald.flow import Flow
from herald.model import (
    Attempt,
    Circuit,
    Delivery,
    DeliveryKind,
    DeliveryStatus,
    Destination,
    DestinationStatus,
    Event,
    Exchange,
    Instance,
    NewDelivery,
    Outcome,
    Replay,
    ReplayOutcome,
)
from herald.ordering import WAITING

DELIVERY_COLUMNS = (
    "d.id, d.tenant_id, d.event_id, d.event_type, d.destination_id, d.kind, d.status,"
    " d.attempt_count, d.max_attempts, d.next_attempt_at, d.held, d.created_at, d.updated_at,"
    " a.id, a.number, a.started_at, a.duration_ms, a.outcome, a.response_status, a.error,"
    " a.response_excerpt, d.replay_id"
)
ATTEMPT_COLUMNS = (
    "id, delivery_id, number, started_at, duration_ms, outcome, response_status, error,"
    " response_excerpt, exchange"
)
DESTINATION_COLUMNS = (
    "id, tenant_id, name, type, config, secrets, events, status, created_at, updated_at, deleted_at"
)
DESTINATION_STATE_COLUMNS = (
    "consecutive_failures, failing_since, verification_failed_at, verification_error"
)
"""Read after :data:`DESTINATION_COLUMNS`, never written with them: the state recording
keeps (``Store.record_attempts``), not the caller's."""
EVENT_COLUMNS = "id, tenant_id, type, created_at, created_ts, data, traceparent, ordering_key"


NEW_DELIVERY_COLUMNS = (
    "id, tenant_id, event_id, event_type, destination_id, kind, max_attempts,"
    " next_attempt_at, held, created_at, lease_owner, ordering_key, order_seq, flow"
)
"""The order of :func:`new_delivery_rows`' tuples (``status`` is ``pending``,
``attempt_count`` 0 and ``updated_at`` = ``created_at`` on insert)."""


def new_delivery_rows(
    rows: Sequence[NewDelivery],
    statuses: dict[str, str],
    now: float,
    ordered: Mapping[str, tuple[int, bool]] | None = None,
    flowed: Collection[str] = (),
) -> tuple[list[tuple[Any, ...]], list[str]]:
    """The rows to insert for ``rows`` given the destinations' committed ``statuses``
    (id → status, deleted ones absent), and the ids stored leased.

    The caller reads ``statuses`` inside its write transaction, locked against
    writers (SQLite: the write lock; PostgreSQL: ``FOR SHARE``), so they cannot
    change before it commits. Event deliveries are held unless their destination
    is active: a batch planned from a catalog a few milliseconds old must not hold
    deliveries to a destination activated meanwhile, nor create any for one just
    deleted. A planned lease on a delivery that turns out held is dropped (the
    delivery is due now, for whoever activates it).

    ``ordered``: delivery id -> (``order_seq``, waits) of those that keep their ordering
    key (herald.ordering); one that waits behind its key's head is stored
    ``held = WAITING``, never leased. The others are stored without a key.

    ``flowed``: the destinations under flow control (herald.flow), whose event
    deliveries are stored in the flow lane (``flow = 1``: claimed per destination, as
    far as its gate lets)."""
    ordered = ordered or {}
    values: list[tuple[Any, ...]] = []
    leased: list[str] = []
    for d in rows:
        status = statuses.get(d.destination_id)
        if status is None:
            continue  # deleted meanwhile: no delivery
        held = status != "active" if d.kind is DeliveryKind.EVENT else d.held
        owner, next_at = d.lease_owner, d.next_attempt_at
        order = ordered.get(d.id)
        if order is not None and order[1]:
            owner, next_at, held_as = None, now, WAITING
        else:
            held_as = int(held)
        lane = int(d.kind is DeliveryKind.EVENT and d.destination_id in flowed)
        if owner is not None:
            if held or lane:  # (a catalog a moment old planned it before the flow)
                owner, next_at = None, now
            else:
                leased.append(d.id)
        values.append(
            (
                d.id,
                d.tenant_id,
                d.event_id,
                d.event_type,
                d.destination_id,
                d.kind.value,
                d.max_attempts,
                next_at,
                held_as,
                d.created_at,
                owner,
                None if order is None else d.ordering_key,
                None if order is None else order[0],
                lane,
            )
        )
    return values, leased


def destination_from_row(row: Sequence[Any], box: SecretBox) -> Destination:
    secrets: dict[str, str] = {}
    if row[5]:
        secrets = orjson.loads(box.decrypt(row[5], aad=row[0].encode()))
    return Destination(
        id=row[0],
        tenant_id=row[1],
        name=row[2],
        type=row[3],
        config=orjson.loads(row[4]),
        secrets=secrets,
        events=tuple(orjson.loads(row[6])),
        status=DestinationStatus(row[7]),
        created_at=row[8],
        updated_at=row[9],
        deleted_at=row[10],
        consecutive_failures=row[11],
        failing_since=row[12],
        verification_failed_at=row[13],
        verification_error=row[14],
        filter=orjson.loads(row[15]) if row[15] is not None else None,
        rate_limit_per_second=row[16],
        circuit_breaker=bool(row[17]),
        circuit=Circuit(row[18], row[19], row[20]) if row[17] else None,
        ordering="key" if row[21] == "key" else "none",
    )


def reencrypt_rows(rows: Sequence[Sequence[Any]], box: SecretBox) -> list[tuple[str, str]]:
    """``(new token, id)`` for each ``(id, secrets)`` row not yet under the box's current key."""
    changed: list[tuple[str, str]] = []
    for dest_id, token in rows:
        if not token:
            continue
        try:
            new = box.reencrypt(token, aad=dest_id.encode())
        except CryptoError as exc:
            raise CryptoError(f"destination {dest_id}: {exc.message}") from None
        if new is not None:
            changed.append((new, dest_id))
    return changed


def destination_to_row(dest: Destination, box: SecretBox) -> tuple[Any, ...]:
    secrets = None
    if dest.secrets:
        secrets = box.encrypt(orjson.dumps(dest.secrets), aad=dest.id.encode())
    return (
        dest.id,
        dest.tenant_id,
        dest.name,
        dest.type,
        orjson.dumps(dest.config).decode(),
        secrets,
        orjson.dumps(list(dest.events)).decode(),
        dest.status.value,
        dest.created_at,
        dest.updated_at,
        dest.deleted_at,
        None if dest.filter is None else orjson.dumps(dest.filter).decode(),
        dest.ordering,
    )


def event_from_row(row: Sequence[Any]) -> Event:
    """:data:`EVENT_COLUMNS` are :class:`Event`'s fields, in order (a test holds them)."""
    return Event(row[0], row[1], row[2], row[3], row[4], row[5].encode(), row[6], row[7])


def attempt_to_row(a: Attempt) -> tuple[Any, ...]:
    return (
        a.id,
        a.delivery_id,
        a.number,
        a.started_at,
        a.duration_ms,
        a.outcome.value,
        a.response_status,
        a.error,
        a.response_excerpt,
        _exchange_text(a.exchange),
    )


def _exchange_text(ex: Exchange | str | None) -> str | None:
    """The exchange column's JSON text: as it came from an attempt process (a str)."""
    if ex is None or isinstance(ex, str):
        return ex
    return ex.to_json()


def attempt_from_row(row: Sequence[Any]) -> Attempt:
    """:data:`ATTEMPT_COLUMNS` are :class:`Attempt`'s fields, in order (a test holds them)."""
    attempt = Attempt(*row[:9])
    attempt.outcome = Outcome(attempt.outcome)  # the column holds its value
    if len(row) > 9 and row[9] is not None:  # the column holds its JSON text
        attempt.exchange = Exchange.from_json(row[9])
    return attempt


def delivery_from_row(row: Sequence[Any]) -> Delivery:
    last = None
    if row[13] is not None:
        last = attempt_from_row((row[13], row[0], *row[14:21]))
    return Delivery(
        id=row[0],
        tenant_id=row[1],
        event_id=row[2],
        event_type=row[3],
        destination_id=row[4],
        kind=DeliveryKind(row[5]),
        status=DeliveryStatus(row[6]),
        attempt_count=row[7],
        max_attempts=row[8],
        next_attempt_at=row[9],
        held=bool(row[10]),
        created_at=row[11],
        updated_at=row[12],
        last_attempt=last,
        replay_id=row[21],
        leased=bool(row[22]) if len(row) > 22 else False,
    )


INSTANCE_COLUMNS = "id, hostname, pid, version, started_at, heartbeat_at"


def instance_to_row(i: Instance, *, heartbeat_at: float) -> tuple[Any, ...]:
    return (i.id, i.hostname, i.pid, i.version, i.started_at, heartbeat_at)


def instance_from_row(row: Sequence[Any]) -> Instance:
    return Instance(row[0], row[1], int(row[2]), row[3], float(row[4]), float(row[5]))


REPLAY_COLUMNS = (
    "id, tenant_id, filter, requested_by, created_at, matched, requeued, finished_at, cut_short"
)


def replay_to_row(r: Replay) -> tuple[Any, ...]:
    return (
        r.id,
        r.tenant_id,
        orjson.dumps(r.filter).decode(),
        r.by,
        r.created_at,
        r.matched,
        r.requeued,
        r.finished_at,
    )


def replay_from_row(row: Sequence[Any], outcome: ReplayOutcome) -> Replay:
    return Replay(
        id=row[0],
        tenant_id=row[1],
        filter=orjson.loads(row[2]),
        by=row[3],
        created_at=float(row[4]),
        matched=int(row[5]),
        requeued=int(row[6]),
        finished_at=None if row[7] is None else float(row[7]),
        outcome=outcome,
        cut_short=bool(row[8]),
    )


def replay_outcomes(rows: Sequence[Sequence[Any]]) -> dict[str, ReplayOutcome]:
    """``replay_outcomes`` rows (replay id, status, count) as each replay's outcome."""
    counts: dict[str, dict[str, int]] = {}
    for replay_id, status, n in rows:
        counts.setdefault(replay_id, {})[status] = int(n)
    return {
        rid: ReplayOutcome(
            pending=c.get("pending", 0), succeeded=c.get("success", 0), failed=c.get("failure", 0)
        )
        for rid, c in counts.items()
    }


def flow_from_row(row: Sequence[Any]) -> Flow:
    """A ``herald_flow`` row (``flow_lock``'s columns) as a :class:`herald.flow.Flow`."""
    return Flow(
        destination_id=row[0],
        rate=row[1],
        breaker=bool(row[2]),
        tat=float(row[3]),
        circuit=row[4],
        opened_at=row[5],
        next_probe_at=row[6],
        cooldown=row[7],
        gate_until=float(row[8]),
    )


def flow_to_row(flow: Flow) -> tuple[Any, ...]:
    """``set_flow``'s arguments."""
    return (
        flow.destination_id,
        flow.rate,
        int(flow.breaker),
        flow.tat,
        flow.circuit,
        flow.opened_at,
        flow.next_probe_at,
        flow.cooldown,
        flow.gate_until,
    )
