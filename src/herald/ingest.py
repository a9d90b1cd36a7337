"""Outbox rows into events: the validation every ingested row goes through.

Low in the import graph (model, match and timeutil only) so that both the relay
and the stores, which parse a row still waiting in the outbox, use it without an
import cycle.
"""

from __future__ import annotations

import re
from typing import Protocol

import orjson

from herald.match import validate_event_type
from herald.model import DEFAULT_TENANT, OPERATIONAL_PREFIX, Event, OutboxRow, is_operational
from herald.timeutil import parse_timestamp

MAX_ID_LENGTH = 255

FORMAT_CHARACTERS = (
    "\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f"
    "\u2028-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd"
    "\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001"
    "\U000e0020-\U000e007f"
)
"""A regex class body: Unicode's format characters (category Cf, Unicode 15.1: bidi
overrides and isolates, zero-width ones, tags) and the line and paragraph separators.
Invisible, they make a name or an id show as another (``bidi\\u202egnp.exe`` reads
``bidiexe.png``); ``tests/unit/test_repoint.py`` holds the list to unicodedata."""
CONTROL = re.compile(f"[\x00-\x1f\x7f-\x9f{FORMAT_CHARACTERS}]")
"""C0 controls, DEL, C1 controls and :data:`FORMAT_CHARACTERS`: in an id or a name they
would break a header line (``evt_x\r\nX-Injected: yes``), a log line or an operator's
terminal, or show it as something it is not."""


def control_problem(text: str, name: str) -> str | None:
    """Why ``text`` cannot be an id, a type or a name: it holds a control or format
    character (:data:`CONTROL`)."""
    found = CONTROL.search(text)
    if found is None:
        return None
    kind = "control" if found.group() <= "\x9f" else "format"
    return f"{name} contains a {kind} character ({found.group()!r} at {found.start()})"


MAX_ORDERING_KEY_LENGTH = 255


def ordering_key_problem(key: str) -> str | None:
    """Why ``key`` cannot be an ordering key: empty, longer than 255 characters, or
    holding a control or format character (it is shown, logged and sent as a header)."""
    if not key or len(key) > MAX_ORDERING_KEY_LENGTH:
        return f"ordering_key must be 1 to {MAX_ORDERING_KEY_LENGTH} characters"
    return control_problem(key, "ordering_key")


def reserved_type_problem(event_type: str) -> str | None:
    """Why a producer or an API client may not publish ``event_type``: it is under the
    ``herald.`` prefix, which only Herald's own operational events use."""
    if not is_operational(event_type):
        return None
    return (
        f"event type {event_type[:128]!r} is reserved: types under {OPERATIONAL_PREFIX!r} are"
        " Herald's own operational events"
    )


def event_id_problem(event_id: str) -> str | None:
    """Why ``event_id`` is not an event id (``evt_…``, at most 255 characters, no
    control character), or None."""
    if not event_id.startswith("evt_") or len(event_id) <= 4:
        return f"id {event_id[:64]!r} must start with 'evt_'"
    if len(event_id) > MAX_ID_LENGTH:
        return f"id is longer than {MAX_ID_LENGTH} characters"
    return control_problem(event_id, "id")


TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}")
"""A W3C Trace Context ``traceparent`` of version 00, lower-case hex as the
recommendation writes it."""
_ZERO_TRACE = "0" * 32
_ZERO_PARENT = "0" * 16


def traceparent_problem(value: str) -> str | None:
    """Why ``value`` is not a W3C ``traceparent`` Herald carries (version 00, a 32-hex
    trace id and a 16-hex parent id, neither all zeros, 2-hex flags, lower case), or None."""
    found = TRACEPARENT.fullmatch(value)
    if found is None:
        return (
            f"traceparent {value[:64]!r} is not '00-<32 hex trace id>-<16 hex parent id>"
            "-<2 hex flags>' in lower case"
        )
    if found.group(1) == _ZERO_TRACE:
        return "traceparent has an all-zero trace id"
    if found.group(2) == _ZERO_PARENT:
        return "traceparent has an all-zero parent id"
    return None


def valid_traceparent(raw: bytes | str | None) -> str | None:
    """``raw`` as a traceparent if it is a valid one, else None (an invalid trace context
    is dropped, never a reason to refuse the event)."""
    if raw is None:
        return None
    if isinstance(raw, bytes):
        # A valid one is ASCII; anything else is invalid, whatever its encoding.
        raw = raw.decode("ascii", "replace")
    return raw if traceparent_problem(raw) is None else None


class Marks(Protocol):
    """The key that marks Herald's own outbox rows (``herald.crypto.SecretBox``)."""

    def mac(self, message: bytes) -> str: ...

    def mac_matches(self, message: bytes, tag: str) -> bool: ...


def _mark_message(event_id: str, tenant_id: str, type_: str, data: object, about: str) -> bytes:
    """What the mark on one of Herald's own outbox rows binds: the row's event (its data
    as values, keys sorted: PostgreSQL's jsonb gives back other bytes than were written)
    and the destination it is about, each field length-prefixed."""
    fields = [f.encode() for f in (event_id, tenant_id, type_, about)]
    fields.append(orjson.dumps(data, option=orjson.OPT_SORT_KEYS))
    return b"".join(len(f).to_bytes(8, "big") + f for f in fields)


def about_column(
    marks: Marks, *, event_id: str, tenant_id: str, type_: str, data: str, destination_id: str
) -> str:
    """The ``about_destination`` of an operational event Herald writes into its outbox:
    the destination, a space, and the mark only Herald's key makes (so that a producer,
    who can write any column of the table, cannot pass a row off as Herald's own)."""
    message = _mark_message(event_id, tenant_id, type_, orjson.loads(data), destination_id)
    return f"{destination_id} {marks.mac(message)}"


def about_destination(about: str | None) -> str | None:
    """The destination an ``about_destination`` value names (its mark aside)."""
    return None if about is None else about.partition(" ")[0]


def _marked(marks: Marks | None, about: str, event: tuple[str, str, str], data: object) -> bool:
    destination_id, _, tag = about.partition(" ")
    if marks is None or not destination_id or not tag:
        return False
    try:
        message = _mark_message(*event, data, destination_id)
    except (orjson.JSONEncodeError, UnicodeEncodeError):
        return False  # data no mark was ever made of (Herald writes plain JSON objects)
    return marks.mac_matches(message, tag)


class Reject(Exception):
    """Why one outbox row cannot become an event (``code: detail``)."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code


def _text(raw: bytes | None, name: str) -> str:
    if raw is None:
        raise Reject(f"missing_{name}", f"{name} is NULL")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Reject(f"invalid_{name}", f"{name} is not valid UTF-8 ({exc.reason})") from exc
    if "\x00" in text:
        raise Reject(f"invalid_{name}", f"{name} contains a NUL character")
    return text


def parse_row(row: OutboxRow, *, max_payload_bytes: int, marks: Marks | None = None) -> Event:
    """Validate one raw outbox row into an event, or raise :class:`Reject`.

    ``marks``: the key of Herald's own rows (Herald's outbox); a row that sets
    ``about_destination`` without its mark is refused, and with ``marks`` None (an
    outbox Herald never writes into) every row that sets it is."""
    event_id = _text(row.id, "id")
    if (problem := event_id_problem(event_id)) is not None:
        raise Reject("invalid_id", problem)
    tenant = _text(row.tenant_id, "tenant_id") if row.tenant_id is not None else DEFAULT_TENANT
    if not tenant or len(tenant) > MAX_ID_LENGTH:
        raise Reject("invalid_tenant_id", "tenant_id must be 1 to 255 characters")
    if (problem := control_problem(tenant, "tenant_id")) is not None:
        raise Reject("invalid_tenant_id", problem)
    type_ = _text(row.type, "type")
    try:
        validate_event_type(type_)
    except ValueError as exc:
        raise Reject("invalid_type", str(exc)) from exc
    if row.about is None and (problem := reserved_type_problem(type_)) is not None:
        raise Reject("reserved_type", problem)
    if row.data is None:
        raise Reject("missing_data", "data is NULL")
    if len(row.data) > max_payload_bytes:
        raise Reject(
            "payload_too_large",
            f"data is {len(row.data)} bytes, over the {max_payload_bytes}-byte limit",
        )
    try:
        data = orjson.loads(row.data)
    except orjson.JSONDecodeError as exc:
        raise Reject("invalid_json", f"data is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise Reject("invalid_data", f"data must be a JSON object, not {type(data).__name__}")
    if row.about is not None and not _marked(marks, row.about, (event_id, tenant, type_), data):
        raise Reject(
            "about_destination_refused",
            "about_destination is Herald's own column, set on the operational events it"
            " writes with a mark of its key; producers leave it NULL",
        )
    # The producer's own bytes go out, not a re-serialisation: a parser round
    # trip would turn integers beyond 64 bits into floats and change the payload.
    payload = row.data.strip()
    created_raw = _text(row.created_at, "created_at")
    try:
        instant = parse_timestamp(created_raw)
    except ValueError as exc:
        raise Reject("invalid_created_at", str(exc)) from exc
    key = None
    if row.ordering_key is not None:
        key = _text(row.ordering_key, "ordering_key")
        if (problem := ordering_key_problem(key)) is not None:
            raise Reject("invalid_ordering_key", problem)
    return Event(
        id=event_id,
        tenant_id=tenant,
        type=type_,
        created_at=instant.text,
        created_ts=instant.epoch,
        data=payload,
        traceparent=valid_traceparent(row.traceparent),
        ordering_key=key,
    )
