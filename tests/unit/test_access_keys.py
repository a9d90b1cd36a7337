"""The one key lookup every face shares: how long a revoked key can still open anything."""

from __future__ import annotations

from herald.access.keys import KEY_CACHE_SECONDS, KeyCache


class Keys:
    """A table of unrevoked keys that can be revoked, counting its reads, and a clock
    that moves only when told (and, if asked, while a read is in flight)."""

    def __init__(self) -> None:
        self.live = {"h1": "acme"}
        self.reads = 0
        self.now = 100.0
        self.read_takes = 0.0

    def clock(self) -> float:
        return self.now

    async def lookup(self, key_hash: str) -> str | None:
        self.reads += 1
        found = self.live.get(key_hash)
        self.now += self.read_takes
        return found


def test_the_bound_is_a_second_or_less() -> None:
    assert KEY_CACHE_SECONDS <= 1.0


async def test_a_revoked_key_is_refused_once_the_bound_has_passed_since_the_read() -> None:
    keys = Keys()
    cache = KeyCache(keys.lookup, clock=keys.clock)
    assert await cache.get("h1") == "acme"
    assert await cache.get("h1") == "acme"
    assert keys.reads == 1  # the second from memory
    del keys.live["h1"]  # revoked
    keys.now += KEY_CACHE_SECONDS - 0.01
    assert await cache.get("h1") == "acme"  # still inside the bound
    keys.now += 0.01
    assert await cache.get("h1") is None
    assert keys.reads == 2


async def test_the_age_counts_from_before_the_read() -> None:
    """A slow read that began before the revocation is trusted until the bound after
    it began, not after it ended."""
    keys = Keys()
    keys.read_takes = 0.75
    cache = KeyCache(keys.lookup, clock=keys.clock)
    assert await cache.get("h1") == "acme"  # began at 100.0, ended at 100.75
    del keys.live["h1"]
    keys.read_takes = 0.0
    keys.now = 100.0 + KEY_CACHE_SECONDS
    assert await cache.get("h1") is None


async def test_a_fresh_lookup_reads_within_the_bound_and_is_remembered() -> None:
    """The console's sign-in: a key revoked a moment ago is refused at once."""
    keys = Keys()
    cache = KeyCache(keys.lookup, clock=keys.clock)
    assert await cache.get("h1") == "acme"
    del keys.live["h1"]  # revoked
    assert await cache.get("h1") == "acme"  # remembered, inside the bound
    assert await cache.get("h1", fresh=True) is None
    assert keys.reads == 2
    assert await cache.get("h1") is None  # what the fresh read found, from memory now
    assert keys.reads == 2


async def test_unknown_keys_are_remembered_without_growing_past_the_size() -> None:
    keys = Keys()
    cache = KeyCache(keys.lookup, clock=keys.clock, size=3)
    for n in range(10):
        assert await cache.get(f"guess{n}") is None
    assert len(cache._seen) <= 3
    keys.live["guess9"] = "acme"  # a key made after a failed try is known within the bound
    keys.now += KEY_CACHE_SECONDS
    assert await cache.get("guess9") == "acme"
