"""Timestamp parsing and formatting: RFC 3339 in, normalized UTC text out."""

from __future__ import annotations

import datetime as _dt
import re
import time
from typing import NamedTuple

__all__ = [
    "Instant",
    "format_epoch",
    "now",
    "parse_retry_after",
    "parse_timestamp",
    "rfc3339_nano",
]

_EPOCH = _dt.datetime(1970, 1, 1)
_MAX_SHOWN = 64

# re.ASCII: without it \d would also accept non-ASCII digits such as "٣".
_RFC3339 = re.compile(
    r"(?P<y>\d{4})-(?P<mo>\d{2})-(?P<d>\d{2})[Tt ]"
    r"(?P<h>\d{2}):(?P<mi>\d{2})(?::(?P<s>\d{2})(?:\.(?P<f>\d{1,9}))?)?"
    r"(?:(?P<z>[Zz])|(?P<sign>[+-])(?P<oh>\d{2})(?::?(?P<om>\d{2}))?)?",
    re.ASCII,
)

_NORMALIZED = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?Z", re.ASCII)


class Instant(NamedTuple):
    """A parsed point in time: normalized RFC 3339 UTC text and epoch seconds."""

    text: str
    epoch: float


def _shown(value: str) -> str:
    """The value as quoted in error messages, cut to a readable length."""
    if len(value) > _MAX_SHOWN:
        value = value[:_MAX_SHOWN] + "…"
    return repr(value)


def _bad(value: str, reason: str) -> ValueError:
    return ValueError(f"invalid timestamp {_shown(value)}: {reason}")


def _days_from_civil(y: int, m: int, d: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (era arithmetic, no tables)."""
    y -= m <= 2
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    return era * 146097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719468


def _civil_from_days(z: int) -> tuple[int, int, int]:
    """Inverse of ``_days_from_civil``."""
    z += 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + (3 if mp < 10 else -9)
    return yoe + era * 400 + (m <= 2), m, d


_MONTH_DAYS = (0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
# Epoch-second bounds of years 0001..9999, so shifted results stay four-digit years.
_MIN_WHOLE = _days_from_civil(1, 1, 1) * 86400
_MAX_WHOLE = _days_from_civil(10000, 1, 1) * 86400 - 1


_DATE_CACHE: dict[str, int] = {}
_DATE_CACHE_SIZE = 1024


def _date_days(value: str, year: int, month: int, day: int) -> int:
    """Validate a calendar date and return its days since the epoch."""
    if year == 0:
        raise _bad(value, "year must be 0001-9999")
    if not 1 <= month <= 12:
        raise _bad(value, "month must be 01-12")
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    if not 1 <= day <= _MONTH_DAYS[month] + (month == 2 and leap):
        raise _bad(value, "day is out of range for month")
    return _days_from_civil(year, month, day)


def parse_timestamp(value: str) -> Instant:
    """Parse an RFC 3339 timestamp (no zone means UTC) and normalize it to UTC."""
    m = _RFC3339.fullmatch(value)
    if m is None:
        raise _bad(value, "expected RFC 3339, e.g. 2026-01-02T03:04:05Z")
    ys, mos, ds, hs, mis, ss, frac, _z, sign, oh, om = m.groups()
    hour, minute = int(hs), int(mis)
    second = int(ss) if ss else 0
    # Timestamps on a hot path share few distinct dates, so validated dates are cached.
    days = _DATE_CACHE.get(value[:10])
    if days is None:
        days = _date_days(value, int(ys), int(mos), int(ds))
        if len(_DATE_CACHE) >= _DATE_CACHE_SIZE:
            _DATE_CACHE.clear()
        _DATE_CACHE[value[:10]] = days
    if hour > 23:
        raise _bad(value, "hour must be 00-23")
    if minute > 59:
        raise _bad(value, "minute must be 00-59")
    if second > 59:
        raise _bad(value, "second must be 00-59")

    offset = 0
    if sign is not None:
        off_h = int(oh)
        off_m = int(om) if om else 0
        if off_h > 23 or off_m > 59:
            raise _bad(value, "UTC offset must be within ±23:59")
        offset = off_h * 3600 + off_m * 60
        if sign == "-":
            offset = -offset

    whole = days * 86400 + hour * 3600 + minute * 60 + second - offset
    tail = f".{frac}Z" if frac else "Z"
    if offset == 0:
        # Fast path: the fields are already UTC, so reuse the digits as given.
        text = f"{ys}-{mos}-{ds}T{hs}:{mis}:{ss or '00'}{tail}"
    else:
        if not _MIN_WHOLE <= whole <= _MAX_WHOLE:
            raise _bad(value, "the UTC time is outside years 0001-9999")
        utc_days, rem = divmod(whole, 86400)
        uy, um, ud = _civil_from_days(utc_days)
        uh, rem = divmod(rem, 3600)
        umi, us = divmod(rem, 60)
        text = f"{uy:04d}-{um:02d}-{ud:02d}T{uh:02d}:{umi:02d}:{us:02d}{tail}"
    epoch = whole + int(frac) / 10 ** len(frac) if frac else float(whole)
    return Instant(text, epoch)


_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])", re.ASCII)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_when(value: str, *, now: float | None = None) -> float:
    """A time as the CLI and the API take it, as epoch seconds: an RFC 3339 timestamp,
    or a duration ago such as ``90s``, ``15m``, ``2h``, ``7d``. Raises ValueError."""
    if m := _DURATION.fullmatch(value):
        when = (time.time() if now is None else now) - float(m[1]) * _UNITS[m[2]]
        # A duration of any length parses (float("9" * 400) is inf): bounded here, so
        # that what it gives can be written back as a timestamp (format_epoch).
        if not _MIN_WHOLE <= when <= _MAX_WHOLE:
            raise ValueError(f"{_shown(value)} reaches back before the year 0001")
        return when
    try:
        return parse_timestamp(value).epoch
    except ValueError as exc:
        raise ValueError(
            f"{_shown(value)} is neither an RFC 3339 timestamp nor a duration like 2h"
        ) from exc


def format_span(seconds: float) -> str:
    """A duration the way people write it: ``45s``, ``8m``, ``1h4m``, ``2d3h``."""
    total = round(seconds)
    if total < 60:
        return f"{seconds:g}s" if seconds < 1 else f"{total}s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, total = divmod(total, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts[:2])


def now() -> float:
    """Current time in epoch seconds."""
    return time.time()


def format_epoch(ts: float) -> str:
    """Format epoch seconds as RFC 3339 UTC with exactly six fractional digits."""
    # Round to whole microseconds first so 0.1234565 style floats do not drift.
    secs, micros = divmod(round(ts * 1_000_000), 1_000_000)
    days, rem = divmod(secs, 86400)
    year, month, day = _civil_from_days(days)
    hour, rem = divmod(rem, 3600)
    minute, second = divmod(rem, 60)
    return f"{year:04d}-{month:02d}-{day:02d}T{hour:02d}:{minute:02d}:{second:02d}.{micros:06d}Z"


def rfc3339_nano(inst_text: str) -> str:
    """Return a normalized timestamp (``Instant.text``) with exactly nine fractional digits."""
    if _NORMALIZED.fullmatch(inst_text) is None:
        raise ValueError(f"not a normalized timestamp: {_shown(inst_text)}")
    frac = inst_text[20:-1]
    return f"{inst_text[:19]}.{frac:0<9}Z"


_MONTHS = {
    name: i
    for i, name in enumerate(
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"), 1
    )
}
_DAY = r"(?:mon|tue|wed|thu|fri|sat|sun)"
_LONG_DAY = r"(?:monday|tuesday|wednesday|thursday|friday|saturday|sunday)"
_MON = r"(?P<mon>jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)"
_HMS = r"(?P<h>\d{2}):(?P<mi>\d{2}):(?P<s>\d{2})"
# RFC 9110 §5.6.7: recipients must accept IMF-fixdate and the two obsolete forms.
_HTTP_DATES = (
    re.compile(rf"{_DAY}, (?P<d>\d{{2}}) {_MON} (?P<y>\d{{4}}) {_HMS} gmt", re.ASCII | re.I),
    re.compile(rf"{_LONG_DAY}, (?P<d>\d{{2}})-{_MON}-(?P<yy>\d{{2}}) {_HMS} gmt", re.ASCII | re.I),
    re.compile(rf"{_DAY} {_MON} (?P<d>[ \d]\d) {_HMS} (?P<y>\d{{4}})", re.ASCII | re.I),
)


def _http_date(value: str, now: float) -> float | None:
    """Epoch seconds of an HTTP-date, or None if ``value`` is not one."""
    for pattern in _HTTP_DATES:
        m = pattern.fullmatch(value)
        if m is not None:
            break
    else:
        return None
    groups = m.groupdict()
    if groups.get("yy") is not None:
        # RFC 9110: a two-digit year more than 50 years ahead means the previous century.
        this_year = _civil_from_days(int(now) // 86400)[0]
        year = this_year - this_year % 100 + int(groups["yy"])
        if year > this_year + 50:
            year -= 100
    else:
        year = int(groups["y"])
    try:
        when = _dt.datetime(
            year,
            _MONTHS[groups["mon"].lower()],
            int(groups["d"]),
            int(groups["h"]),
            int(groups["mi"]),
            int(groups["s"]),
        )
    except ValueError:
        return None
    return (when - _EPOCH).total_seconds()


def parse_retry_after(value: str, *, now: float) -> float | None:
    """Seconds to wait from an HTTP Retry-After value (delay-seconds or HTTP-date), or None.

    The result is not capped; callers clamp it to their own maximum.
    """
    value = value.strip()
    if not value:
        return None
    if value.isascii() and value.isdigit():
        # float() rather than int(): no digit-count limit on absurd values.
        return float(value)
    when = _http_date(value, now)
    if when is None:
        return None
    return max(0.0, when - now)
