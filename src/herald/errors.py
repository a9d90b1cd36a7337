"""The one exception root of Herald and its typed branches.

Driver errors are wrapped where they enter (``raise … from exc``); the API maps
these types to the spec's ``errors`` shape in one place.
"""

from __future__ import annotations


class HeraldError(Exception):
    """Root of every error Herald raises on purpose."""

    code = "internal_error"
    type = "api_error"

    def __init__(self, message: str, *, field: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        if code is not None:
            self.code = code


class ConfigError(HeraldError):
    """The configuration file or an override is invalid."""

    code = "config_invalid"


class ValidationError(HeraldError):
    """Input understood but holding invalid values (HTTP 422)."""

    code = "validation_error"
    type = "request"


class BadRequest(HeraldError):
    """Malformed input: bad JSON, wrong types, unknown fields (HTTP 400)."""

    code = "invalid_request"
    type = "request"


class NotFound(HeraldError):
    """The object does not exist, or belongs to another tenant (HTTP 404)."""

    code = "not_found"
    type = "request"


class Conflict(HeraldError):
    """A valid request that cannot complete in the object's current state (HTTP 409)."""

    code = "conflict"
    type = "request"


class StorageError(HeraldError):
    """The database failed; wraps the driver's exception."""

    code = "storage_error"


class CryptoError(HeraldError):
    """A stored secret could not be decrypted with the configured key."""

    code = "decryption_failed"


class EgressDenied(HeraldError, OSError):
    """A webhook target resolves to an address Herald may not connect to."""

    code = "egress_denied"
    type = "request"
