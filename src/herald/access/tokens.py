"""Session tokens (spec 000): ``POST /v2/token`` makes one for the tenant of the API key
that asks, and the tenant portal opens with it.

A token is a record (``tok_…``) and a secret value (``tk_…``) of which only the
SHA-256 is stored. It expires ``IDLE_SECONDS`` after its last use; each use moves
the expiry to ``IDLE_SECONDS`` from then, never past ``LIFETIME_SECONDS`` after it
was made. Revoking the API key that made it ends it.

The portal trades the ``tk_`` value (which travelled in a URL) for a portal
session once: the value is spent, and a new secret (``tks_…``, also stored as a
hash only) opens the same record from then on, for a cookie. Each open is one
UPDATE that checks and extends in the same statement, so several instances on
one PostgreSQL database cannot lose an extension or revive an expired token.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import structlog

from herald.access.keys import hash_api_key
from herald.errors import HeraldError
from herald.ids import new_id
from herald.store import Store
from herald.store.base import TokenRow

IDLE_SECONDS = 30 * 60
LIFETIME_SECONDS = 24 * 3600
TOKEN_PREFIX = "tk_"
SESSION_PREFIX = "tks_"
_SECRET = re.compile(r"[A-Za-z0-9_-]{43}")

log = structlog.get_logger("herald.tokens")


class TokenRefused(HeraldError, code="token_invalid", type="auth", status=401):
    """A session token or portal session that does not open: ``code`` says why —
    ``token_invalid`` (unknown or malformed), ``token_expired``, ``token_revoked``
    (signed out, or its API key revoked) or ``token_used`` (already traded)."""


@dataclass(frozen=True, slots=True)
class TokenScope:
    """What an open token grants: one tenant, until ``expires_at`` (as extended now)."""

    token_id: str
    tenant_id: str
    created_at: float
    expires_at: float


@dataclass(frozen=True, slots=True)
class IssuedToken:
    """A token as ``POST /v2/token`` answers it: the only time its value is seen."""

    id: str
    tenant_id: str
    token: str
    created_at: float
    expires_at: float


@dataclass(frozen=True, slots=True)
class PortalSession:
    """A token traded for a portal session: ``secret`` goes into the cookie."""

    secret: str
    scope: TokenScope


def _scope(row: TokenRow) -> TokenScope:
    return TokenScope(row.id, row.tenant_id, row.created_at, row.expires_at)


def _new_secret(prefix: str) -> str:
    return prefix + secrets.token_urlsafe(32)  # 43 characters of 256 random bits


def _digest(value: str, prefix: str) -> str:
    """The stored hash of a value, or TokenRefused if it cannot be one Herald made."""
    if not (value.startswith(prefix) and _SECRET.fullmatch(value[len(prefix) :])):
        raise TokenRefused("the token is not valid")
    return hash_api_key(value)


class Tokens:
    """The lifecycle of session tokens, over the store. ``clock`` is the time source
    (tests move it; several instances share the database's rows, not a clock)."""

    def __init__(self, store: Store, *, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock

    async def create(self, tenant_id: str, *, key_hash: str) -> IssuedToken:
        """A new token for ``tenant_id``, made with the API key whose hash is ``key_hash``."""
        now = self.clock()
        value = _new_secret(TOKEN_PREFIX)
        token_id = new_id("tok_")
        expires_at = now + IDLE_SECONDS
        await self.store.create_token(
            id=token_id,
            tenant_id=tenant_id,
            token_hash=hash_api_key(value),
            key_hash=key_hash,
            now=now,
            expires_at=expires_at,
        )
        return IssuedToken(token_id, tenant_id, value, now, expires_at)

    async def reissue(self, tenant_id: str, token_id: str) -> IssuedToken | None:
        """A new value for a token not yet traded, expired or revoked (the old value
        stops working); None otherwise. For an idempotent ``POST /v2/token`` repeated:
        the first answer's value was never stored, so it cannot be answered again."""
        value = _new_secret(TOKEN_PREFIX)
        row = await self.store.reissue_token(
            tenant_id=tenant_id, token_id=token_id, token_hash=hash_api_key(value), now=self.clock()
        )
        if row is None:
            return None
        return IssuedToken(row.id, row.tenant_id, value, row.created_at, row.expires_at)

    async def open_token(self, token: str) -> TokenScope:
        """The scope of a ``tk_`` value not yet traded, its expiry extended; TokenRefused
        otherwise."""
        return _scope(await self._open("token", token))

    async def trade(self, token: str) -> PortalSession:
        """Spend a ``tk_`` value for a portal session: once only, and extending the
        token like any use. The session secret opens it from then on."""
        secret = _new_secret(SESSION_PREFIX)
        row = await self._open("trade", token, session_hash=hash_api_key(secret))
        log.info("token_traded", token_id=row.id, tenant_id=row.tenant_id)
        return PortalSession(secret, _scope(row))

    async def open_session(self, secret: str) -> TokenScope:
        """The scope of a portal session (each portal request), its expiry extended."""
        return _scope(await self._open("session", secret))

    async def close_session(self, secret: str) -> bool:
        """Sign out: the session and its token end now. False if it was not open."""
        try:
            digest = _digest(secret, SESSION_PREFIX)
        except TokenRefused:
            return False
        return await self.store.close_session(digest, now=self.clock())

    async def _open(
        self,
        how: Literal["token", "trade", "session"],
        value: str,
        *,
        session_hash: str | None = None,
    ) -> TokenRow:
        """Use a ``tk_`` value (``token``; ``trade`` also stores ``session_hash``) or a
        session's secret (``session``), extending its expiry; TokenRefused saying why
        when it does not open."""
        session = how == "session"
        digest = _digest(value, SESSION_PREFIX if session else TOKEN_PREFIX)
        row = await self.store.use_token(
            how,
            digest,
            now=self.clock(),
            idle=IDLE_SECONDS,
            lifetime=LIFETIME_SECONDS,
            session_hash=session_hash,
        )
        if row is None:
            raise await self._refusal(digest, session=session)
        return row

    async def _refusal(self, digest: str, *, session: bool) -> TokenRefused:
        state = await self.store.token_state(digest, session=session)
        if state is None:
            return TokenRefused("the token is not valid")
        if state.revoked_at is not None or state.key_revoked_at is not None:
            return TokenRefused("the token was revoked", code="token_revoked")
        if not session and state.traded_at is not None:
            return TokenRefused(
                "the token was already exchanged for a portal session", code="token_used"
            )
        return TokenRefused("the token has expired", code="token_expired")
