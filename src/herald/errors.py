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

    def __init__(self, message: str, *, field: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        if code is not None:
            self.code = code


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
