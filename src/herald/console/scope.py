"""Who a page acts for: the face it is served under, and the scope of a signed-in request.

The console and the portal are one UI. A ``Face`` is where it is mounted and what
that mount may show (the console sees every tenant and the rejected outbox rows; the
portal one tenant). A ``Scope`` is one signed-in request's reach: every handler
takes the tenant from it, never from the query string, unless the scope is an
operator's (``tenant_id`` None), whose lists take a tenant filter.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web


@dataclass(frozen=True, slots=True)
class Brand:
    """How a face presents itself: the portal's are the operator's settings
    (``console.portal_name``, ``portal_logo_url``, ``portal_accent_color``), checked at
    config load; the console is always Herald's."""

    name: str = "Herald"
    logo: str | None = None
    """A same-origin path or an image ``data:`` URL."""
    accent: str | None = None
    """``#rgb`` or ``#rrggbb``, set in a nonce'd ``<style>`` of each page."""


@dataclass(frozen=True, slots=True)
class Face:
    """One mount of the UI: ``/console`` for operators, ``/portal`` for one tenant."""

    name: str
    prefix: str
    every_tenant: bool
    """Operators: lists of every tenant (with a tenant filter), the rejected outbox rows."""
    cookie: str
    """The session cookie's name (scoped to ``prefix``)."""
    frame_ancestors: tuple[str, ...] = ()
    """Origins that may frame these pages; none: the pages can never be framed."""
    brand: Brand = Brand()

    def csp(self, nonce: str) -> str:
        """The Content-Security-Policy of every page: no inline script or style without
        the response's nonce, no eval, nothing from elsewhere (but a ``data:`` logo),
        framing as configured."""
        frame = " ".join(self.frame_ancestors) if self.frame_ancestors else "'none'"
        style = f" 'nonce-{nonce}'" if self.brand.accent else ""
        img = " data:" if self.brand.logo and self.brand.logo.startswith("data:") else ""
        return (
            "default-src 'none'; "
            f"script-src 'self' 'nonce-{nonce}'; "
            f"style-src 'self'{style}; img-src 'self'{img}; connect-src 'self'; "
            f"form-action 'self'; base-uri 'none'; frame-ancestors {frame}"
        )

    @property
    def framable(self) -> bool:
        return bool(self.frame_ancestors)


@dataclass(frozen=True, slots=True)
class Scope:
    """What a signed-in request may see and change, and who it is in the audit log."""

    tenant_id: str | None
    """The one tenant of a portal session; None for an operator (every tenant)."""
    by: str
    """The audit actor: ``console:<key id>`` or ``portal:<tenant>``."""
    who: str
    """How the page names who is signed in."""
    csrf: str
    """The session's CSRF token, which every form posts back."""
    session: str
    """What ends the session at sign-out (the door that opened it knows what it is)."""

    def tenant(self, asked: str | None) -> str | None:
        """The tenant a list or lookup is for: a portal session's own, whatever was
        asked; for an operator what the tenant filter asked (None: every tenant)."""
        if self.tenant_id is not None:
            return self.tenant_id
        return (asked or "").strip() or None


SCOPE = web.RequestKey("console_scope", Scope)
NONCE = web.RequestKey("console_nonce", str)
REQUEST_ID = web.RequestKey("console_request_id", str)
FORM = web.RequestKey("console_form", dict)
FACE = web.AppKey("console_face", Face)
