"""The event-type catalog's page: the types of one tenant (the portal's own; the
console's tenant filter, ``default`` when none), each with its description, its JSON
Schema and an example payload when the schema gives one (``examples``); and a
destination's payload filter tried on the newest events of its types (a GET: nothing
changes, the filter to try is in the query string)."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from herald.console.pages import Pages, render
from herald.errors import HeraldError
from herald.model import DEFAULT_TENANT
from herald.views import event_type_view, filter_test_view

_SHOWN = 200
"""Event types on the page (the catalog's first, in type order)."""


def _pretty(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()


class EventTypePages(Pages):
    """``/event-types``."""

    async def list(self, request: web.Request) -> web.StreamResponse:
        asked = request.query.get("tenant", "").strip()
        tenant = self.scope(request).tenant(asked or None) or DEFAULT_TENANT
        entries, more = await self.service.event_types.list(tenant, limit=_SHOWN)
        items = []
        for entry in entries:
            view = event_type_view(entry)
            examples = (entry.schema or {}).get("examples")
            example = examples[0] if isinstance(examples, list) and examples else None
            items.append(
                {
                    **view,
                    "schema_text": None if entry.schema is None else _pretty(entry.schema),
                    "example_text": None if example is None else _pretty(example),
                }
            )
        context = {"tenant": tenant, "items": items, "more": more, "shown": _SHOWN}
        return render("event_types.html", request, context)

    async def filter_test(self, request: web.Request) -> web.StreamResponse:
        """``/destinations/{id}/filter[?filter=JSON]``: which of the newest events of the
        destination's types pass the filter given (its own when none; empty: none)."""
        dest = await self.service.get(self.scope(request).tenant_id, request.match_info["id"])
        given = request.query.get("filter")
        shown = (
            given if given is not None else ("" if dest.filter is None else _pretty(dest.filter))
        )
        error = None
        tried = None
        try:
            body = (
                {} if given is None else {"filter": orjson.loads(given) if given.strip() else None}
            )
            spec, results = await self.service.test_filter(dest.tenant_id, dest.id, body)
            tried = filter_test_view(spec, results)
        except orjson.JSONDecodeError as exc:
            error = f"filter: not JSON ({exc})"
        except HeraldError as exc:
            error = f"{exc.field}: {exc.message}" if exc.field else exc.message
        context = {"dest": dest, "filter_text": shown, "error": error, "tried": tried}
        return render("destination_filter.html", request, context, status=422 if error else 200)
