"""Each error class's code, type and HTTP status, and the body the API makes of it."""

from __future__ import annotations

import pytest

from herald.api.errors import PayloadTooLarge, RateLimited, Unauthorized, error_body
from herald.errors import (
    BadRequest,
    ConfigError,
    Conflict,
    CryptoError,
    EgressDenied,
    HeraldError,
    NotFound,
    StorageError,
    ValidationError,
)


@pytest.mark.parametrize(
    ("cls", "code", "type_", "status"),
    [
        (BadRequest, "invalid_request", "request", 400),
        (Unauthorized, "unauthorized", "auth", 401),
        (NotFound, "not_found", "request", 404),
        (Conflict, "conflict", "request", 409),
        (PayloadTooLarge, "payload_too_large", "request", 413),
        (ValidationError, "validation_error", "request", 422),
        (RateLimited, "rate_limit_exceeded", "rate_limit", 429),
    ],
)
def test_a_client_error_carries_its_code_type_and_status(
    cls: type[HeraldError], code: str, type_: str, status: int
) -> None:
    exc = cls("m")
    assert (exc.code, exc.type, exc.status) == (code, type_, status)
    assert cls("m", code="other").code == "other"
    assert cls.code == code  # an instance's code never changes its class's


def test_the_other_errors_are_500s_with_their_own_codes() -> None:
    codes = {
        HeraldError: "internal_error",
        ConfigError: "config_invalid",
        StorageError: "storage_error",
        CryptoError: "decryption_failed",
        EgressDenied: "egress_denied",
    }
    for cls, code in codes.items():
        assert (cls.code, cls.status) == (code, 500)
    assert EgressDenied.type == "request"
    assert {c.type for c in codes if c is not EgressDenied} == {"api_error"}


def test_egress_denied_is_still_an_oserror() -> None:
    assert isinstance(EgressDenied("m"), OSError)


def test_a_500_body_hides_the_message_and_an_explicit_status_wins() -> None:
    body = error_body(StorageError("pool exhausted at /var/run/pg"), "req_1")
    assert body["errors"][0]["code"] == "storage_unavailable"
    assert "pool" not in body["errors"][0]["message"]
    allowed = error_body(BadRequest("no", code="method_not_allowed"), "req_2", 405)
    assert allowed["errors"][0]["resolution"] == "Use one of the methods in the Allow header."
