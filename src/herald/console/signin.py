"""The console's door: operators sign in with an operator key and sign out.

A tenant's API key never opens the console. A refused key gets the reason an operator
can act on (``REFUSALS``): not a Herald key, a tenant's key, a revoked operator key,
or an unknown one. Only the last two need the database, and only for a key with the
operator prefix; telling them apart reveals nothing usable, since nobody can guess a
key (256 random bits) to probe with, and a revoked key opens nothing. Failed sign-ins
are held to the API's per-address limit for requests without a valid key."""

from __future__ import annotations

import secrets

import structlog
from aiohttp import web

from herald.access.ratelimit import RateLimiter
from herald.access.sessions import Refusal, Sessions
from herald.config import ConsoleSettings
from herald.console.pages import redirect, render, with_notice
from herald.console.scope import FORM, REQUEST_ID, SCOPE, Scope
from herald.console.session import (
    CSRF_FIELD,
    LOGIN_CSRF_COOKIE,
    SESSION_COOKIE,
    clear_cookie,
    csrf_matches,
    set_cookie,
)

log = structlog.get_logger("herald.console")
audit_log = structlog.get_logger("herald.audit")

PREFIX = "/console"

REFUSALS: dict[Refusal, str] = {
    "not_a_key": (
        "This is not a Herald key: an operator key starts with sk_op_"
        " (herald keys create --operator prints one)."
    ),
    "tenant_key": (
        "This is a tenant's API key. The console opens only with an operator key"
        " (herald keys create --operator)."
    ),
    "revoked": ("This operator key is revoked. Ask for a new one (herald keys create --operator)."),
    "unknown": (
        "This operator key is unknown to this Herald: check that it was copied whole and"
        " made for this database."
    ),
}
"""The sign-in page's words for each refusal."""


class OperatorDoor:
    """Operator sessions (``herald.access.sessions``) as the console's door."""

    public = frozenset({f"{PREFIX}/login"})

    def __init__(
        self,
        sessions: Sessions,
        settings: ConsoleSettings,
        *,
        anonymous: RateLimiter,
    ) -> None:
        self.settings = settings
        self.sessions = sessions
        self.anonymous = anonymous

    async def enter(self, request: web.Request) -> web.StreamResponse | None:
        return None

    async def resolve(self, request: web.Request) -> Scope | None:
        operator = await self.sessions.resolve(request.cookies.get(SESSION_COOKIE))
        if operator is None:
            return None
        return Scope(
            tenant_id=None,
            by=operator.by,
            who=f"key {operator.key_id}",
            csrf=operator.csrf,
            session=operator.session_hash,
        )

    def signed_out(self, request: web.Request) -> web.Response:
        response = redirect(with_notice(f"{PREFIX}/login", "signed_out"))
        clear_cookie(response, SESSION_COOKIE)
        return response

    # --- handlers ---------------------------------------------------------------
    async def login_page(self, request: web.Request) -> web.StreamResponse:
        if await self.resolve(request) is not None:
            return redirect(f"{PREFIX}/")
        return self._login_form(request, error=None, status=200)

    def _login_form(self, request: web.Request, *, error: str | None, status: int) -> web.Response:
        token = secrets.token_urlsafe(24)
        response = render(
            "login.html", request, {"login_csrf": token, "error": error}, status=status
        )
        set_cookie(response, request, self.settings, LOGIN_CSRF_COOKIE, token)
        return response

    async def login(self, request: web.Request) -> web.StreamResponse:
        form = request[FORM]
        if not csrf_matches(request.cookies.get(LOGIN_CSRF_COOKIE, ""), form.get(CSRF_FIELD)):
            return self._login_form(
                request, error="The sign-in form expired; sign in again.", status=403
            )
        address = request.remote or "unknown"
        key = form.get("key", "")
        signed = await self.sessions.sign_in(key)
        if signed is None:
            decision = await self.anonymous.hit(address)
            if not decision.allowed:
                response = self._login_form(
                    request,
                    error=f"Too many failed sign-ins; try again in {decision.reset} s.",
                    status=429,
                )
                response.headers.update(decision.headers)
                return response
            why = await self.sessions.refused(key)
            log.info("console_sign_in_refused", address=address, reason=why)
            return self._login_form(request, error=REFUSALS[why], status=401)
        session_id, key_id = signed
        audit_log.info("console_signed_in", by=f"console:{key_id}", address=address)
        response = redirect(f"{PREFIX}/")
        set_cookie(response, request, self.settings, SESSION_COOKIE, session_id)
        clear_cookie(response, LOGIN_CSRF_COOKIE)
        return response

    async def logout(self, request: web.Request) -> web.StreamResponse:
        scope = request[SCOPE]
        await self.sessions.sign_out(scope.session)
        audit_log.info("console_signed_out", by=scope.by, request_id=request[REQUEST_ID])
        return self.signed_out(request)
