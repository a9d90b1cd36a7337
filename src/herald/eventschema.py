"""Event types' JSON Schemas (draft 2020-12): checked when stored, compiled once per
schema text and cached, and the violations of a payload as ``data.<json path>``.

The library is ``jsonschema-rs`` (Rust, with a typed Python binding): it implements
the whole 2020-12 vocabulary (the official test suite), checks a schema against the
metaschema, and validates a payload in about a microsecond where the pure-Python
``jsonschema`` takes hundreds (the relay checks every event of a type with a schema:
``bench/schemas.py``). Two of its options matter here: a remote ``$ref`` is never
fetched (a schema that needs one is refused when stored), and ``pattern`` runs on
the linear-time ``regex`` engine, never a backtracking one (the pattern is the
tenant's). ``format`` is an annotation, as 2020-12 says by default.

Also the catalog entries of Herald's own operational event types (``herald.…``):
they exist for every tenant and describe what :mod:`herald.recorder` writes.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any, Final

import jsonschema_rs
import orjson

from herald.errors import ValidationError
from herald.model import (
    CIRCUIT_CLOSED,
    CIRCUIT_OPENED,
    DELIVERY_EXHAUSTED,
    DESTINATION_FAILING,
    DESTINATION_RECOVERED,
    VERIFICATION_FAILED,
)

__all__ = [
    "MAX_SCHEMA_BYTES",
    "MAX_VIOLATIONS",
    "OPERATIONAL_CATALOG",
    "Validator",
    "check_schema",
    "schema_text",
    "validator_for",
    "violations",
]

MAX_SCHEMA_BYTES: Final = 64 * 1024
"""A schema's size as compact JSON."""
MAX_VIOLATIONS: Final = 20
"""Violations reported for one payload."""
DIALECT: Final = "https://json-schema.org/draft/2020-12/schema"

Validator = jsonschema_rs.Draft202012Validator


def schema_text(schema: dict[str, Any]) -> str:
    """The schema as the store keeps it and the cache knows it: compact, keys sorted."""
    return orjson.dumps(schema, option=orjson.OPT_SORT_KEYS).decode()


def _no_fetch(uri: str) -> Any:
    raise ValueError(f"Herald does not fetch {uri}: put what it refers to under $defs")


def _compile(schema: dict[str, Any]) -> Validator:
    return jsonschema_rs.Draft202012Validator(
        schema,
        retriever=_no_fetch,
        pattern_options=jsonschema_rs.RegexOptions(size_limit=1 << 20, dfa_size_limit=1 << 20),
    )


def _invalid(message: str, field: str) -> ValidationError:
    return ValidationError(message, field=field, code="schema_invalid")


def check_schema(schema: Any, *, field: str = "schema") -> dict[str, Any]:
    """``schema`` if it is a valid 2020-12 JSON Schema object within the size limit,
    compiling as Herald runs it; raises ValidationError naming ``field`` (and the place
    inside it) otherwise."""
    if not isinstance(schema, dict):
        raise _invalid("a schema is a JSON object", field)
    if len(schema_text(schema)) > MAX_SCHEMA_BYTES:
        raise _invalid(f"a schema is at most {MAX_SCHEMA_BYTES} bytes as JSON", field)
    declared = schema.get("$schema")
    if declared is not None and declared not in (DIALECT, DIALECT + "#"):
        raise _invalid(
            f"$schema must be {DIALECT} (JSON Schema 2020-12) or left out", field + ".$schema"
        )
    try:
        jsonschema_rs.meta.validate(schema)
    except jsonschema_rs.ValidationError as exc:
        where = _where(exc.instance_path)
        raise _invalid(
            f"not a valid JSON Schema 2020-12: {exc.message[:300]}", field + where
        ) from None
    try:
        _compile(schema)
    except jsonschema_rs.ValidationError as exc:
        raise _invalid(f"the schema cannot be used: {exc.message[:300]}", field) from None
    return schema


@functools.lru_cache(maxsize=1024)
def validator_for(text: str) -> Validator:
    """The compiled validator of a schema's :func:`schema_text`, made once per text."""
    return _compile(orjson.loads(text))


def _where(path: Sequence[str | int]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)


def _paths(error: jsonschema_rs.ValidationError) -> Iterable[str]:
    base = "data" + _where(error.instance_path)
    if isinstance(error.kind, jsonschema_rs.ValidationErrorKind.Required):
        # A missing property is named by its own path: that is what the caller adds.
        return [f"{base}.{error.kind.property}"]
    return [base]


def violations(
    validator: Validator, data: Any, *, limit: int = MAX_VIOLATIONS
) -> list[tuple[str, str]]:
    """``(path, message)`` of each way ``data`` breaks the schema, at most ``limit``, in
    the schema's order; ``path`` is ``data.<json path>``."""
    if validator.is_valid(data):
        return []
    found: list[tuple[str, str]] = []
    for error in validator.iter_errors(data):
        found.extend((path, error.message[:300]) for path in _paths(error))
        if len(found) >= limit:
            break
    return found[:limit]


_ID = {"type": "string"}
_TEXT_OR_NULL = {"type": ["string", "null"]}
_STATUS_OR_NULL = {"type": ["integer", "null"]}
_TIME = {"type": "string", "format": "date-time"}


def _about_destination(required: list[str], properties: dict[str, Any]) -> dict[str, Any]:
    """The schema of an operational event's data: every one names the destination it is
    about (``destination_id``, ``destination_type``) before its own fields."""
    return {
        "type": "object",
        "required": ["destination_id", "destination_type", *required],
        "properties": {"destination_id": _ID, "destination_type": _ID, **properties},
    }


OPERATIONAL_CATALOG: Final[dict[str, tuple[str, dict[str, Any]]]] = {
    DELIVERY_EXHAUSTED: (
        "An event delivery ran out of attempts (status failure).",
        _about_destination(
            ["delivery_id", "event_id", "event_type"],
            {
                "delivery_id": _ID,
                "event_id": _ID,
                "event_type": _ID,
                "attempts": {"type": "integer"},
                "last_error": _TEXT_OR_NULL,
                "last_response_status": _STATUS_OR_NULL,
                "last_outcome": _TEXT_OR_NULL,
            },
        ),
    ),
    DESTINATION_FAILING: (
        "A destination's consecutive failed attempts reached signals.failing_after_attempts;"
        " once per failing episode.",
        _about_destination(
            ["consecutive_failures", "failing_since"],
            {
                "consecutive_failures": {"type": "integer"},
                "failing_since": _TIME,
                "last_delivery_id": _TEXT_OR_NULL,
                "last_error": _TEXT_OR_NULL,
                "last_response_status": _STATUS_OR_NULL,
            },
        ),
    ),
    DESTINATION_RECOVERED: (
        "The first successful attempt to a destination after it was failing.",
        _about_destination(
            ["recovered_at"],
            {
                "consecutive_failures": {"type": "integer"},
                "failing_since": _TIME,
                "recovered_at": _TIME,
                "delivery_id": _TEXT_OR_NULL,
            },
        ),
    ),
    VERIFICATION_FAILED: (
        "A destination's verification ping ran out of attempts; it stays"
        " pending_verification until a new ping succeeds.",
        _about_destination(
            ["delivery_id"],
            {
                "delivery_id": _ID,
                "attempts": {"type": "integer"},
                "last_error": _TEXT_OR_NULL,
                "last_response_status": _STATUS_OR_NULL,
                "reverify": _TEXT_OR_NULL,
            },
        ),
    ),
    CIRCUIT_OPENED: (
        "A destination's circuit breaker opened after delivery.breaker_failures consecutive"
        " failed attempts: no attempt until one probe after the cooldown; once per opening,"
        " not after every failed probe.",
        _about_destination(
            ["consecutive_failures", "opened_at", "next_probe_at"],
            {
                "consecutive_failures": {"type": "integer"},
                "opened_at": _TIME,
                "next_probe_at": _TIME,
                "cooldown_seconds": {"type": ["number", "null"]},
                "last_delivery_id": _TEXT_OR_NULL,
                "last_error": _TEXT_OR_NULL,
                "last_response_status": _STATUS_OR_NULL,
            },
        ),
    ),
    CIRCUIT_CLOSED: (
        "A destination's circuit breaker closed: a probe succeeded and its backlog flows.",
        _about_destination(
            ["consecutive_failures", "closed_at"],
            {
                "consecutive_failures": {"type": "integer"},
                "opened_at": {"type": ["string", "null"], "format": "date-time"},
                "closed_at": _TIME,
                "delivery_id": _TEXT_OR_NULL,
            },
        ),
    ),
}
"""Herald's operational event types: (description, schema of ``data``), from
docs/operational-events.md."""
