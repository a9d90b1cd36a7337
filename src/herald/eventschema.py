"""Event types' JSON Schemas (draft 2020-12): checked when stored, compiled once per
schema text and cached, and the violations of a payload as ``data.<json path>``.

The ``jsonschema`` library does the work (``Draft202012Validator``): it implements
the whole 2020-12 vocabulary, checks a schema against the metaschema, and never
fetches a remote ``$ref`` (an unresolvable one is a violation of the schema, not a
network call). ``format`` is an annotation, as 2020-12 says by default.

Also the catalog entries of Herald's own operational event types (``herald.…``):
they exist for every tenant and describe what :mod:`herald.recorder` writes.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any, Final

import orjson
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from jsonschema.exceptions import ValidationError as SchemaViolation
from jsonschema.protocols import Validator
from referencing.exceptions import Unresolvable

from herald.errors import ValidationError
from herald.model import (
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


def schema_text(schema: dict[str, Any]) -> str:
    """The schema as the store keeps it and the cache knows it: compact, keys sorted."""
    return orjson.dumps(schema, option=orjson.OPT_SORT_KEYS).decode()


def check_schema(schema: Any, *, field: str = "schema") -> dict[str, Any]:
    """``schema`` if it is a valid 2020-12 JSON Schema object within the size limit;
    raises ValidationError naming ``field`` (and the place inside it) otherwise."""
    if not isinstance(schema, dict):
        raise ValidationError("a schema is a JSON object", field=field, code="schema_invalid")
    if len(schema_text(schema)) > MAX_SCHEMA_BYTES:
        raise ValidationError(
            f"a schema is at most {MAX_SCHEMA_BYTES} bytes as JSON",
            field=field,
            code="schema_invalid",
        )
    declared = schema.get("$schema")
    if declared is not None and declared != Draft202012Validator.META_SCHEMA["$id"]:
        raise ValidationError(
            f"$schema must be {Draft202012Validator.META_SCHEMA['$id']} (JSON Schema 2020-12)"
            " or left out",
            field=f"{field}.$schema",
            code="schema_invalid",
        )
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        where = "".join(_step(p) for p in exc.absolute_path)
        raise ValidationError(
            f"not a valid JSON Schema 2020-12: {exc.message[:300]}",
            field=f"{field}{where}",
            code="schema_invalid",
        ) from None
    return schema


@functools.lru_cache(maxsize=1024)
def validator_for(text: str) -> Validator:
    """The compiled validator of a schema's :func:`schema_text`, made once per text."""
    validator: Validator = Draft202012Validator(orjson.loads(text))
    return validator


def _step(part: str | int) -> str:
    return f"[{part}]" if isinstance(part, int) else f".{part}"


def _paths(error: SchemaViolation) -> Iterable[str]:
    base = "data" + "".join(_step(p) for p in error.absolute_path)
    required = error.validator_value
    if error.validator == "required" and isinstance(error.instance, dict):
        # One error per missing property: name it, as the caller has to add it.
        for name in required if isinstance(required, list) else ():
            if name not in error.instance and repr(name) in error.message:
                yield f"{base}.{name}"
                return
    yield base


def violations(
    validator: Validator, data: Any, *, limit: int = MAX_VIOLATIONS
) -> list[tuple[str, str]]:
    """``(path, message)`` of each way ``data`` breaks the schema, at most ``limit``, in
    the order of their paths; ``path`` is ``data.<json path>``."""
    found: list[tuple[str, str]] = []
    try:
        errors = sorted(validator.iter_errors(data), key=lambda e: list(map(str, e.absolute_path)))
    except Unresolvable as exc:  # a $ref to a document Herald does not fetch
        return [("data", f"the schema's $ref cannot be resolved: {exc}")]
    for error in errors:
        for path in _paths(error):
            found.append((path, error.message[:300]))
        if len(found) >= limit:
            break
    return found[:limit]


def _object(required: list[str], properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": required,
        "properties": properties,
    }


_ID = {"type": "string"}
_TEXT_OR_NULL = {"type": ["string", "null"]}
_STATUS_OR_NULL = {"type": ["integer", "null"]}
_TIME = {"type": "string", "format": "date-time"}

OPERATIONAL_CATALOG: Final[dict[str, tuple[str, dict[str, Any]]]] = {
    DELIVERY_EXHAUSTED: (
        "An event delivery ran out of attempts (status failure).",
        _object(
            ["destination_id", "destination_type", "delivery_id", "event_id", "event_type"],
            {
                "destination_id": _ID,
                "destination_type": _ID,
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
        _object(
            ["destination_id", "destination_type", "consecutive_failures", "failing_since"],
            {
                "destination_id": _ID,
                "destination_type": _ID,
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
        _object(
            ["destination_id", "destination_type", "recovered_at"],
            {
                "destination_id": _ID,
                "destination_type": _ID,
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
        _object(
            ["destination_id", "destination_type", "delivery_id"],
            {
                "destination_id": _ID,
                "destination_type": _ID,
                "delivery_id": _ID,
                "attempts": {"type": "integer"},
                "last_error": _TEXT_OR_NULL,
                "last_response_status": _STATUS_OR_NULL,
                "reverify": _TEXT_OR_NULL,
            },
        ),
    ),
}
"""Herald's operational event types: (description, schema of ``data``), from
docs/operational-events.md."""
