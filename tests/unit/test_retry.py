from __future__ import annotations

import pytest

from herald.errors import StorageError
from herald.retry import RetryPolicy, retry_storage


def test_default_schedule_is_30s_doubling_ten_times() -> None:
    policy = RetryPolicy()
    assert policy.schedule() == [30, 60, 120, 240, 480, 960, 1920, 3840, 7680, 15360]
    assert policy.max_attempts == 11


def test_next_attempt_follows_schedule_then_exhausts() -> None:
    policy = RetryPolicy(base_seconds=30, max_retries=10)
    times = []
    for failed in range(1, 12):
        times.append(policy.next_attempt_at(failed_attempt=failed, round_start=0, now=1000.0))
    assert times[:10] == [1000.0 + 30 * 2 ** (k - 1) for k in range(1, 11)]
    assert times[10] is None


def test_shrunken_base_keeps_the_shape() -> None:
    policy = RetryPolicy(base_seconds=0.01, max_retries=3)
    assert policy.schedule() == pytest.approx([0.01, 0.02, 0.04])


def test_retry_after_pushes_later_never_earlier() -> None:
    policy = RetryPolicy(base_seconds=30, retry_after_max_seconds=3600)
    assert policy.next_attempt_at(failed_attempt=1, round_start=0, now=0, retry_after=5) == 30
    assert policy.next_attempt_at(failed_attempt=1, round_start=0, now=0, retry_after=90) == 90
    # Capped, so a hostile receiver cannot park a delivery for years.
    assert policy.next_attempt_at(failed_attempt=1, round_start=0, now=0, retry_after=1e9) == 3600


def test_replayed_delivery_restarts_the_schedule() -> None:
    policy = RetryPolicy(base_seconds=30, max_retries=10)
    # 11 attempts used, the replay starts a new round there: attempt 12 failing waits
    # 30 s again, and the round has 11 attempts.
    assert policy.round_start(11, 11) == 11
    assert policy.next_attempt_at(failed_attempt=12, round_start=11, now=0) == 30
    assert policy.next_attempt_at(failed_attempt=21, round_start=11, now=0) == 15360
    assert policy.next_attempt_at(failed_attempt=22, round_start=11, now=0) is None


def test_the_budget_is_the_current_config() -> None:
    """Created under max_retries=5, failed 3 times: with max_retries=2 its next failure
    (the 4th attempt) ends it; with max_retries=10 it goes on."""
    lowered = RetryPolicy(max_retries=2)
    assert lowered.next_attempt_at(failed_attempt=4, round_start=0, now=0) is None
    raised = RetryPolicy(base_seconds=1, max_retries=10)
    assert raised.next_attempt_at(failed_attempt=4, round_start=0, now=0) == 8


def test_a_stored_budget_keeps_its_end() -> None:
    """A value above the attempts made is a fixed budget (a test ping's 1, or what an
    earlier version stored at creation): the delivery ends where it was told."""
    for max_retries in (0, 2, 10):
        policy = RetryPolicy(base_seconds=30, max_retries=max_retries)
        assert (
            policy.next_attempt_at(failed_attempt=1, round_start=policy.round_start(1, 0), now=0)
            is None
        )
        start = policy.round_start(6, 3)  # created with a budget of 6, 3 attempts made
        assert policy.next_attempt_at(failed_attempt=4, round_start=start, now=0) is not None
        assert policy.next_attempt_at(failed_attempt=6, round_start=start, now=0) is None


def test_attempt_numbers_start_at_one() -> None:
    with pytest.raises(ValueError, match="from 1"):
        RetryPolicy().delay(0)


# --- retry_storage: database trouble, apart from the delivery schedule ------------------


class Flaky:
    """Fails with StorageError ``failures`` times, then answers 42."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    async def __call__(self) -> int:
        self.calls += 1
        if self.calls <= self.failures:
            raise StorageError(f"database is locked ({self.calls})")
        return 42


async def test_retry_storage_backs_off_exponentially_until_it_succeeds() -> None:
    told: list[tuple[str, float]] = []
    slept: list[float] = []

    async def sleep(delay: float) -> None:
        slept.append(delay)

    call = Flaky(8)
    result = await retry_storage(
        call, on_error=lambda exc, delay: told.append((exc.message, delay)), sleep=sleep
    )
    assert result == 42
    assert call.calls == 9
    assert slept == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
    assert told == [(f"database is locked ({n})", d) for n, d in enumerate(slept, 1)]


async def test_retry_storage_gives_up_only_when_told_to_stop() -> None:
    stopping = False
    call = Flaky(1000)

    async def sleep(delay: float) -> None:
        nonlocal stopping
        stopping = call.calls >= 3

    result = await retry_storage(
        call, on_error=lambda exc, delay: None, sleep=sleep, until=lambda: stopping
    )
    assert result is None
    assert call.calls == 4  # the try after the stop was asked for, then no more


async def test_retry_storage_lets_other_errors_through_at_once() -> None:
    calls = 0

    async def broken() -> None:
        nonlocal calls
        calls += 1
        raise ValueError("a bug, not the database")

    with pytest.raises(ValueError, match="a bug"):
        await retry_storage(broken, on_error=lambda exc, delay: None)
    assert calls == 1


async def test_retry_storage_stopping_at_the_first_failure_tries_no_more() -> None:
    call = Flaky(1000)
    told: list[float] = []
    result = await retry_storage(
        call, on_error=lambda exc, delay: told.append(delay), until=lambda: True
    )
    assert (result, call.calls, told) == (None, 1, [])


async def test_retry_storage_after_one_failure_waits_the_first_delay_only() -> None:
    slept: list[float] = []

    async def sleep(delay: float) -> None:
        slept.append(delay)

    call = Flaky(1)
    assert await retry_storage(call, on_error=lambda exc, delay: None, sleep=sleep) == 42
    assert (call.calls, slept) == (2, [0.1])


async def test_retry_storage_lets_other_errors_through_on_a_later_try() -> None:
    calls = 0

    async def sleep(delay: float) -> None:
        pass

    async def worse() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise StorageError("database is locked")
        raise ValueError("a bug, not the database")

    with pytest.raises(ValueError, match="a bug"):
        await retry_storage(worse, on_error=lambda exc, delay: None, sleep=sleep)
    assert calls == 2
