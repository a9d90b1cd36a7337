"""Tests for herald.timeutil."""

from __future__ import annotations

import calendar
import datetime as dt
import random
import time

import pytest

from herald.timeutil import (
    Instant,
    format_epoch,
    now,
    parse_retry_after,
    parse_timestamp,
    parse_when,
    rfc3339_nano,
)


def _epoch(*fields: int) -> float:
    return float(calendar.timegm((*fields, 0, 0, 0)))


@pytest.mark.parametrize(
    ("value", "text", "epoch"),
    [
        ("2026-11-22T00:00:00Z", "2026-11-22T00:00:00Z", _epoch(2026, 11, 22, 0, 0, 0)),
        ("2026-11-22t10:11:12z", "2026-11-22T10:11:12Z", _epoch(2026, 11, 22, 10, 11, 12)),
        ("2026-11-22 10:11:12Z", "2026-11-22T10:11:12Z", _epoch(2026, 11, 22, 10, 11, 12)),
        ("2026-11-22T10:11", "2026-11-22T10:11:00Z", _epoch(2026, 11, 22, 10, 11, 0)),
        ("2026-11-22T10:11Z", "2026-11-22T10:11:00Z", _epoch(2026, 11, 22, 10, 11, 0)),
        ("2026-11-22T10:11:12", "2026-11-22T10:11:12Z", _epoch(2026, 11, 22, 10, 11, 12)),
        ("2026-11-22T10:11:12+00:00", "2026-11-22T10:11:12Z", _epoch(2026, 11, 22, 10, 11, 12)),
        ("2026-11-22T10:11:12-00:00", "2026-11-22T10:11:12Z", _epoch(2026, 11, 22, 10, 11, 12)),
        ("2026-11-22T10:11:12+02:30", "2026-11-22T07:41:12Z", _epoch(2026, 11, 22, 7, 41, 12)),
        ("2026-11-22T10:11:12+0230", "2026-11-22T07:41:12Z", _epoch(2026, 11, 22, 7, 41, 12)),
        ("2026-11-22T10:11:12+02", "2026-11-22T08:11:12Z", _epoch(2026, 11, 22, 8, 11, 12)),
        ("2026-11-22T10:11:12-05:00", "2026-11-22T15:11:12Z", _epoch(2026, 11, 22, 15, 11, 12)),
        # Offsets that move the date across day, month, year and leap-day boundaries.
        ("2026-01-01T00:30:00+01:00", "2025-12-31T23:30:00Z", _epoch(2025, 12, 31, 23, 30, 0)),
        ("2025-12-31T23:30:00-23:59", "2026-01-01T23:29:00Z", _epoch(2026, 1, 1, 23, 29, 0)),
        ("2024-03-01T01:00:00+02:00", "2024-02-29T23:00:00Z", _epoch(2024, 2, 29, 23, 0, 0)),
        ("2024-02-29T12:00:00Z", "2024-02-29T12:00:00Z", _epoch(2024, 2, 29, 12, 0, 0)),
        ("2000-02-29T00:00:00Z", "2000-02-29T00:00:00Z", _epoch(2000, 2, 29, 0, 0, 0)),
        ("1970-01-01T00:00:00Z", "1970-01-01T00:00:00Z", 0.0),
        ("1969-12-31T23:59:59Z", "1969-12-31T23:59:59Z", -1.0),
        ("0001-01-01T00:00:00Z", "0001-01-01T00:00:00Z", -62135596800.0),
        ("9999-12-31T23:59:59Z", "9999-12-31T23:59:59Z", 253402300799.0),
    ],
)
def test_parse_timestamp_valid(value: str, text: str, epoch: float) -> None:
    assert parse_timestamp(value) == Instant(text, epoch)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("2026-11-22T10:11:12.1Z", "2026-11-22T10:11:12.1Z"),
        ("2026-11-22T10:11:12.120Z", "2026-11-22T10:11:12.120Z"),
        ("2026-11-22T10:11:12.000000000Z", "2026-11-22T10:11:12.000000000Z"),
        ("2026-11-22T10:11:12.123456789Z", "2026-11-22T10:11:12.123456789Z"),
        # The offset moves the whole seconds; the fraction digits survive unchanged.
        ("2026-11-22T10:11:12.987654321+01:00", "2026-11-22T09:11:12.987654321Z"),
        ("2026-11-22T10:11:12.5-0130", "2026-11-22T11:41:12.5Z"),
    ],
)
def test_parse_timestamp_keeps_fraction_digits(value: str, text: str) -> None:
    assert parse_timestamp(value).text == text


def test_parse_timestamp_fraction_in_epoch() -> None:
    inst = parse_timestamp("2026-11-22T10:11:12.25+01:00")
    assert inst.epoch == _epoch(2026, 11, 22, 9, 11, 12) + 0.25
    nano = parse_timestamp("1970-01-01T00:00:00.000000001Z")
    assert nano.epoch == pytest.approx(1e-9)
    assert nano.text.endswith(".000000001Z")


def test_nanosecond_distinct_texts_stay_distinct() -> None:
    # Floats cannot tell these apart; the text must.
    a = parse_timestamp("2026-11-22T10:11:12.123456789Z")
    b = parse_timestamp("2026-11-22T10:11:12.123456788Z")
    assert a.text != b.text


def test_parse_timestamp_matches_datetime_for_random_offsets() -> None:
    rng = random.Random(1234)
    for _ in range(500):
        base = dt.datetime(1900, 1, 1, tzinfo=dt.UTC) + dt.timedelta(
            seconds=rng.randrange(0, 200 * 365 * 86400)
        )
        minutes = rng.randrange(-(23 * 60 + 59), 23 * 60 + 60)
        tz = dt.timezone(dt.timedelta(minutes=minutes))
        local = base.astimezone(tz)
        sign = "-" if minutes < 0 else "+"
        off = f"{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"
        value = local.strftime("%Y-%m-%dT%H:%M:%S") + off
        inst = parse_timestamp(value)
        assert inst.text == base.strftime("%Y-%m-%dT%H:%M:%SZ"), value
        assert inst.epoch == base.timestamp(), value


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("", "expected RFC 3339"),
        ("2026-11-22", "expected RFC 3339"),
        ("2026-11-22T10", "expected RFC 3339"),
        ("2026-11-22T10:11:12.Z", "expected RFC 3339"),
        ("2026-11-22T10:11:12.1234567890Z", "expected RFC 3339"),
        ("2026-11-22T10:11:12ZZ", "expected RFC 3339"),
        ("2026-11-22T10:11:12Z\n", "expected RFC 3339"),
        (" 2026-11-22T10:11:12Z", "expected RFC 3339"),
        ("2026-11-22X10:11:12Z", "expected RFC 3339"),
        ("26-11-22T10:11:12Z", "expected RFC 3339"),
        ("2026-1-22T10:11:12Z", "expected RFC 3339"),
        ("2026-11-22T10:11:12+1", "expected RFC 3339"),
        ("2026-11-22T10:11:12+01:0", "expected RFC 3339"),
        ("2026-11-22T10:11:12+01:00:00", "expected RFC 3339"),
        ("2026-11-22T10:11:12 +01:00", "expected RFC 3339"),
        ("2026-11-22T10:11:12UTC", "expected RFC 3339"),
        ("2026-11-22T10:11:12,5Z", "expected RFC 3339"),
        ("２０２６-11-22T10:11:12Z", "expected RFC 3339"),
        ("2026-11-22T10:11:1٣Z", "expected RFC 3339"),
        ("2026-02-30T00:00:00Z", "day is out of range"),
        ("2025-02-29T00:00:00Z", "day is out of range"),
        ("1900-02-29T00:00:00Z", "day is out of range"),
        ("2026-04-31T00:00:00Z", "day is out of range"),
        ("2026-01-00T00:00:00Z", "day is out of range"),
        ("2026-13-01T00:00:00Z", "month must be"),
        ("2026-00-01T00:00:00Z", "month must be"),
        ("0000-01-01T00:00:00Z", "year must be"),
        ("2026-11-22T24:00:00Z", "hour must be"),
        ("2026-11-22T23:60:00Z", "minute must be"),
        ("2026-11-22T23:59:60Z", "second must be"),
        ("2026-11-22T10:11:12+24:00", "offset must be"),
        ("2026-11-22T10:11:12-23:60", "offset must be"),
        ("2026-11-22T10:11:12+2400", "offset must be"),
        ("0001-01-01T00:00:00+00:01", "outside years"),
        ("9999-12-31T23:59:59-00:01", "outside years"),
    ],
)
def test_parse_timestamp_invalid(value: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason) as info:
        parse_timestamp(value)
    assert repr(value) in str(info.value)


def test_parse_timestamp_invalid_date_twice_is_still_invalid() -> None:
    # Guards the date cache: a rejected date must not be remembered as valid.
    for _ in range(2):
        with pytest.raises(ValueError, match="day is out of range"):
            parse_timestamp("2026-02-30T00:00:00Z")
    # And a cached valid date must not make a bad time of day acceptable.
    parse_timestamp("2026-03-01T00:00:00Z")
    with pytest.raises(ValueError, match="hour must be"):
        parse_timestamp("2026-03-01T25:00:00Z")


def test_parse_timestamp_error_message_truncates_long_values() -> None:
    value = "x" * 1000
    with pytest.raises(ValueError, match="invalid timestamp") as info:
        parse_timestamp(value)
    message = str(info.value)
    assert "x" * 64 in message
    assert "x" * 65 not in message
    assert len(message) < 200


def test_parse_timestamp_roundtrips_normalized_text() -> None:
    inst = parse_timestamp("2026-11-22T10:11:12.5+05:45")
    assert parse_timestamp(inst.text) == inst


def test_now_is_wall_clock() -> None:
    before = time.time()
    value = now()
    after = time.time()
    assert before <= value <= after


@pytest.mark.parametrize(
    ("ts", "text"),
    [
        (0.0, "1970-01-01T00:00:00.000000Z"),
        (1.5, "1970-01-01T00:00:01.500000Z"),
        (_epoch(2026, 11, 22, 0, 0, 0) + 0.123456, "2026-11-22T00:00:00.123456Z"),
        (_epoch(2024, 2, 29, 23, 59, 59) + 0.9999996, "2024-03-01T00:00:00.000000Z"),
        (-0.5, "1969-12-31T23:59:59.500000Z"),
        (_epoch(2000, 1, 1, 0, 0, 0) + 0.000001, "2000-01-01T00:00:00.000001Z"),
    ],
)
def test_format_epoch(ts: float, text: str) -> None:
    assert format_epoch(ts) == text


def test_format_epoch_parses_back() -> None:
    rng = random.Random(99)
    for _ in range(200):
        micros = rng.randrange(0, 4_000_000_000_000_000)
        ts = micros / 1_000_000
        text = format_epoch(ts)
        assert len(text) == 27
        assert parse_timestamp(text).epoch == pytest.approx(ts, abs=1e-6)
        expected = dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=micros)
        assert text == expected.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@pytest.mark.parametrize(
    ("text", "nano"),
    [
        ("2026-11-22T00:00:00Z", "2026-11-22T00:00:00.000000000Z"),
        ("2026-11-22T00:00:00.1Z", "2026-11-22T00:00:00.100000000Z"),
        ("2026-11-22T00:00:00.123456Z", "2026-11-22T00:00:00.123456000Z"),
        ("2026-11-22T00:00:00.123456789Z", "2026-11-22T00:00:00.123456789Z"),
        ("2026-11-22T00:00:00.000000000Z", "2026-11-22T00:00:00.000000000Z"),
    ],
)
def test_rfc3339_nano(text: str, nano: str) -> None:
    assert rfc3339_nano(text) == nano


@pytest.mark.parametrize(
    "text",
    [
        "",
        "2026-11-22T00:00:00",
        "2026-11-22T00:00:00ZZ",
        "2026-11-22T00:00:00.Z",
        "2026-11-22T00:00:00.1234567891Z",
        "2026-11-22T00:00:00+01:00",
        "2026-11-22 00:00:00Z",
    ],
)
def test_rfc3339_nano_rejects_non_normalized(text: str) -> None:
    with pytest.raises(ValueError, match="not a normalized timestamp"):
        rfc3339_nano(text)


NOW = _epoch(1994, 11, 6, 8, 49, 0)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0", 0.0),
        ("120", 120.0),
        ("  30  ", 30.0),
        ("007", 7.0),
        ("Sun, 06 Nov 1994 08:49:37 GMT", 37.0),
        ("Sunday, 06-Nov-94 08:49:37 GMT", 37.0),
        ("Sun Nov  6 08:49:37 1994", 37.0),
        ("Sun Nov 06 08:49:37 1994", 37.0),
        ("sun, 06 nov 1994 08:49:37 gmt", 37.0),
        ("Sun, 06 Nov 1994 09:49:00 GMT", 3600.0),
        # A date in the past means "retry now".
        ("Sun, 06 Nov 1994 08:00:00 GMT", 0.0),
        ("Thu, 01 Jan 1970 00:00:00 GMT", 0.0),
    ],
)
def test_parse_retry_after(value: str, expected: float) -> None:
    assert parse_retry_after(value, now=NOW) == expected


@pytest.mark.parametrize(
    "value",
    [
        "",
        "   ",
        "-1",
        "+5",
        "1.5",
        "1e3",
        "soon",
        "١٢",
        "Sun, 06 Nov 1994 08:49:37",
        "Sun, 06 Nov 1994 08:49:37 UTC",
        "Sun, 31 Feb 1994 08:49:37 GMT",
        "Sun, 06 Foo 1994 08:49:37 GMT",
        "Sun, 06 Nov 1994 25:49:37 GMT",
        "Xyz, 06 Nov 1994 08:49:37 GMT",
        "2026-11-22T00:00:00Z",
    ],
)
def test_parse_retry_after_unparseable(value: str) -> None:
    assert parse_retry_after(value, now=NOW) is None


def test_parse_retry_after_two_digit_year_window() -> None:
    now_2026 = _epoch(2026, 1, 1, 0, 0, 0)
    # "30" is within 50 years ahead, so 2030; "99" would be 2099 (> 50 ahead), so 1999.
    assert parse_retry_after("Tuesday, 01-Jan-30 00:00:00 GMT", now=now_2026) == (
        _epoch(2030, 1, 1, 0, 0, 0) - now_2026
    )
    assert parse_retry_after("Friday, 01-Jan-99 00:00:00 GMT", now=now_2026) == 0.0


def test_parse_retry_after_huge_delay_does_not_raise() -> None:
    assert parse_retry_after("9" * 5000, now=NOW) == float("inf")


def test_parse_when_takes_a_duration_ago() -> None:
    assert parse_when("90s", now=1000.0) == 910.0
    assert parse_when("2h", now=10_000.0) == 10_000.0 - 7200
    assert parse_when("1970-01-01T00:01:00Z") == 60.0


@pytest.mark.parametrize(
    "value",
    ["9" * 400 + "h", "9" * 30 + "d", "3660000d", "1" + "0" * 17 + "s", "9" * 400 + ".5m"],
)
def test_parse_when_refuses_a_duration_reaching_before_year_one(value: str) -> None:
    """A duration that leaves no writable timestamp (inf, or before 0001-01-01) is a
    ValueError, never an ``OverflowError`` later in ``format_epoch``."""
    with pytest.raises(ValueError, match="reaches back before the year 0001"):
        parse_when(value, now=1_800_000_000.0)


def test_parse_when_takes_a_duration_back_to_year_one() -> None:
    when = parse_when("700000d", now=1_800_000_000.0)
    assert format_epoch(when).startswith("01")
