"""Per-tenant request rate limit with the IETF RateLimit header fields.

A fixed window per tenant (``q`` requests per ``w`` seconds), in memory: one
process enforces its own budget. Headers follow the structured-field form of
draft-ietf-httpapi-ratelimit-headers: ``RateLimit-Policy: "default";q=200;w=10``
and ``RateLimit: "default";r=<remaining>;t=<seconds to reset>``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass


@dataclass(slots=True)
class _Window:
    start: float
    count: int


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    remaining: int
    reset: int
    headers: dict[str, str]


class RateLimiter:
    def __init__(self, *, limit: int, window: float, max_tenants: int = 100_000) -> None:
        self.limit = limit
        self.window = window
        self._windows: dict[str, _Window] = {}
        self._max_tenants = max_tenants
        self._policy = f'"default";q={limit};w={math.ceil(window)}'

    def hit(self, tenant: str, *, now: float | None = None) -> Decision:
        now = time.monotonic() if now is None else now
        win = self._windows.get(tenant)
        if win is None or now - win.start >= self.window:
            if len(self._windows) >= self._max_tenants:
                self._expire(now)
            win = self._windows[tenant] = _Window(now, 0)
        allowed = win.count < self.limit
        if allowed:
            win.count += 1
        remaining = max(self.limit - win.count, 0)
        reset = max(math.ceil(win.start + self.window - now), 1)
        headers = {
            "RateLimit-Policy": self._policy,
            "RateLimit": f'"default";r={remaining};t={reset}',
        }
        if not allowed:
            headers["Retry-After"] = str(reset)
        return Decision(allowed, remaining, reset, headers)

    def _expire(self, now: float) -> None:
        for tenant in [t for t, w in self._windows.items() if now - w.start >= self.window]:
            del self._windows[tenant]
