"""herald.api.request: the query and body rules every /v2 handler reads a request by."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import make_mocked_request

from herald.api.request import (
    DELIVERY_STATUSES,
    DESTINATION_STATUSES,
    page_limit,
    query_params,
    status_param,
    timestamp_param,
)
from herald.errors import BadRequest, ValidationError
from herald.model import DeliveryStatus, DestinationStatus


@pytest.mark.parametrize(
    ("enum", "choices", "message"),
    [
        (
            DestinationStatus,
            DESTINATION_STATUSES,
            "status must be pending_verification, active or inactive",
        ),
        (DeliveryStatus, DELIVERY_STATUSES, "status must be success, failure or pending"),
    ],
)
def test_an_unknown_status_names_the_choices_in_the_documented_order(
    enum: type[DestinationStatus] | type[DeliveryStatus], choices: tuple[str, ...], message: str
) -> None:
    assert {s.value for s in enum} == set(choices)
    assert status_param({}, enum, choices) is None
    assert status_param({"status": choices[0]}, enum, choices) == enum(choices[0])
    with pytest.raises(ValidationError) as err:
        status_param({"status": "paused"}, enum, choices)
    assert (err.value.message, err.value.field, err.value.code) == (
        message,
        "status",
        "status_invalid",
    )


def test_query_params_refuse_unknown_and_repeated_names() -> None:
    request = make_mocked_request("GET", "/v2/x?limit=5&cursor=c")
    assert query_params(request, {"limit", "cursor"}) == {"limit": "5", "cursor": "c"}
    with pytest.raises(BadRequest) as unknown:
        query_params(request, {"limit"})
    assert (unknown.value.code, unknown.value.field) == ("unknown_parameter", "cursor")
    with pytest.raises(BadRequest) as twice:
        query_params(make_mocked_request("GET", "/v2/x?limit=1&limit=2"), {"limit"})
    assert twice.value.code == "invalid_request"


@pytest.mark.parametrize("raw", ["0", "101", "-1", "²", "1.5", ""])
def test_page_limit_is_1_to_100_in_ascii_digits(raw: str) -> None:
    assert page_limit({}) == 20
    assert page_limit({"limit": "100"}) == 100
    with pytest.raises(BadRequest, match="limit must be an integer from 1 to 100"):
        page_limit({"limit": raw})


def test_timestamp_param_reads_rfc3339_or_refuses_naming_the_field() -> None:
    assert timestamp_param({}, "since") is None
    assert timestamp_param({"since": "1970-01-01T00:01:00Z"}, "since") == 60.0
    with pytest.raises(ValidationError) as err:
        timestamp_param({"until": "yesterday"}, "until")
    assert (err.value.field, err.value.code) == ("until", "timestamp_invalid")


@pytest.mark.parametrize("raw", ["9" * 400 + "h", "9" * 30 + "d"])
def test_timestamp_param_refuses_a_duration_past_the_calendar(raw: str) -> None:
    """``since=999…9h`` was a time of -inf, and a replay's 500 when written back."""
    with pytest.raises(ValidationError) as err:
        timestamp_param({"since": raw}, "since")
    assert (err.value.field, err.value.code) == ("since", "timestamp_invalid")
