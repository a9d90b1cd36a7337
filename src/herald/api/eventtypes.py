"""The /v2 handlers of the tenant's event-type catalog: list, read, put, delete."""

from __future__ import annotations

from aiohttp import web

from herald.api import schemas
from herald.api.base import TENANT, ApiBase
from herald.api.request import json_body, page_limit, query_params
from herald.views import event_type_view


class EventTypeHandlers(ApiBase):
    """``/v2/event-types``."""

    async def list_event_types(self, request: web.Request) -> web.StreamResponse:
        query = query_params(request, {"limit", "cursor"})
        limit = page_limit(query)
        tenant = request[TENANT]
        pages = self._pages(query, endpoint="event_types", filters={"tenant": tenant})
        items, more = await self.service.event_types.list(tenant, after=pages.after, limit=limit)
        views = [event_type_view(e) for e in items]
        return self._page(request, pages, views, more, model=schemas.EventTypeList, key="type")

    async def get_event_type(self, request: web.Request) -> web.StreamResponse:
        query_params(request, set())
        entry = await self.service.event_types.get(request[TENANT], request.match_info["type"])
        return self._respond(schemas.EventType, event_type_view(entry))

    async def put_event_type(self, request: web.Request) -> web.StreamResponse:
        body = await json_body(request, schemas.EventTypePut)
        event_type = request.match_info["type"]
        entry = await self.service.event_types.put(
            request[TENANT], event_type, body.model_dump(exclude_unset=True, by_alias=True)
        )
        self._audit(request, "event_type_put", event_type=entry.type)
        return self._respond(schemas.EventType, event_type_view(entry))

    async def delete_event_type(self, request: web.Request) -> web.StreamResponse:
        entry = await self.service.event_types.delete(request[TENANT], request.match_info["type"])
        self._audit(request, "event_type_deleted", event_type=entry.type)
        return self._respond(schemas.EventType, event_type_view(entry))
