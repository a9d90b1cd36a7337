"""What every page handler shares: rendering, links under the face's prefix, redirects
with a fixed notice, the filtered list page and the audit line of a change."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from enum import Enum
from typing import Any, TypeVar
from urllib.parse import quote, urlencode

import aiohttp_jinja2
import jinja2
import orjson
from aiohttp import web
from markupsafe import Markup, escape

from herald.access.ratelimit import Decision
from herald.audit import audit
from herald.console.scope import FACE, NONCE, REQUEST_ID, SCOPE, Scope
from herald.console.session import CSRF_FIELD
from herald.errors import NotFound
from herald.model import Delivery
from herald.service import Operations
from herald.timeutil import format_epoch, parse_timestamp
from herald.views import delivery_view

PAGE_SIZE = 50

NOTICES = {
    "paused": "The destination is paused: its deliveries are held until it is resumed.",
    "resumed": "The destination is active again: its held deliveries are due now.",
    "deleted": "The destination was deleted; its pending deliveries ended as failures.",
    "saved": "Saved.",
    "verifying": "A verification ping was sent; the destination is pending until it succeeds.",
    "created": "Created. A verification ping was sent; it becomes active when it succeeds.",
    "signed_out": "You are signed out.",
    "ended": "Your session has ended.",
}
"""What a redirect's ``notice`` parameter may show: fixed texts, never the URL's words."""


def path_segment(value: str) -> str:
    """A value quoted to stand as one path segment of a link."""
    return quote(value, safe="")


NEAR_SECONDS = 86_400
"""Times within a day of now read relative ("3 min ago", "in 25 s"); others absolute."""


def relative(at: float, now: float) -> str:
    """``at`` as people say it from ``now``: "just now", "25 s ago", "in 3 min", "2 h 5 min
    ago"; past a day, the absolute UTC time to the minute."""
    delta = at - now
    span = abs(delta)
    if span >= NEAR_SECONDS:
        return format_epoch(at)[:16].replace("T", " ") + " UTC"
    if span < 1:
        return "just now"
    if span < 60:
        text = f"{span:.0f} s"
    elif span < 3600:
        text = f"{span // 60:.0f} min"
    else:
        hours, minutes = divmod(int(span // 60), 60)
        text = f"{hours} h {minutes} min" if minutes else f"{hours} h"
    return f"in {text}" if delta > 0 else f"{text} ago"


def epoch_of(value: float | str | None) -> float | None:
    """Epoch seconds of a time as the views give it (RFC 3339) or as stored (a float)."""
    if value is None or value == "":
        return None
    if isinstance(value, int | float):
        return float(value)
    try:
        return parse_timestamp(value).epoch
    except ValueError:
        return None


@jinja2.pass_context
def when(context: jinja2.runtime.Context, value: float | str | None) -> str:
    """The one time format of every page: a ``<time>`` reading relative to the page's
    ``now`` (absolute past a day), the exact UTC time in its title (shown on hover);
    "–" for no time. Text that is not a time is shown as it is."""
    at = epoch_of(value)
    if at is None:
        return Markup("–") if not value else escape(value)
    exact = format_epoch(at)
    return Markup('<time datetime="{0}" title="{0}">{1}</time>').format(
        exact, relative(at, float(context.get("now") or time.time()))
    )


def redirect(location: str) -> web.Response:
    return web.Response(status=303, headers={"Location": location})


def with_notice(path: str, notice: str) -> str:
    return f"{path}?{urlencode({'notice': notice})}"


FLASH_SECONDS = 600
"""How long a flash waits for the page that reads it (a retry's outcome, a new secret)."""


def _flash_cookie(request: web.Request) -> str:
    return f"{request.app[FACE].cookie}_flash"


def set_flash(request: web.Request, response: web.StreamResponse, kind: str, value: str) -> None:
    """A one-time word from an action to the page its redirect leads to: ``kind:value``
    in a cookie of the face's path, read by :func:`flashed`, ended by
    :func:`clear_flash`. ``value`` is URL-safe (ids, counts, hex), never a secret."""
    face = request.app[FACE]
    text = f"{kind}:{value}"
    if face.framable:  # a framed portal: only a partitioned SameSite=None cookie arrives
        response.headers.add(
            "Set-Cookie",
            f"{_flash_cookie(request)}={text}; Path={face.prefix}; Max-Age={FLASH_SECONDS};"
            " HttpOnly; SameSite=None; Secure; Partitioned",
        )
        return
    response.set_cookie(
        _flash_cookie(request),
        text,
        path=face.prefix,
        max_age=FLASH_SECONDS,
        httponly=True,
        samesite="Strict",
        secure=request.secure,
    )


def flashed(request: web.Request, kind: str) -> str | None:
    """The value of the request's flash of ``kind``, or None."""
    got, colon, value = request.cookies.get(_flash_cookie(request), "").partition(":")
    return value if colon and got == kind else None


def clear_flash(request: web.Request, response: web.StreamResponse) -> None:
    face = request.app[FACE]
    if face.framable:
        response.headers.add(
            "Set-Cookie",
            f"{_flash_cookie(request)}=; Path={face.prefix}; Max-Age=0;"
            " HttpOnly; SameSite=None; Secure; Partitioned",
        )
        return
    response.del_cookie(_flash_cookie(request), path=face.prefix)


def elapsed_ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)


def pretty(data: bytes) -> str:
    try:
        return orjson.dumps(orjson.loads(data), option=orjson.OPT_INDENT_2).decode()
    except orjson.JSONDecodeError:
        return data.decode(errors="replace")


E = TypeVar("E", bound=Enum)


def choice(
    kind: type[E], filters: Mapping[str, str], errors: dict[str, str], message: str
) -> E | None:
    """The ``status`` filter as ``kind``: None when empty; ``message`` in ``errors``
    (beside the field) when it is none of the listed values."""
    if not filters["status"]:
        return None
    try:
        return kind(filters["status"])
    except ValueError:
        errors["status"] = message
        return None


def base(request: web.Request) -> str:
    """The prefix of the face serving ``request`` (``/console`` or ``/portal``)."""
    return request.app[FACE].prefix


def page_context(request: web.Request) -> dict[str, Any]:
    """What every template may use (given by ``render``, also to the middleware's
    pages, which aiohttp_jinja2's context processors would not reach)."""
    scope = request.get(SCOPE)
    face = request.app[FACE]
    return {
        "scope": scope,
        "face": face,
        "base": face.prefix,
        "every_tenant": face.every_tenant,
        "csrf_field": CSRF_FIELD,
        "csrf": scope.csrf if scope else "",
        "nonce": request[NONCE],
        "path": request.path,
        "notice": NOTICES.get(request.query.get("notice", "")),
        "now": time.time(),
    }


def render(
    name: str, request: web.Request, context: Mapping[str, Any], *, status: int = 200
) -> web.Response:
    return aiohttp_jinja2.render_template(
        name, request, {**page_context(request), **context}, status=status
    )


def error_page(request: web.Request, status: int, message: str) -> web.Response:
    return render("error.html", request, {"status": status, "message": message}, status=status)


def limited(request: web.Request, decision: Decision, what: str) -> web.Response:
    """The 429 page, with the rate limit's headers."""
    response = error_page(request, 429, f"{what}; try again in {decision.reset} s.")
    response.headers.update(decision.headers)
    return response


class Pages:
    """Handlers bound to the service layer; a handler reads the request, calls one
    service operation for the request's scope and renders the answer."""

    def __init__(self, service: Operations) -> None:
        self.service = service
        self.registry = service.registry

    @staticmethod
    def scope(request: web.Request) -> Scope:
        return request[SCOPE]

    @staticmethod
    def audit(request: web.Request, action: str, *, tenant_id: str, **fields: Any) -> None:
        """The audit line of a change, the same the CLI and the API write."""
        by = request[SCOPE].by
        audit(action, by=by, tenant_id=tenant_id, request_id=request[REQUEST_ID], **fields)

    async def destination_names(self, tenant_id: str | None, ids: Iterable[str]) -> dict[str, str]:
        """Destination id -> name, within ``tenant_id`` (every tenant when None); a
        deleted destination keeps its name, an id not found is left out."""
        names: dict[str, str] = {}
        for dest_id in dict.fromkeys(ids):
            try:
                names[dest_id] = (await self.service.get(tenant_id, dest_id, deleted=True)).name
            except NotFound:
                continue
        return names

    @staticmethod
    def delivery_item(
        d: Delivery, names: Mapping[str, str], *, with_attempts: bool = False
    ) -> dict[str, Any]:
        """A delivery as the pages show it: its view, its tenant, its destination's name,
        and its next attempt (None while it is leased: then it is being attempted; ``due``
        once its time has come)."""
        view = delivery_view(d, with_attempts=with_attempts)
        return {
            **view,
            "tenant_id": d.tenant_id,
            "destination_name": names.get(d.destination_id),
            "leased": d.leased,
            "next_attempt": None if d.leased or d.held else view["next_attempt_at"],
            "due": d.next_attempt_at is not None and d.next_attempt_at <= time.time(),
        }

    @staticmethod
    def list_page(
        request: web.Request,
        name: str,
        filters: dict[str, str],
        errors: dict[str, str],
        items: list[dict[str, Any]],
        more: bool,
        **extra: Any,
    ) -> web.Response:
        """A filtered list page; its next page keeps the filters and starts past the
        last item shown (ids order the lists, newest first)."""
        next_url = None
        if more and items:
            kept = {k: v for k, v in filters.items() if v}
            next_url = f"{base(request)}/{name}?{urlencode({**kept, 'cursor': items[-1]['id']})}"
        context = {"filters": filters, "errors": errors, "items": items, "next_url": next_url}
        return render(f"{name}.html", request, {**context, **extra}, status=400 if errors else 200)
