"""Bar charts drawn on the server: counts per time bucket as SVG rectangles.

The page needs no script to show them; the numbers are also in each bar's title
(read by screen readers and shown on hover) and in a table of the buckets below the
chart, under a time axis of evenly spaced ticks ("45 min ago" … "now").
"""

from __future__ import annotations

from dataclasses import dataclass

from herald.model import HourCount

WIDTH = 600
HEIGHT = 120
OUTCOMES = ("success", "failure")
TICKS = 4
"""Spaces between the time axis' labels (five labels, the last "now")."""


@dataclass(frozen=True, slots=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    outcome: str
    title: str


@dataclass(frozen=True, slots=True)
class Chart:
    width: int
    height: int
    bars: list[Bar]
    totals: dict[str, int]
    peak: int
    label: str
    ticks: list[str]
    """The time axis' labels, evenly spaced from the chart's left edge to "now"."""
    rows: list[tuple[str, int, int]]
    """(when, successes, failures) of each bucket with a count, the newest first."""


def bar_chart(
    counts: list[tuple[str, int, int]],
    *,
    now: float,
    bucket_seconds: int,
    buckets: int,
    label: str,
) -> Chart:
    """Stack success under failure per bucket, the newest bucket at the right.

    ``counts`` are (outcome, bucket number, count) with bucket number × bucket_seconds
    the bucket's start, as the store answers them; outcomes other than success and
    failure are ignored."""
    last = int(now // bucket_seconds)
    first = last - buckets + 1
    per: dict[int, dict[str, int]] = {}
    totals = dict.fromkeys(OUTCOMES, 0)
    for outcome, bucket, count in counts:
        if outcome not in totals or not first <= bucket <= last:
            continue
        per.setdefault(bucket, dict.fromkeys(OUTCOMES, 0))[outcome] += count
        totals[outcome] += count
    peak = max((sum(v.values()) for v in per.values()), default=0)
    slot = WIDTH / buckets
    bars: list[Bar] = []
    rows: list[tuple[str, int, int]] = []
    for bucket, values in sorted(per.items()):
        rows.insert(
            0, (_ago((last - bucket) * bucket_seconds), values["success"], values["failure"])
        )
        x = (bucket - first) * slot
        base = float(HEIGHT)
        for outcome in OUTCOMES:
            count = values[outcome]
            if not count:
                continue
            height = HEIGHT * count / peak
            base -= height
            when = _ago((last - bucket) * bucket_seconds)
            bars.append(
                Bar(
                    x=round(x + slot * 0.1, 2),
                    y=round(base, 2),
                    width=round(max(slot * 0.8, 1.0), 2),
                    height=round(height, 2),
                    outcome=outcome,
                    title=f"{count} {outcome}, {when}",
                )
            )
    step = buckets / TICKS
    ticks = [_ago(round(buckets - i * step) * bucket_seconds, edge=True) for i in range(TICKS)]
    return Chart(WIDTH, HEIGHT, bars, totals, peak, label, [*ticks, "now"], rows)


def _ago(seconds: int, *, edge: bool = False) -> str:
    """How long ago a bucket began (``edge``: a point on the time axis)."""
    if seconds == 0:
        return "now" if edge else "this bucket"
    if seconds % 3600 == 0:
        return f"{seconds // 3600} h ago"
    return f"{seconds // 60} min ago"


def hourly_chart(hours: list[HourCount], *, now: float, label: str) -> Chart:
    """Attempts per hour over the last 24 hours (the recorder's counters: a
    destination's, or the overview's), success stacked under failure."""
    counts = [("success", h.hour, h.successes) for h in hours]
    counts += [("failure", h.hour, h.failures) for h in hours]
    return bar_chart(counts, now=now, bucket_seconds=3600, buckets=24, label=label)
