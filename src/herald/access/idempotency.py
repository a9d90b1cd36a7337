"""Idempotency records: a create sent again with the same ``Idempotency-Key`` and body
answers what the first one did, for ``api.idempotency_ttl_seconds``.

The record is reserved before the request runs (a repeat meanwhile is told it is in
progress), finished with the answer kept, or forgotten when the request failed so the
client may retry. How a request is answered from a record is the API's
(``herald.api.base``)."""

from __future__ import annotations

import contextlib
import hashlib
import time

import orjson

from herald.store import Store
from herald.store.base import IdempotencyRecord


def fingerprint(method: str, path: str, body: bytes) -> str:
    """What a repeat must match: the method, the path and the body (a JSON body with its
    keys sorted, so that the same object sent in another order is the same request)."""
    canonical = body
    with contextlib.suppress(orjson.JSONDecodeError):
        canonical = orjson.dumps(orjson.loads(body), option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(method.encode() + b" " + path.encode() + b"\n" + canonical).hexdigest()


class Idempotency:
    """The idempotency records of every tenant, kept ``ttl`` seconds."""

    def __init__(self, store: Store, *, ttl: float) -> None:
        self._store = store
        self.ttl = ttl

    async def begin(self, tenant_id: str, key: str, fingerprint: str) -> IdempotencyRecord | None:
        """Reserve ``key``; None when it is new (or expired), else the record there."""
        return await self._store.idempotency_begin(
            tenant_id=tenant_id, key=key, fingerprint=fingerprint, now=time.time(), ttl=self.ttl
        )

    async def finish(self, tenant_id: str, key: str, *, status: int, body: bytes) -> None:
        """Keep the answer a repeat gets."""
        await self._store.idempotency_finish(tenant_id=tenant_id, key=key, status=status, body=body)

    async def abort(self, tenant_id: str, key: str) -> None:
        """Forget a reservation whose request failed, so the client may retry."""
        await self._store.idempotency_abort(tenant_id=tenant_id, key=key)
