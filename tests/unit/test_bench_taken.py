"""``bench throughput``'s reading of how the daemon took its deliveries."""

from __future__ import annotations

from bench.daemon import taken_from_metrics

PAGE = """# HELP herald_deliveries_taken_total Deliveries taken to attempt, by how
# TYPE herald_deliveries_taken_total counter
herald_deliveries_taken_total{via="handover"} 61234.0
herald_deliveries_taken_total{via="claim"} 38767.0
herald_inflight_attempts 0.0
"""


def test_the_counts_by_via() -> None:
    assert taken_from_metrics(PAGE) == {"handover": 61234, "claim": 38767}


def test_none_before_the_dispatcher_counts() -> None:
    assert taken_from_metrics("herald_inflight_attempts 0.0\n") == {}
