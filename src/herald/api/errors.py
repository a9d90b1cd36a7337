"""One place that turns typed errors into the spec's ``errors`` response shape."""

from __future__ import annotations

from typing import Any

import pydantic

from herald.errors import BadRequest, CryptoError, HeraldError, StorageError, ValidationError


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


_RESOLUTION = {
    400: "Fix the request so that it is well-formed JSON with the documented fields and types.",
    401: "Send 'Authorization: Bearer sk_live_…' with a valid API key.",
    404: "Check the id; objects of other tenants are not visible.",
    405: "Use one of the methods in the Allow header.",
    408: "Send the whole body right after the headers, or a smaller one.",
    409: "The object's current state does not allow this; check its status first.",
    413: "Send a smaller body.",
    422: "Correct the value of the named field.",
    429: "Wait for the number of seconds in Retry-After before retrying.",
    500: "Retry later; if it persists, report the request_id.",
    503: "Retry later, after the number of seconds in Retry-After.",
}
_RESOLUTION_BY_CODE = {
    "cursor_invalid": "Restart from the first page without a cursor.",
    "idempotency_key_reused": "Use a new Idempotency-Key for a different request body.",
    "idempotency_key_in_use": "Wait for the first request with this key to finish, then retry.",
    "destination_not_active": "Wait for verification or set status to active first.",
    "destination_not_verified": "Wait for the verification ping to succeed, or POST …/verify.",
}


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
    item: dict[str, Any] = {
        "type": exc.type if status != 500 else "api_error",
        "code": code,
        "message": message,
        "resolution": _RESOLUTION_BY_CODE.get(code, _RESOLUTION.get(status, "")),
    }
    if exc.field:
        item["field"] = exc.field
    return {"errors": [item], "request_id": request_id}


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
    err = exc.errors()[0]
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
