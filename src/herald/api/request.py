"""Reading a /v2 request: its query parameters and its JSON body, checked against
spec 000's rules (unknown or repeated parameters, page limits, RFC 3339 times,
JSON media types) and turned into the typed errors the API answers with."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from enum import StrEnum
from typing import Any, TypeVar

import pydantic
from aiohttp import web
from pydantic import BaseModel

from herald.api.errors import from_pydantic
from herald.api.jsonbody import parse_body
from herald.errors import BadRequest, ValidationError
from herald.fields import Problems
from herald.timeutil import parse_when

JSON_TYPES = re.compile(r"^(application/json|text/json|application/[a-z0-9.+-]+\+json)$")
DEFAULT_LIMIT, MAX_LIMIT = 20, 100
_DIGITS = re.compile(r"^[0-9]{1,6}$")  # ASCII only: str.isdigit() accepts "²"

# The status filters in the order the error messages and the OpenAPI enums give them.
DESTINATION_STATUSES = ("pending_verification", "active", "inactive")
DELIVERY_STATUSES = ("success", "failure", "pending")

M = TypeVar("M", bound=BaseModel)
E = TypeVar("E", bound=StrEnum)


def query_params(request: web.Request, allowed: set[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in request.query.items():
        if key not in allowed:
            raise BadRequest(
                f"unknown query parameter {key!r}", field=key, code="unknown_parameter"
            )
        if key in out:
            raise BadRequest(
                f"query parameter {key!r} given twice", field=key, code="invalid_request"
            )
        out[key] = value
    return out


def page_limit(query: Mapping[str, str]) -> int:
    raw = query.get("limit")
    if raw is None:
        return DEFAULT_LIMIT
    if not _DIGITS.match(raw) or not 1 <= int(raw) <= MAX_LIMIT:
        raise BadRequest(
            f"limit must be an integer from 1 to {MAX_LIMIT}",
            field="limit",
            code="limit_invalid",
        )
    return int(raw)


def status_param(query: Mapping[str, str], enum: type[E], choices: tuple[str, ...]) -> E | None:
    """The ``status`` filter as ``enum``, or None when absent."""
    if "status" not in query:
        return None
    try:
        return enum(query["status"])
    except ValueError:
        raise ValidationError(
            f"status must be {', '.join(choices[:-1])} or {choices[-1]}",
            field="status",
            code="status_invalid",
        ) from None


def timestamp_param(source: Mapping[str, str] | BaseModel, name: str) -> float | None:
    """A time from the query or from a parsed body, as epoch seconds: RFC 3339 or a
    duration ago (``2h``), as the CLI takes it."""
    raw = source.get(name) if isinstance(source, Mapping) else getattr(source, name)
    if raw is None:
        return None
    try:
        return parse_when(raw)
    except ValueError as exc:
        raise ValidationError(str(exc), field=name, code="timestamp_invalid") from exc


async def json_body(
    request: web.Request,
    model: type[M],
    *,
    optional: bool = False,
    precheck: Callable[[dict[str, Any]], None] | None = None,
    field_checks: Sequence[Callable[[dict[str, Any]], object]] = (),
) -> M:
    """The body as ``model``; a body with several bad fields raises one error naming
    them all (``field_checks``: the service's own checks of single fields, run beside
    the model's so that their problems are reported in the same answer)."""
    raw = await request.read()
    if not raw.strip():
        if optional:
            return model.model_validate({})
        raise BadRequest("a JSON body is required", code="body_required")
    ctype = request.headers.get("Content-Type", "").split(";")[0].strip().lower()
    if not JSON_TYPES.match(ctype):
        raise BadRequest(
            "send the body as application/json",
            field="Content-Type",
            code="content_type_invalid",
        )
    data = parse_body(raw)
    if not isinstance(data, dict):
        raise BadRequest("the body must be a JSON object", code="invalid_json")
    if precheck is not None:
        precheck(data)
    found = Problems()
    parsed: M | None = None
    try:
        parsed = model.model_validate(data)
    except pydantic.ValidationError as exc:
        found.add(from_pydantic(exc))
    if found.found:  # the service would check these next: say so now, all at once
        for check in field_checks:
            found.check(check, data)
    found.raise_any()
    assert parsed is not None
    return parsed
