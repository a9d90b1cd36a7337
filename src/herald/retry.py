"""The retry schedule, as a pure function of the attempt number.

After failed attempt *k* (1-based) the next runs ``base × 2^(k−1)`` later:
30 s, 60 s, 120 s … 15 360 s with the defaults; after ``max_retries`` retries
(``max_retries + 1`` attempts) the delivery is ``failure``. A ``Retry-After``
from the receiver can push the next attempt later, never earlier.
"""

from __future__ import annotations

from dataclasses import dataclass


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
        max_attempts: int,
        now: float,
        retry_after: float | None = None,
    ) -> float | None:
        """When to try again after a failure, or None when the delivery is exhausted.

        ``failed_attempt`` counts every attempt the delivery has had, and
        ``max_attempts`` is the delivery's own budget (replays extend it).
        """
        if failed_attempt >= max_attempts:
            return None
        cycle_start = max_attempts - self.max_attempts
        delay = self.delay(max(failed_attempt - cycle_start, 1))
        if retry_after is not None:
            delay = max(delay, min(retry_after, self.retry_after_max_seconds))
        return now + delay

    def schedule(self) -> list[float]:
        """The full schedule of delays, for docs and ``check-config``."""
        return [self.delay(k) for k in range(1, self.max_retries + 1)]


class Backoff:
    """Exponential delays for retrying a database that went away: 0.1 s doubling to 5 s."""

    def __init__(self, first: float = 0.1, cap: float = 5.0) -> None:
        self._first, self._cap, self._next = first, cap, first

    def next(self) -> float:
        delay, self._next = self._next, min(self._next * 2, self._cap)
        return delay

    def reset(self) -> None:
        self._next = self._first
