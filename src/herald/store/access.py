"""The store's part that lets callers in: API keys (hashes only), session tokens,
console sessions, the API's rate-limit counters and its idempotency records."""

from __future__ import annotations

from typing import Literal

from herald.store.base import ApiKeyInfo, ConsoleSession, IdempotencyRecord, TokenRow, TokenState
from herald.store.part import StorePart


class AccessStore(StorePart):
    """Who may call and how often: keys, tokens, sessions, rate limits, idempotency."""

    # --- session tokens ---------------------------------------------------
    async def create_token(
        self,
        *,
        id: str,
        tenant_id: str,
        token_hash: str,
        key_hash: str,
        now: float,
        expires_at: float,
    ) -> None:
        async with self.dialect.tx(atomic=False) as c:
            await self.dialect.execute(
                c, "create_token", id, tenant_id, token_hash, key_hash, now, expires_at
            )

    async def use_token(
        self,
        how: Literal["token", "trade", "session"],
        digest: str,
        *,
        now: float,
        idle: float,
        lifetime: float,
        session_hash: str | None = None,
    ) -> TokenRow | None:
        """Open a live token in one statement and slide its expiry (``now + idle``, never
        past ``created_at + lifetime``): by the token's hash (``token``); the same, once,
        storing ``session_hash`` (``trade``); or by a session's hash (``session``).
        None when it does not open."""
        d = self.dialect
        args = (digest, now, idle, lifetime)
        async with d.tx(atomic=False) as c:
            if how == "trade":
                row = await d.fetchrow(c, "trade_token", *args, session_hash)
            elif how == "session":
                row = await d.fetchrow(c, "open_session", *args)
            else:
                row = await d.fetchrow(c, "open_token", *args)
        return None if row is None else TokenRow(*row)

    async def token_state(self, digest: str, *, session: bool) -> TokenState | None:
        """Why a token (or with ``session``, a portal session) did not open: its row's
        state; None if there is none."""
        if session:
            rows = await self.dialect.read("session_state", digest)
        else:
            rows = await self.dialect.read("token_state", digest)
        return TokenState(*rows[0]) if rows else None

    async def reissue_token(
        self, *, tenant_id: str, token_id: str, token_hash: str, now: float
    ) -> TokenRow | None:
        """Give a live, untraded token a new value (hash); None if it is not one."""
        async with self.dialect.tx(atomic=False) as c:
            row = await self.dialect.fetchrow(
                c, "reissue_token", token_hash, token_id, tenant_id, now
            )
        return None if row is None else TokenRow(*row)

    async def close_session(self, session_hash: str, *, now: float) -> bool:
        async with self.dialect.tx(atomic=False) as c:
            return bool(await self.dialect.execute(c, "close_session", session_hash, now))

    # --- API rate limit ---------------------------------------------------
    async def count_request(self, *, tenant_id: str, window_no: int, expire: bool) -> int:
        """Count one request of ``tenant_id`` in fixed window ``window_no``; the window's
        count so far, this one included. ``expire`` also deletes earlier windows."""
        d = self.dialect
        async with d.tx(atomic=False) as c:
            if expire:
                await d.execute(c, "expire_rate_windows", window_no)
            return int(await d.fetchval(c, "count_request", tenant_id, window_no))

    # --- idempotency ------------------------------------------------------
    async def idempotency_begin(
        self, *, tenant_id: str, key: str, fingerprint: str, now: float, ttl: float
    ) -> IdempotencyRecord | None:
        """Reserve ``key``; None when it is new, else the record already there."""
        d = self.dialect
        async with d.tx() as c:
            await d.execute(c, "idempotency_expire", now - ttl)
            if await d.fetchval(c, "idempotency_reserve", tenant_id, key, fingerprint, now):
                return None
            row = await d.fetchrow(c, "idempotency_get", tenant_id, key)
        if row is None:  # expired and deleted between the two statements
            return None
        return IdempotencyRecord(row[0], row[1], None if row[2] is None else bytes(row[2]))

    async def idempotency_finish(
        self, *, tenant_id: str, key: str, status: int, body: bytes
    ) -> None:
        async with self.dialect.tx(atomic=False) as c:
            await self.dialect.execute(c, "idempotency_finish", status, body, tenant_id, key)

    async def idempotency_abort(self, *, tenant_id: str, key: str) -> None:
        """Forget a reservation whose request failed, so the client may retry."""
        async with self.dialect.tx(atomic=False) as c:
            await self.dialect.execute(c, "idempotency_abort", tenant_id, key)

    # --- API keys ---------------------------------------------------------
    async def create_api_key(
        self, *, key_hash: str, tenant_id: str, hint: str, now: float, kind: str = "tenant"
    ) -> None:
        """Store a key's hash: ``kind`` ``tenant`` for the API, ``operator`` for the console."""
        async with self.dialect.tx(atomic=False) as c:
            await self.dialect.execute(c, "create_api_key", key_hash, tenant_id, hint, now, kind)

    async def api_key(self, key_hash: str) -> ApiKeyInfo | None:
        """The unrevoked key (tenant or operator) of this hash, or None. The faces ask
        through :class:`herald.access.keys.KeyCache`, never here directly."""
        rows = await self.dialect.read("api_key", key_hash)
        return ApiKeyInfo(*rows[0]) if rows else None

    async def list_api_keys(self, tenant_id: str, *, kind: str = "tenant") -> list[ApiKeyInfo]:
        """The tenant's keys of ``kind``, newest first, revoked ones included."""
        rows = await self.dialect.read("list_api_keys", tenant_id, kind)
        return [ApiKeyInfo(*row) for row in rows]

    async def revoke_api_keys(
        self, *, tenant_id: str, hash_prefix: str, now: float, kind: str = "tenant"
    ) -> int:
        """Revoke the tenant's unrevoked keys of ``kind`` whose hash starts with ``hash_prefix``."""
        async with self.dialect.tx(atomic=False) as c:
            return await self.dialect.execute(
                c, "revoke_api_keys", now, tenant_id, len(hash_prefix), hash_prefix, kind
            )

    async def operator_key_revoked(self, key_hash: str) -> bool:
        """Whether the hash is a revoked operator key's (the console's sign-in says so)."""
        return bool(await self.dialect.read("operator_key_revoked", key_hash))

    # --- console sessions -------------------------------------------------
    async def create_console_session(
        self, *, id_hash: str, key_hash: str, now: float, idle_before: float, born_before: float
    ) -> None:
        """Store a new session, and forget those idle since ``idle_before`` or older
        than ``born_before`` (sign-ins are rare enough to sweep on)."""
        d = self.dialect
        async with d.tx() as c:
            await d.execute(c, "console_sessions_expire", idle_before, born_before)
            await d.execute(c, "console_session_create", id_hash, key_hash, now)

    async def get_console_session(self, id_hash: str) -> ConsoleSession | None:
        """A session whose operator key is still unrevoked; expiry is the caller's rule."""
        rows = await self.dialect.read("console_session_get", id_hash)
        return ConsoleSession(str(rows[0][0]), rows[0][1], rows[0][2]) if rows else None

    async def touch_console_session(self, id_hash: str, *, now: float) -> None:
        async with self.dialect.tx(atomic=False) as c:
            await self.dialect.execute(c, "console_session_touch", now, id_hash)

    async def delete_console_session(self, id_hash: str) -> None:
        async with self.dialect.tx(atomic=False) as c:
            await self.dialect.execute(c, "console_session_delete", id_hash)
