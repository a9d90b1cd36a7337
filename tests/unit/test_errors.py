"""Each error class's code, type and HTTP status, and the body the API makes of it."""

from __future__ import annotations

import re
from pathlib import Path

import pydantic
import pytest

from herald.api.errors import (
    PayloadTooLarge,
    RateLimited,
    Unauthorized,
    error_body,
    from_pydantic,
)
from herald.api.schemas import EventCreate
from herald.errors import (
    _RESOLUTION_BY_CODE,
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


# --- resolutions ---------------------------------------------------------------------------

SRC = Path(__file__).resolve().parents[2] / "src" / "herald"
_CODE = re.compile(r'\bcode="([a-z_]+)"')


def test_every_error_code_raised_anywhere_has_its_own_resolution() -> None:
    codes = {c for path in SRC.rglob("*.py") for c in _CODE.findall(path.read_text())}
    assert len(codes) > 40, codes
    missing = sorted(c for c in codes if c not in _RESOLUTION_BY_CODE)
    assert not missing, f"add a resolution to herald.errors for: {missing}"
    assert all(text.endswith(".") for text in _RESOLUTION_BY_CODE.values())


def test_a_bad_query_parameter_is_not_told_to_send_json() -> None:
    body = error_body(BadRequest("unknown query parameter 'x'", code="unknown_parameter"), "r")
    [item] = body["errors"]
    assert "JSON" not in item["resolution"]
    assert "query parameter" in item["resolution"]


def test_every_invalid_field_of_a_body_is_reported_once() -> None:
    with pytest.raises(pydantic.ValidationError) as caught:
        EventCreate.model_validate({"type": 7, "data": [], "extra": 1, "id": None})
    exc = from_pydantic(caught.value)
    body = error_body(exc, "req_1")
    fields = [item["field"] for item in body["errors"]]
    assert len(fields) == len(set(fields)) >= 3, body
    assert {"type", "extra"} <= set(fields)
    # The status is the first error's: a malformed (400) problem leads.
    assert exc.status == 400
    assert all(item["resolution"] for item in body["errors"])


def test_a_500_shows_nothing_of_what_rides_along() -> None:
    exc = StorageError("disk I/O error at /var/lib/herald", also=(ValidationError("x"),))
    [item] = error_body(exc, "r")["errors"]
    assert item["code"] == "storage_unavailable"
