"""What every page handler shares: rendering, links under the face's prefix, redirects
with a fixed notice, the filtered list page and the audit line of a change."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any, TypeVar
from urllib.parse import quote, urlencode

import aiohttp_jinja2
import orjson
from aiohttp import web

from herald.api.ratelimit import Decision
from herald.audit import audit
from herald.console.scope import FACE, NONCE, REQUEST_ID, SCOPE, Scope
from herald.console.session import CSRF_FIELD
from herald.service import DestinationService

PAGE_SIZE = 50

NOTICES = {
    "retried": "The delivery was re-queued; it is attempted now.",
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


def redirect(location: str) -> web.Response:
    return web.Response(status=303, headers={"Location": location})


def with_notice(path: str, notice: str) -> str:
    return f"{path}?{urlencode({'notice': notice})}"


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

    def __init__(self, service: DestinationService, *, wake: Callable[[], None]) -> None:
        self.service = service
        self.registry = service.registry
        self.wake = wake

    @staticmethod
    def scope(request: web.Request) -> Scope:
        return request[SCOPE]

    @staticmethod
    def audit(request: web.Request, action: str, *, tenant_id: str, **fields: Any) -> None:
        """The audit line of a change, the same the CLI and the API write."""
        by = request[SCOPE].by
        audit(action, by=by, tenant_id=tenant_id, request_id=request[REQUEST_ID], **fields)

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
