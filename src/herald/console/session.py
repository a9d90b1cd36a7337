"""The web side of sessions: their cookies and CSRF checks (the sessions themselves,
operators' and the portal's, are :mod:`herald.access`).

A session id is 256 random bits, sent only in an HttpOnly, SameSite=Strict cookie
scoped to ``/console`` (Secure over HTTPS, or always with ``console.secure_cookie``).

Every state-changing request carries a CSRF token: for a session, an HMAC of the
session id (:func:`herald.access.sessions.csrf_for`: the page has it, a cross-site
form cannot); before sign-in, a random value held both in a cookie and in the form
(double submit).
"""

from __future__ import annotations

import hmac

from aiohttp import web

from herald.config import ConsoleSettings

SESSION_COOKIE = "herald_console"
LOGIN_CSRF_COOKIE = "herald_console_login"
COOKIE_PATH = "/console"
CSRF_FIELD = "csrf_token"


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
