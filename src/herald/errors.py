"""The one exception root of Herald and its typed branches.

Driver errors are wrapped where they enter (``raise … from exc``). Each branch
is data: its ``code``, the ``type`` of the spec's ``errors`` shape, and the HTTP
``status`` the API answers with; :mod:`herald.api.errors` turns them into a body.
"""

from __future__ import annotations

from typing import Any


class HeraldError(Exception):
    """Root of every error Herald raises on purpose."""

    code = "internal_error"
    type = "api_error"
    status = 500

    def __init_subclass__(
        cls,
        *,
        code: str | None = None,
        type: str | None = None,
        status: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init_subclass__(**kwargs)
        if code is not None:
            cls.code = code
        if type is not None:
            cls.type = type
        if status is not None:
            cls.status = status

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        code: str | None = None,
        also: tuple[HeraldError, ...] = (),
        hint: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        if code is not None:
            self.code = code
        self.also = also
        """Further problems of the same input (other fields), reported beside this one."""
        self.hint = hint
        """What to do about this very error, where its code's :func:`resolution` would not
        fit it (None: the code's)."""


class ConfigError(HeraldError, code="config_invalid"):
    """The configuration file or an override is invalid."""


class ValidationError(HeraldError, code="validation_error", type="request", status=422):
    """Input understood but holding invalid values."""


class BadRequest(HeraldError, code="invalid_request", type="request", status=400):
    """Malformed input: bad JSON, wrong types, unknown fields."""


class NotFound(HeraldError, code="not_found", type="request", status=404):
    """The object does not exist, or belongs to another tenant."""


class Conflict(HeraldError, code="conflict", type="request", status=409):
    """A valid request that cannot complete in the object's current state."""


class StorageError(HeraldError, code="storage_error"):
    """The database failed; wraps the driver's exception."""


class CryptoError(HeraldError, code="decryption_failed"):
    """A stored secret could not be decrypted with the configured key."""


class EgressDenied(HeraldError, OSError, code="egress_denied", type="request"):
    """A webhook target resolves to an address Herald may not connect to."""


# What to do about each error, by code; by HTTP status for a code not listed. The API
# sends it as each error's ``resolution`` and the CLI prints it as a hint.
# tests/unit/test_errors.py fails on a code raised anywhere in Herald without one.
_RESOLUTION_BY_STATUS = {
    400: "Fix the request as the message says.",
    401: "Send 'Authorization: Bearer sk_live_…' with a valid API key.",
    404: "Check the id; objects of other tenants are not visible.",
    409: "The object's current state does not allow this; check its status first.",
    422: "Correct the value of the named field.",
    500: "Retry later; if it persists, report the request_id.",
}
_RESOLUTION_BY_CODE = {
    # The request as a whole.
    "invalid_request": "Fix the request as the message says.",
    "invalid_json": "Send a body that is one well-formed JSON value.",
    "invalid_encoding": "Encode the body as UTF-8.",
    "invalid_character": "Leave NUL characters out of every string.",
    "duplicate_key": "Give each key once per JSON object.",
    "json_too_deep": "Nest arrays and objects less deeply.",
    "body_required": "Send a JSON body with the documented fields.",
    "content_type_invalid": "Send the body with 'Content-Type: application/json'.",
    "payload_too_large": "Send a smaller body (api.max_body_bytes).",
    "request_timeout": "Send the whole body right after the headers, or a smaller one.",
    "request_line_invalid": "Send a well-formed HTTP/1.1 request line.",
    "header_invalid": "Send well-formed HTTP headers.",
    "header_too_large": "Send shorter headers.",
    "too_many_headers": "Send fewer headers.",
    "invalid_http": "Send a well-formed HTTP/1.1 request.",
    "too_many_connections": "Retry later, after the number of seconds in Retry-After.",
    "method_not_allowed": "Use one of the methods in the Allow header.",
    "endpoint_not_found": "Check the path against the API reference (docs/openapi.json).",
    # Authentication and limits.
    "unauthorized": "Send 'Authorization: Bearer sk_live_…' with a valid API key.",
    "auth_missing": "Send 'Authorization: Bearer sk_live_…' with an API key.",
    "auth_invalid_key": "Check the key: it is unknown, revoked or mistyped.",
    "auth_header_repeated": "Send exactly one Authorization header.",
    "rate_limit_exceeded": "Wait for the number of seconds in Retry-After before retrying.",
    "idempotency_key_invalid": "Send an Idempotency-Key of 1 to 255 printable characters.",
    "idempotency_key_reused": "Use a new Idempotency-Key for a different request body.",
    "idempotency_key_in_use": "Wait for the first request with this key to finish, then retry.",
    # Fields and query parameters.
    "validation_error": "Correct the value of the named field.",
    "field_required": "Add the named field.",
    "unknown_field": "Remove the named field; see the API reference for the fields.",
    "invalid_type": "Send the named field with the documented JSON type.",
    "invalid_value": "Correct the value of the named field.",
    "too_long": "Shorten the named field.",
    "too_many_items": "Send fewer items in the named field.",
    "unknown_parameter": "Remove the named query parameter; see the API reference.",
    "limit_invalid": "Ask for a limit from 1 to the maximum the message names.",
    "cursor_invalid": "Restart from the first page without a cursor.",
    "timestamp_invalid": "Give an RFC 3339 time (2026-11-25T10:00:00Z) or a duration ago (2h).",
    "status_invalid": "Use one of the statuses the message lists.",
    "name_invalid": "Give a name of printable characters within the length limit.",
    "rate_limit_invalid": "Give a number of attempts a second above 0, or null for no limit.",
    "ordering_invalid": "Give ordering as 'none' or 'key'.",
    "ordering_key_invalid": (
        "Give an ordering_key of 1 to 255 characters without control characters, or none."
    ),
    "events_invalid": "Subscribe with fewer patterns, each an event type or ending in '*'.",
    "events_empty": "Subscribe to at least one event type or pattern ('*' for all).",
    "event_pattern_invalid": "Write a pattern as an event type, optionally ending in '*'.",
    "event_type_invalid": "Use dot-separated lowercase words, e.g. order.paid.",
    "event_type_reserved": "Use a type outside herald.…: those are Herald's own events.",
    "event_id_invalid": (
        "Give an id that starts with 'evt_', of at most 255 printable characters,"
        " or leave it out to have one generated."
    ),
    "data_invalid": "Send data as a JSON object.",
    "schema_mismatch": (
        "Make data match the JSON Schema of its type (GET /v2/event-types/{type});"
        " each error names the place in data."
    ),
    "event_type_unknown": (
        "Register the type first (PUT /v2/event-types/{type}): this Herald refuses types"
        " outside the tenant's catalog (catalog.require_known_types)."
    ),
    "schema_invalid": "Give a JSON Schema (draft 2020-12) object; the message says what is wrong.",
    "event_type_not_found": "List the catalog's types with GET /v2/event-types.",
    "filter_invalid": "Fix the filter at the place named (docs/catalog-and-filters.md).",
    # Destinations.
    "destination_type_unknown": "Use one of the destination types the message lists.",
    "type_immutable": "Create a new destination of the other type, then delete this one.",
    "url_invalid": "Give an absolute URL with a host (https://…).",
    "url_not_allowed": (
        "Point it at a public address, or let the operator allow the network with"
        " security.allowed_networks in the config that the daemon and the CLI read."
    ),
    "url_unresolvable": "Check the host name; it must resolve in the daemon's DNS.",
    "egress_denied": (
        "Point it at a public address, or allow the network with security.allowed_networks"
        " in the config that the daemon and the CLI read."
    ),
    "credentials_required": (
        "Give the credentials in the same request: a new target needs each one again (or"
        " null to drop it). A keyless cloud destination needs its own credentials, or the"
        " operator to list the tenant in security.ambient_credentials_tenants."
    ),
    "secret_invalid": "Give whsec_ followed by standard base64 of a random key, or omit it.",
    "secret_not_supported": "Only webhook destinations have a signing secret.",
    "destination_not_found": "Check the id; destinations of other tenants are not visible.",
    "destination_deleted": "Create a new destination; a deleted one cannot change.",
    "destination_not_active": "Wait for verification or set status to active first.",
    "destination_not_verified": "Wait for the verification ping to succeed, or POST …/verify.",
    "concurrent_update": "Retry the request.",
    "destination_limit_reached": (
        "Delete a destination you no longer use, or have the operator raise"
        " api.max_destinations_per_tenant."
    ),
    # Events and deliveries.
    "event_not_found": "Check the id; events of other tenants are not visible.",
    "event_exists": "Use a new event id; ids are unique per tenant.",
    "delivery_not_found": "Check the id; deliveries of other tenants are not visible.",
    "delivery_not_retryable": "Only event deliveries can be retried; re-verify a destination.",
    "replay_not_found": "Check the id; replays of other tenants are not visible.",
    "stopping": "Herald is stopping; retry once it has started again.",
    "not_found": "Check the id; objects of other tenants are not visible.",
    # Portal session tokens.
    "token_invalid": "Ask your server for a new portal token (POST /v2/token).",
    "token_expired": "Ask your server for a new portal token (POST /v2/token).",
    "token_revoked": "The API key that made the token was revoked; use a valid key.",
    "token_used": "A token opens one session; ask your server for a new one.",
    "token_unavailable": "Send a new Idempotency-Key to get a new token.",
    "conflict": "The object's current state does not allow this; check its status first.",
    # The daemon's own trouble.
    "internal_error": "Retry later; if it persists, report the request_id.",
    "storage_error": "Retry later; the database is unavailable or failing.",
    "storage_unavailable": "Retry later; the database is unavailable.",
    "decryption_failed": "Start Herald with the encryption key the credentials were stored with.",
    "config_invalid": "Fix the named setting in the config file or HERALD_… environment.",
    "usage": "See the command's --help.",
}


def resolution(code: str, status: int = 0) -> str:
    """What to do about an error ``code`` (answered with HTTP ``status``)."""
    return _RESOLUTION_BY_CODE.get(code) or _RESOLUTION_BY_STATUS.get(status, "")


def advice(exc: HeraldError, status: int = 0) -> str:
    """What to do about ``exc``: its own hint, else its code's :func:`resolution`."""
    return exc.hint or resolution(exc.code, status or exc.status)
