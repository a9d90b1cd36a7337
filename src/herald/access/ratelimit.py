"""Per-tenant request rate limit with the IETF RateLimit header fields.

A fixed window per tenant (``q`` requests per ``w`` seconds). On a database that
one instance uses (SQLite) it is counted in memory. On one that several share
(PostgreSQL) it is counted in the database, in windows aligned on the clock, so
a tenant has one budget however many instances its requests reach. Headers
follow the structured-field form of draft-ietf-httpapi-ratelimit-headers:
``RateLimit-Policy: "default";q=200;w=10`` and
``RateLimit: "default";r=<remaining>;t=<seconds to reset>``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Protocol

from herald.config import ApiSettings


class Counter(Protocol):
    """The store's ``count_request``: one more request in a window, and the count."""

    def __call__(self, *, tenant_id: str, window_no: int, expire: bool) -> Awaitable[int]: ...


@dataclass(slots=True)
class _Window:
    start: float
    count: int
    refused: int = 0


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    remaining: int
    reset: int
    headers: dict[str, str]
    refused: int = 0
    """Requests refused so far in this window, this one included (in memory only)."""


class RateLimiter:
    """Requests counted per key (a tenant, an operator key, a client address)."""

    def __init__(
        self,
        *,
        limit: int,
        window: float,
        max_tenants: int = 100_000,
        counter: Counter | None = None,
        name: str = "default",
    ) -> None:
        self.limit = limit
        self.window = window
        self._windows: dict[str, _Window] = {}
        self._max_tenants = max_tenants
        self._name = name
        self._policy = f'"{name}";q={limit};w={math.ceil(window)}'
        self._counter = counter
        self._last_window_no: int | None = None

    async def hit(self, tenant: str, *, now: float | None = None) -> Decision:
        """Count one request of ``tenant``; whether it is allowed, and the headers."""
        if self._counter is None:
            return self._hit_in_memory(tenant, time.monotonic() if now is None else now)
        now = time.time() if now is None else now  # instances share the wall clock
        window_no = int(now // self.window)
        # Each instance deletes the windows before the one it starts counting in.
        expire, self._last_window_no = window_no != self._last_window_no, window_no
        count = await self._counter(tenant_id=tenant, window_no=window_no, expire=expire)
        reset = max(math.ceil((window_no + 1) * self.window - now), 1)
        return self._decision(count <= self.limit, min(count, self.limit), reset)

    def _hit_in_memory(self, tenant: str, now: float) -> Decision:
        win = self._windows.get(tenant)
        if win is None or now - win.start >= self.window:
            if len(self._windows) >= self._max_tenants:
                self._expire(now)
            win = self._windows[tenant] = _Window(now, 0)
        allowed = win.count < self.limit
        if allowed:
            win.count += 1
        else:
            win.refused += 1
        reset = max(math.ceil(win.start + self.window - now), 1)
        return self._decision(allowed, win.count, reset, win.refused)

    def _decision(self, allowed: bool, used: int, reset: int, refused: int = 0) -> Decision:
        remaining = max(self.limit - used, 0)
        headers = {
            "RateLimit-Policy": self._policy,
            "RateLimit": f'"{self._name}";r={remaining};t={reset}',
        }
        if not allowed:
            headers["Retry-After"] = str(reset)
        return Decision(allowed, remaining, reset, headers, refused)

    def _expire(self, now: float) -> None:
        for tenant in [t for t, w in self._windows.items() if now - w.start >= self.window]:
            del self._windows[tenant]


def request_limiters(
    settings: ApiSettings, *, counter: Counter | None
) -> tuple[RateLimiter, RateLimiter]:
    """The API's two limits, which the console shares: ``api.rate_limit_requests`` per
    key holder (counted by ``counter`` across instances when given), and
    ``api.unauthenticated_rate_limit_requests`` per client address without a valid
    key (in memory)."""
    window = settings.rate_limit_window_seconds
    return (
        RateLimiter(limit=settings.rate_limit_requests, window=window, counter=counter),
        RateLimiter(
            limit=settings.unauthenticated_rate_limit_requests,
            window=window,
            name="unauthenticated",
        ),
    )
