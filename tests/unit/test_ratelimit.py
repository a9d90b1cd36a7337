"""The API rate limit: in memory (one instance) or counted by a shared store."""

from __future__ import annotations

from collections import Counter

from herald.access.ratelimit import RateLimiter


class Table:
    """What the store's count_request does, in a dict."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, int]] = Counter()
        self.expired: list[int] = []

    async def __call__(self, *, tenant_id: str, window_no: int, expire: bool) -> int:
        if expire:
            self.expired.append(window_no)
            for key in [k for k in self.counts if k[1] < window_no]:
                del self.counts[key]
        self.counts[(tenant_id, window_no)] += 1
        return self.counts[(tenant_id, window_no)]


async def test_in_memory_window_starts_at_the_first_request() -> None:
    limiter = RateLimiter(limit=2, window=10)
    first = await limiter.hit("t", now=100.0)
    assert (first.allowed, first.remaining, first.reset) == (True, 1, 10)
    assert (await limiter.hit("t", now=105.0)).allowed
    refused = await limiter.hit("t", now=109.2)
    assert (refused.allowed, refused.remaining, refused.headers["Retry-After"]) == (False, 0, "1")
    assert (await limiter.hit("t", now=110.0)).allowed  # a new window
    assert (await limiter.hit("u", now=109.5)).allowed  # every tenant has its own


async def test_shared_windows_are_aligned_on_the_clock_and_counted_by_the_store() -> None:
    table = Table()
    a = RateLimiter(limit=3, window=10, counter=table)
    b = RateLimiter(limit=3, window=10, counter=table)  # another instance, same database
    decisions = [await x.hit("t", now=1005.5) for x in (a, b, a, b)]
    assert [d.allowed for d in decisions] == [True, True, True, False]
    assert [d.remaining for d in decisions] == [2, 1, 0, 0]
    assert decisions[-1].headers == {
        "RateLimit-Policy": '"default";q=3;w=10',
        "RateLimit": '"default";r=0;t=5',
        "Retry-After": "5",
    }
    assert (await a.hit("other", now=1009.9)).allowed
    # 1010 begins window 101 for both; each instance expires older windows once.
    assert (await b.hit("t", now=1010.0)).allowed
    assert table.expired == [100, 100, 101]
    assert set(table.counts) == {("t", 101)}


async def test_refusals_are_counted_per_window_under_the_limiters_name() -> None:
    limiter = RateLimiter(limit=1, window=10, name="unauthenticated")
    assert (await limiter.hit("10.0.0.1", now=0.0)).refused == 0
    refusals = [(await limiter.hit("10.0.0.1", now=t)).refused for t in (1.0, 2.0, 3.0)]
    assert refusals == [1, 2, 3]  # the first one is what gets logged
    last = await limiter.hit("10.0.0.1", now=4.0)
    assert last.headers["RateLimit-Policy"] == '"unauthenticated";q=1;w=10'
    assert last.headers["RateLimit"].startswith('"unauthenticated";r=0;')
    await limiter.hit("10.0.0.1", now=10.0)  # a new window
    assert (await limiter.hit("10.0.0.1", now=11.0)).refused == 1
