"""API keys: made here, stored only as their SHA-256, looked up by that digest.

Two kinds: a tenant key (``sk_live_…``) opens the REST API for its tenant; an
operator key (``sk_op_…``) opens the web console, for every tenant, and nothing
else. The kind is stored with the hash, so a tenant key never opens the console
whatever it looks like.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

API_KEY_PREFIX = "sk_live_"
OPERATOR_KEY_PREFIX = "sk_op_"
TENANT_KIND = "tenant"
OPERATOR_KIND = "operator"
OPERATOR_TENANT = ""
"""The tenant column of an operator key: it belongs to no tenant."""

KEY_ID_LENGTH = 12
"""A key is named by the first hex digits of its SHA-256 (the key itself is gone)."""


def new_api_key(*, operator: bool = False) -> str:
    """A new secret key, its kind's prefix and 256 random bits."""
    return (OPERATOR_KEY_PREFIX if operator else API_KEY_PREFIX) + secrets.token_urlsafe(32)


def hash_api_key(key: str) -> str:
    """What is stored and looked up: the key's SHA-256, in hex. Looking a key up by its
    digest never compares the key itself, so the lookup's timing says nothing about it."""
    return hashlib.sha256(key.encode()).hexdigest()


def key_id(key_hash: str) -> str:
    """The name a key goes by in lists, logs and audit lines."""
    return key_hash[:KEY_ID_LENGTH]


KEY_CACHE_SECONDS = 1.0
"""How long a process trusts what it last read of a key: a key revoked (by any
process) is refused by every face of every instance at most this long after."""

T = TypeVar("T")


class KeyCache(Generic[T]):
    """Every face's lookup of a key by its digest (the API's bearer keys, the console's
    sign-in), one object per process: what ``lookup`` says of a digest, the unrevoked
    key or None, is reused for at most ``max_age`` seconds.

    The age counts from before the read: a read that began before a revocation
    committed is trusted until ``max_age`` after it began, so ``max_age`` bounds the
    time a revoked key still opens anything, even across processes."""

    def __init__(
        self,
        lookup: Callable[[str], Awaitable[T | None]],
        *,
        max_age: float = KEY_CACHE_SECONDS,
        size: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lookup = lookup
        self.max_age = max_age
        self._size = size
        self._clock = clock
        self._seen: dict[str, tuple[T | None, float]] = {}

    async def get(self, key_hash: str) -> T | None:
        """The unrevoked key of ``key_hash`` (as ``lookup`` gives it), or None."""
        began = self._clock()
        seen = self._seen.get(key_hash)
        if seen is not None and began - seen[1] < self.max_age:
            return seen[0]
        found = await self._lookup(key_hash)
        if len(self._seen) >= self._size:
            # Guessed keys are remembered too (as None): a flood of them empties the
            # cache, which only costs reads, rather than growing it.
            self._seen.clear()
        self._seen[key_hash] = (found, began)
        return found
