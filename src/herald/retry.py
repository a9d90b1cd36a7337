"""The retry schedule, as a pure function of the attempt number.

After failed attempt *k* (1-based) the next runs ``base × 2^(k−1)`` later:
30 s, 60 s, 120 s … 15 360 s with the defaults; after ``max_retries`` retries
(``max_retries + 1`` attempts) the delivery is ``failure``. The budget is decided
here, when an attempt is recorded, from the recording daemon's config: a change of
``max_retries`` applies to deliveries already scheduled. A ``Retry-After``
from the receiver can push the next attempt later, never earlier.

Database trouble is retried apart from that schedule, by :func:`retry_storage`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import tenacity

from herald.errors import StorageError

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    base_seconds: float = 30.0
    max_retries: int = 10
    retry_after_max_seconds: float = 86_400.0

    @property
    def max_attempts(self) -> int:
        return self.max_retries + 1

    def delay(self, failed_attempt: int) -> float:
        """Seconds between failed attempt ``failed_attempt`` and the next one."""
        if failed_attempt < 1:
            raise ValueError("attempts are numbered from 1")
        return float(self.base_seconds * 2 ** (failed_attempt - 1))

    def next_attempt_at(
        self,
        *,
        failed_attempt: int,
        round_start: int,
        now: float,
        retry_after: float | None = None,
    ) -> float | None:
        """When to try again after a failure, or None when the delivery is exhausted.

        ``failed_attempt`` counts every attempt the delivery has had; ``round_start``
        is how many it had before its current round (0; a replay of a finished
        delivery starts a new round). The budget is this policy's, the daemon's
        current config: ``max_retries`` retries after the round's first attempt.
        """
        made = failed_attempt - round_start
        if made >= self.max_attempts:
            return None
        delay = self.delay(max(made, 1))
        if retry_after is not None:
            delay = max(delay, min(retry_after, self.retry_after_max_seconds))
        return now + delay

    def round_start(self, stored: int, attempt_count: int) -> int:
        """Where a delivery's current round began, from its stored ``max_attempts``
        column and the attempts it had before this one.

        The column holds the round's start (0 at creation, the attempt count at a
        replay), never more than the attempts made. A larger value is a fixed budget:
        a test ping's 1, or what an earlier version stored at creation (the delivery
        is still pending, so below it): such a delivery keeps that end.
        """
        if stored <= attempt_count:
            return stored
        return stored - self.max_attempts

    def schedule(self) -> list[float]:
        """The full schedule of delays, for docs and ``check-config``."""
        return [self.delay(k) for k in range(1, self.max_retries + 1)]


async def retry_storage(
    call: Callable[[], Awaitable[T]],
    *,
    on_error: Callable[[StorageError, float], None],
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    until: Callable[[], bool] = lambda: False,
    first: float = 0.1,
    cap: float = 5.0,
) -> T | None:
    """Run ``call`` until it does not raise StorageError, and return its result.

    For a database that went away (locked, restarting, unreachable, full): after each
    failure ``on_error(error, delay)`` is told (to log it, to make /readyz unready)
    and ``sleep(delay)`` waits, ``first`` seconds doubling up to ``cap``. Returns None
    without another try once ``until()`` is true after a failure (the caller is
    stopping). Any other exception propagates at once.
    """

    # The first try runs bare: tenacity's machinery costs ~25 µs a call (70 on a slow
    # guest), and the engine makes this call for every claim, relay pass and recording.
    try:
        return await call()
    except StorageError as exc:
        if until():
            return None
        delay = min(first, cap)
        on_error(exc, delay)
    await sleep(delay)

    def told(state: tenacity.RetryCallState) -> None:
        assert state.outcome is not None
        assert state.next_action is not None
        error = state.outcome.exception()
        assert isinstance(error, StorageError)
        on_error(error, state.next_action.sleep)

    # From the second try on, the waits go on doubling from where the first left off.
    retrying = tenacity.AsyncRetrying(
        retry=tenacity.retry_if_exception_type(StorageError),
        wait=tenacity.wait_exponential(multiplier=2 * first, max=cap),
        stop=lambda _: until(),
        sleep=sleep,
        before_sleep=told,
        reraise=True,
    )
    try:
        return await retrying(call)
    except StorageError:
        if until():
            return None
        raise
