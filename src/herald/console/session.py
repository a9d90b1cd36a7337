"""Console sign-in: operator keys, server-side sessions, CSRF tokens.

A session id is 256 random bits, sent only in an HttpOnly, SameSite=Strict cookie
scoped to ``/console`` (Secure over HTTPS, or always with ``console.secure_cookie``).
The database holds its SHA-256, the operator key's hash and two times; a session
ends ``console.session_idle_minutes`` after its last request, ``session_max_hours``
after sign-in, at sign-out, or when its operator key is revoked.

Every state-changing request carries a CSRF token: for a session, an HMAC of the
session id (the page has it, a cross-site form cannot); before sign-in, a random
value held both in a cookie and in the form (double submit).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass
from typing import Literal

from aiohttp import web

from herald.apikeys import (
    API_KEY_PREFIX,
    OPERATOR_KEY_PREFIX,
    OPERATOR_KIND,
    KeyCache,
    hash_api_key,
    key_id,
)
from herald.config import ConsoleSettings
from herald.store import Store
from herald.store.base import ApiKeyInfo

SESSION_COOKIE = "herald_console"
LOGIN_CSRF_COOKIE = "herald_console_login"
COOKIE_PATH = "/console"
CSRF_FIELD = "csrf_token"
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


def csrf_matches(expected: str, given: object) -> bool:
    return isinstance(given, str) and hmac.compare_digest(expected.encode(), given.encode())


def secure(request: web.Request, settings: ConsoleSettings) -> bool:
    return settings.secure_cookie or request.secure


def set_cookie(
    response: web.StreamResponse,
    request: web.Request,
    settings: ConsoleSettings,
    name: str,
    value: str,
    *,
    path: str = COOKIE_PATH,
    cross_site: bool = False,
) -> None:
    """An HttpOnly cookie under ``path``: SameSite=Strict, or, ``cross_site`` (a portal
    framed by another site, whose frames a Strict cookie never reaches),
    SameSite=None, which browsers take only Secure, and Partitioned, so that it is kept
    for the framing site alone and browsers that block third-party cookies keep it."""
    if cross_site:
        _partitioned(response, name, value, path=path)
        return
    response.set_cookie(
        name, value, path=path, httponly=True, samesite="Strict", secure=secure(request, settings)
    )


def clear_cookie(
    response: web.StreamResponse, name: str, *, path: str = COOKIE_PATH, cross_site: bool = False
) -> None:
    if cross_site:
        # A partitioned cookie is only reached by a Set-Cookie that is partitioned too.
        _partitioned(response, name, "", path=path, expired=True)
    else:
        response.del_cookie(name, path=path)


def _partitioned(
    response: web.StreamResponse, name: str, value: str, *, path: str, expired: bool = False
) -> None:
    """Written out: Python's http.cookies knows no Partitioned attribute before 3.14.
    ``value`` is URL-safe base64 (a secret Herald made), so it needs no quoting."""
    end = "; Max-Age=0; Expires=Thu, 01 Jan 1970 00:00:00 GMT" if expired else ""
    response.headers.add(
        "Set-Cookie",
        f"{name}={value}; Path={path}; HttpOnly; SameSite=None; Secure; Partitioned{end}",
    )


class Sessions:
    """Operator sessions, stored by the hash of their id."""

    def __init__(
        self, store: Store, settings: ConsoleSettings, *, keys: KeyCache[ApiKeyInfo]
    ) -> None:
        self.store = store
        self.keys = keys
        """The process's one key lookup, the API's too (``herald.apikeys.KeyCache``)."""
        self.idle = settings.session_idle_minutes * 60
        self.lifetime = settings.session_max_hours * 3600

    async def sign_in(self, key: str) -> tuple[str, str] | None:
        """A new session for an unrevoked operator key: (session id, key id); None when
        the key is no operator key."""
        key = key.strip()
        if not key or len(key) > MAX_KEY_LENGTH or not key.isascii():
            return None
        key_hash = hash_api_key(key)
        found = await self.keys.get(key_hash)
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
        if await self.store.operator_key_revoked(hash_api_key(key)):
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
