"""One place that turns typed errors into the spec's ``errors`` response shape."""

from __future__ import annotations

from typing import Any

import pydantic

from herald.errors import (
    BadRequest,
    CryptoError,
    HeraldError,
    StorageError,
    ValidationError,
    advice,
    resolution,
)


class Unauthorized(HeraldError, code="unauthorized", type="auth", status=401):
    """No API key, or not a valid one."""


class RateLimited(HeraldError, code="rate_limit_exceeded", type="rate_limit", status=429):
    """The tenant spent its requests for this window."""


class PayloadTooLarge(HeraldError, code="payload_too_large", type="request", status=413):
    """The body is larger than api.max_body_bytes."""


class RequestTimeout(HeraldError, code="request_timeout", type="request", status=408):
    """The client did not send the body it announced within api.body_timeout_seconds."""


class Unavailable(HeraldError, code="too_many_connections", type="api_error", status=503):
    """The server holds api.max_connections connections already."""


def error_body(exc: HeraldError, request_id: str, status: int | None = None) -> dict[str, Any]:
    status = status or exc.status
    code, message = exc.code, exc.message
    if status == 500:
        # Internal details (driver messages, paths) stay in the log, keyed by request_id.
        code, message = "internal_error", "internal error"
        if isinstance(exc, StorageError):
            code, message = "storage_unavailable", "the database is unavailable"
        elif isinstance(exc, CryptoError):
            code, message = "decryption_failed", "stored credentials cannot be decrypted"
    advise = advice(exc, status) if status != 500 else resolution(code, status)
    items = [_item(exc.type if status != 500 else "api_error", code, message, exc.field, advise)]
    if status != 500:
        items += [_item(e.type, e.code, e.message, e.field, advice(e, status)) for e in exc.also]
    return {"errors": items, "request_id": request_id}


def _item(type_: str, code: str, message: str, field: str | None, advise: str) -> dict[str, Any]:
    item: dict[str, Any] = {"type": type_, "code": code, "message": message, "resolution": advise}
    if field:
        item["field"] = field
    return item


def _loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + part
    return out


# Pydantic error types that mean "malformed" (400) rather than "invalid value" (422).
_MALFORMED = {"extra_forbidden", "model_type", "model_attributes_type", "dict_type", "list_type"}


def from_pydantic(exc: pydantic.ValidationError) -> HeraldError:
    """Every problem pydantic found, one per field: the first malformed one (400) leads
    if there is one, else the first invalid value (422); the rest ride in ``also``."""
    problems: list[HeraldError] = []
    fields: set[str | None] = set()
    for err in exc.errors():
        problem = _problem(err)
        if problem.field not in fields:  # one per field: a union reports each branch
            fields.add(problem.field)
            problems.append(problem)
    problems.sort(key=lambda p: not isinstance(p, BadRequest))
    first, *rest = problems
    first.also = tuple(rest)
    return first


def _problem(err: Any) -> HeraldError:
    field = _loc(tuple(err["loc"])) or None
    kind = err["type"]
    msg = str(err["msg"]).removeprefix("Value error, ")
    if kind == "extra_forbidden":
        return BadRequest(f"unknown field {field!r}", field=field, code="unknown_field")
    if kind in _MALFORMED or kind.endswith("_type") or kind.endswith("_parsing"):
        return BadRequest(f"{field}: {msg}", field=field, code="invalid_type")
    if kind == "missing":
        return ValidationError(f"{field} is required", field=field, code="field_required")
    return ValidationError(f"{field}: {msg}", field=field, code="invalid_value")
