"""Operator sessions: an operator key signs in, a server-side session opens the console.

The database holds a session id's SHA-256, the operator key's hash and two times; a
session ends ``console.session_idle_minutes`` after its last request,
``session_max_hours`` after sign-in, at sign-out, or when its operator key is revoked
(its lookup joins the key's row, so at once). The cookie that carries the id and the
CSRF checks are the console's (:mod:`herald.console.session`).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass
from typing import Literal

from herald.access.keys import (
    API_KEY_PREFIX,
    OPERATOR_KEY_PREFIX,
    OPERATOR_KIND,
    Keys,
    hash_api_key,
    key_id,
)
from herald.config import ConsoleSettings
from herald.store import Store

TOUCH_EVERY_SECONDS = 30.0
"""A session's last use is written at most this often: not one write per page."""
MAX_KEY_LENGTH = 256
OPERATOR_KEY = re.compile(re.escape(OPERATOR_KEY_PREFIX) + r"[A-Za-z0-9_-]{1,192}")
"""What an operator key can look like (``herald keys create --operator``)."""

Refusal = Literal["not_a_key", "tenant_key", "revoked", "unknown"]
"""Why a sign-in was refused (``Sessions.refused``)."""


@dataclass(frozen=True, slots=True)
class Operator:
    """Who a signed-in request is: the operator key's id and the session's CSRF token."""

    key_id: str
    csrf: str
    session_hash: str

    @property
    def by(self) -> str:
        """What audit lines name as the actor."""
        return f"console:{self.key_id}"


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def csrf_for(session_id: str) -> str:
    """The CSRF token of a session: derived, so nothing more is stored."""
    return hmac.new(session_id.encode(), b"herald console csrf", hashlib.sha256).hexdigest()


class Sessions:
    """Operator sessions, stored by the hash of their id."""

    def __init__(self, store: Store, settings: ConsoleSettings, *, keys: Keys) -> None:
        self.store = store
        self.keys = keys
        """The process's keys: the one key lookup, the API's too (:class:`Keys`)."""
        self.idle = settings.session_idle_minutes * 60
        self.lifetime = settings.session_max_hours * 3600

    async def sign_in(self, key: str) -> tuple[str, str] | None:
        """A new session for an unrevoked operator key: (session id, key id); None when
        the key is no operator key."""
        key = key.strip()
        if not key or len(key) > MAX_KEY_LENGTH or not key.isascii():
            return None
        key_hash = hash_api_key(key)
        # Read, not remembered: a key revoked a moment ago would open a session that
        # its very next page ends (sessions are looked up with their key), with no word
        # of why; a sign-in is rare enough to cost one read.
        found = await self.keys.lookup(key_hash, fresh=True)
        if found is None or found.kind != OPERATOR_KIND:
            return None
        session_id = secrets.token_urlsafe(32)
        now = time.time()
        await self.store.create_console_session(
            id_hash=_digest(session_id),
            key_hash=key_hash,
            now=now,
            idle_before=now - self.idle,
            born_before=now - self.lifetime,
        )
        return session_id, key_id(key_hash)

    async def refused(self, key: str) -> Refusal:
        """Why ``sign_in`` refused ``key``, in what an operator can act on. Only a key
        with the operator prefix is looked up (is it revoked?): the rest is read off the
        key itself, so the page tells nothing the key's holder could not already know."""
        key = key.strip()
        if key.startswith(API_KEY_PREFIX):
            return "tenant_key"
        if not OPERATOR_KEY.fullmatch(key):
            return "not_a_key"
        if await self.keys.operator_key_revoked(hash_api_key(key)):
            return "revoked"
        return "unknown"

    async def resolve(self, session_id: str | None) -> Operator | None:
        """The operator of a live session; None for no, an expired or a revoked one."""
        if not session_id or len(session_id) > 128:
            return None
        id_hash = _digest(session_id)
        found = await self.store.get_console_session(id_hash)
        if found is None:
            return None
        now = time.time()
        if now - found.last_seen > self.idle or now - found.created_at > self.lifetime:
            await self.store.delete_console_session(id_hash)
            return None
        if now - found.last_seen > TOUCH_EVERY_SECONDS:
            await self.store.touch_console_session(id_hash, now=now)
        return Operator(key_id(found.key_hash), csrf_for(session_id), id_hash)

    async def sign_out(self, session_hash: str) -> None:
        await self.store.delete_console_session(session_hash)
