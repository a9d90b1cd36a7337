"""The portal's door: a tenant's product opens ``/portal/…?token=tk_…`` (top-level or in
an iframe) with a token from ``POST /v2/token``.

The token is traded at once for a portal session (``herald.access.tokens``): the answer
sets the session cookie and redirects to the same address without the token, so
the token never stays in a URL, a page or a log line (the access line logs the
path alone, and every page says ``Referrer-Policy: no-referrer``). Every portal
request opens the session through ``Tokens.open_session``, which extends it; the
session sees only its tenant. Sign-out ends the session and its token.

The cookie is HttpOnly and SameSite=Strict like the console's, unless
``console.portal_frame_ancestors`` lets other sites frame the portal: a Strict
cookie is never sent inside a cross-site frame, so it is then SameSite=None,
Secure and Partitioned (see ``herald.console.session.set_cookie``).
"""

from __future__ import annotations

from urllib.parse import urlencode

import structlog
from aiohttp import web

from herald.access.ratelimit import RateLimiter
from herald.access.sessions import csrf_for
from herald.access.tokens import TokenRefused, Tokens
from herald.config import ConsoleSettings
from herald.console.pages import limited, redirect, render, with_notice
from herald.console.scope import REQUEST_ID, SCOPE, Brand, Face, Scope
from herald.console.session import clear_cookie, set_cookie

audit_log = structlog.get_logger("herald.audit")

PREFIX = "/portal"
COOKIE = "herald_portal"
TOKEN_PARAM = "token"
REFUSALS = {
    "token_invalid": "the token is not valid",
    "token_expired": "the token has expired",
    "token_revoked": "the token was revoked",
    "token_used": "the token was already exchanged for a portal session",
}
"""Why a token did not open the portal (``TokenRefused.code``), as the landing page
says it: fixed texts, never the URL's words."""


def portal_face(settings: ConsoleSettings) -> Face:
    return Face(
        name="portal",
        prefix=PREFIX,
        every_tenant=False,
        cookie=COOKIE,
        frame_ancestors=settings.portal_frame_ancestors,
        brand=Brand(
            name=settings.portal_name,
            logo=settings.portal_logo_url,
            accent=settings.portal_accent_color,
        ),
    )


class PortalDoor:
    """Session tokens as the portal's door."""

    public = frozenset({f"{PREFIX}/login"})

    def __init__(
        self, tokens: Tokens, settings: ConsoleSettings, *, anonymous: RateLimiter
    ) -> None:
        self.tokens = tokens
        self.settings = settings
        self.anonymous = anonymous
        self.cross_site = bool(settings.portal_frame_ancestors)

    async def enter(self, request: web.Request) -> web.StreamResponse | None:
        """Trade a ``token`` query parameter for a session, and send the browser back
        to the same address without it. Only a GET spends it (a HEAD from a link
        checker does not); a refused token counts like a request without a valid key."""
        token = request.query.get(TOKEN_PARAM)
        if token is None or request.method != "GET":
            return None
        kept = [(k, v) for k, v in request.query.items() if k != TOKEN_PARAM]
        try:
            portal = await self.tokens.trade(token)
        except TokenRefused as exc:
            decision = await self.anonymous.hit(request.remote or "unknown")
            if not decision.allowed:
                return limited(request, decision, "Too many refused tokens")
            # Away from the token's URL too; the landing page says why.
            return redirect(f"{PREFIX}/login?{urlencode({'refused': exc.code})}")
        tenant = portal.scope.tenant_id
        audit_log.info(
            "portal_signed_in",
            by=f"portal:{tenant}",
            tenant_id=tenant,
            token_id=portal.scope.token_id,
            request_id=request[REQUEST_ID],
        )
        # The path as sent, still percent-encoded: decoded, a %3F would start a query.
        path = request.rel_url.raw_path
        response = redirect(path + (f"?{urlencode(kept)}" if kept else ""))
        set_cookie(
            response,
            request,
            self.settings,
            COOKIE,
            portal.secret,
            path=PREFIX,
            cross_site=self.cross_site,
        )
        return response

    async def resolve(self, request: web.Request) -> Scope | None:
        secret = request.cookies.get(COOKIE)
        if not secret:
            return None
        try:
            opened = await self.tokens.open_session(secret)
        except TokenRefused:
            return None
        tenant = opened.tenant_id
        return Scope(
            tenant_id=tenant,
            by=f"portal:{tenant}",
            who=self.settings.tenant_names.get(tenant) or f"tenant {tenant}",
            csrf=csrf_for(secret),
            session=secret,
        )

    def signed_out(self, request: web.Request) -> web.Response:
        response = redirect(with_notice(f"{PREFIX}/login", "signed_out"))
        clear_cookie(response, COOKIE, path=PREFIX, cross_site=self.cross_site)
        return response

    # --- handlers ---------------------------------------------------------------
    async def login_page(self, request: web.Request) -> web.StreamResponse:
        """Where a request without a session lands (401 after a refused token, saying
        why): the portal opens only from the tenant's product, with a new token."""
        if await self.resolve(request) is not None:
            return redirect(f"{PREFIX}/")
        reason = REFUSALS.get(request.query.get("refused", ""))
        status = 200 if reason is None else 401
        return render("portal_closed.html", request, {"reason": reason}, status=status)

    async def logout(self, request: web.Request) -> web.StreamResponse:
        scope = request[SCOPE]
        await self.tokens.close_session(scope.session)
        tenant = scope.tenant_id or ""
        audit_log.info(
            "portal_signed_out", by=scope.by, tenant_id=tenant, request_id=request[REQUEST_ID]
        )
        return self.signed_out(request)
