"""API keys: made here, stored only as their SHA-256, looked up by that digest, through
one cache whose bound (``KEY_CACHE_SECONDS``) is how long a revoked key may still open
anything, on any face of any instance.

Two kinds: a tenant key (``sk_live_…``) opens the REST API for its tenant; an
operator key (``sk_op_…``) opens the web console, for every tenant, and nothing
else. The kind is stored with the hash, so a tenant key never opens the console
whatever it looks like.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Generic, TypeVar

from herald.errors import BadRequest, NotFound
from herald.store import Store
from herald.store.base import ApiKeyInfo

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

    async def get(self, key_hash: str, *, fresh: bool = False) -> T | None:
        """The unrevoked key of ``key_hash`` (as ``lookup`` gives it), or None;
        ``fresh``: read now whatever is remembered (and remember that read)."""
        began = self._clock()
        seen = self._seen.get(key_hash)
        if not fresh and seen is not None and began - seen[1] < self.max_age:
            return seen[0]
        found = await self._lookup(key_hash)
        if len(self._seen) >= self._size:
            # Guessed keys are remembered too (as None): a flood of them empties the
            # cache, which only costs reads, rather than growing it.
            self._seen.clear()
        self._seen[key_hash] = (found, began)
        return found


class Keys:
    """The keys of one process, over the store: made, listed, revoked, looked up (through
    the one :class:`KeyCache` every face shares), and the credentials they guard
    re-encrypted under a new encryption key."""

    def __init__(self, store: Store, *, max_age: float = KEY_CACHE_SECONDS) -> None:
        self._store = store
        self.cache: KeyCache[ApiKeyInfo] = KeyCache(store.api_key, max_age=max_age)
        """The lookup by digest, read by the API, the console and the portal alike."""

    async def lookup(self, key_hash: str, *, fresh: bool = False) -> ApiKeyInfo | None:
        """The unrevoked key of ``key_hash`` (a revoked one at most ``max_age`` after;
        never with ``fresh``, for what is rare and must not be undone a moment later)."""
        return await self.cache.get(key_hash, fresh=fresh)

    async def operator_key_revoked(self, key_hash: str) -> bool:
        """Whether the hash is a revoked operator key's (the console's sign-in says so)."""
        return await self._store.operator_key_revoked(key_hash)

    async def create(self, tenant_id: str, *, operator: bool) -> tuple[str, str]:
        """A new key of ``tenant_id`` (``OPERATOR_TENANT`` for an operator key), stored as
        its hash: the key, shown this once, and its digest."""
        key = new_api_key(operator=operator)
        digest = hash_api_key(key)
        await self._store.create_api_key(
            key_hash=digest,
            tenant_id=tenant_id,
            hint=key[-4:],
            now=time.time(),
            kind=OPERATOR_KIND if operator else TENANT_KIND,
        )
        return key, digest

    async def of(self, tenant_id: str, *, operator: bool) -> list[ApiKeyInfo]:
        """The tenant's keys (or the operators'), newest first, revoked ones included."""
        kind = OPERATOR_KIND if operator else TENANT_KIND
        return await self._store.list_api_keys(tenant_id, kind=kind)

    async def revoke(self, tenant_id: str, ref: str, *, operator: bool) -> ApiKeyInfo:
        """Revoke one unrevoked key, named by its id (8+ hex digits) or the key itself;
        the key as revoked. An operator key's console sessions end with it (they are
        looked up through it); every face refuses it within ``KEY_CACHE_SECONDS``."""
        ref = ref.strip()
        whose = "operators" if operator else f"tenant {tenant_id!r}"
        if ref.startswith((API_KEY_PREFIX, OPERATOR_KEY_PREFIX)):
            prefix = hash_api_key(ref)
        elif re.fullmatch(r"[0-9a-fA-F]{8,64}", ref):
            prefix = ref.lower()
        else:
            raise BadRequest(
                "name the key by its id from 'herald keys list' or give the key itself"
            )
        keys = await self.of(tenant_id, operator=operator)
        live = [k for k in keys if k.key_hash.startswith(prefix) and k.revoked_at is None]
        if len(live) > 1:
            raise BadRequest(f"{len(live)} keys of {whose} match; give more digits")
        if not live:
            raise NotFound(f"no unrevoked key {ref!r} of {whose}")
        now = time.time()
        await self._store.revoke_api_keys(
            tenant_id=tenant_id,
            hash_prefix=live[0].key_hash,
            now=now,
            kind=OPERATOR_KIND if operator else TENANT_KIND,
        )
        return replace(live[0], revoked_at=now)

    async def reencrypt(
        self, *, batch_size: int, progress: Callable[[int, int, str], None]
    ) -> tuple[int, int]:
        """Re-encrypt every destination's credentials under the store's current key, a
        batch per transaction (``progress(rewritten, seen, last id)`` after each); how
        many were looked at and how many rewritten. Rows under that key already are
        skipped, so an interrupted run is finished by running it again."""
        seen = rewritten = 0
        after: str | None = None
        while True:
            looked, changed, last = await self._store.reencrypt_secrets(
                after_id=after, limit=batch_size
            )
            if last is None:
                break
            seen, rewritten, after = seen + looked, rewritten + changed, last
            progress(rewritten, seen, last)
            if looked < batch_size:
                break
        return seen, rewritten
