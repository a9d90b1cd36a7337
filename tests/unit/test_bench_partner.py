"""The partner benchmark's own arithmetic: its rate limit, its window count and the
probes the breaker's schedule allows."""

from __future__ import annotations

from bench.partner import Bucket, max_in_window, probes_allowed


def test_bucket_takes_one_seconds_worth_at_once_then_the_rate() -> None:
    bucket = Bucket(rate=50.0, jitter=0.0)
    assert all(bucket.take(100.0) for _ in range(50))
    assert not bucket.take(100.0)
    # One interval later, one more.
    assert bucket.take(100.021)
    assert not bucket.take(100.021)


def test_bucket_sustained_at_the_rate_never_refuses() -> None:
    bucket = Bucket(rate=50.0, jitter=0.0)
    assert all(bucket.take(10.0 + i / 50 + 1e-9) for i in range(1_000))


def test_bucket_tolerates_jitter_only_within_its_allowance() -> None:
    strict, lenient = Bucket(50.0, 0.0), Bucket(50.0, 0.005)
    for bucket in (strict, lenient):
        for _ in range(50):
            assert bucket.take(0.0)
    # 3 ms early for the next token.
    assert not strict.take(0.017)
    assert lenient.take(0.017)


def test_max_in_window_counts_half_open_windows() -> None:
    times = [0.0, 0.5, 0.99, 1.0, 1.2, 3.0]
    assert max_in_window(times) == 4  # 0.5, 0.99, 1.0, 1.2
    assert max_in_window([]) == 0


def test_probes_allowed_doubles_up_to_the_ceiling() -> None:
    assert probes_allowed(29.9, 30, 900) == 0
    assert probes_allowed(30, 30, 900) == 1
    assert probes_allowed(90, 30, 900) == 2  # 30, then 60
    # 30+60+120+240+480 = 930, then 900 each.
    assert probes_allowed(930, 30, 900) == 5
    assert probes_allowed(930 + 1800, 30, 900) == 7
