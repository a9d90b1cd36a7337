"""Bar charts drawn on the server: counts per time bucket as SVG rectangles.

The page needs no script to show them; the numbers are also in each bar's title
(read by screen readers and shown on hover) and in the table beside the chart.
"""

from __future__ import annotations

from dataclasses import dataclass

WIDTH = 600
HEIGHT = 120
OUTCOMES = ("success", "failure")


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
    for bucket, values in sorted(per.items()):
        x = (bucket - first) * slot
        base = float(HEIGHT)
        for outcome in OUTCOMES:
            count = values[outcome]
            if not count:
                continue
            height = HEIGHT * count / peak
            base -= height
            minutes = (last - bucket) * bucket_seconds // 60
            when = "this bucket" if minutes == 0 else f"{minutes} min ago"
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
    return Chart(WIDTH, HEIGHT, bars, totals, peak, label)
