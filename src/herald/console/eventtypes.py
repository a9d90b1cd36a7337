"""The event-type catalog's page: the types of one tenant (the portal's own; the
console's tenant filter, ``default`` when none), each with its description, its JSON
Schema and an example payload when the schema gives one (``examples``)."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from herald.console.pages import Pages, render
from herald.model import DEFAULT_TENANT
from herald.views import event_type_view

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
