"""The /v2 REST API: its routes over the handlers of each resource.

Spec 000's conventions (auth, errors, rate limits, pagination, idempotency) are
:mod:`herald.api.base`; the handlers are :mod:`~herald.api.destinations`,
:mod:`~herald.api.deliveries`, :mod:`~herald.api.events` and
:mod:`~herald.api.eventtypes`.
"""

from __future__ import annotations

import functools

from aiohttp import web

from herald.api.base import PREFIX
from herald.api.deliveries import DeliveryHandlers
from herald.api.destinations import DestinationHandlers
from herald.api.events import EventHandlers
from herald.api.eventtypes import EventTypeHandlers
from herald.api.openapi import Served


class Api(DestinationHandlers, DeliveryHandlers, EventHandlers, EventTypeHandlers):
    """Handlers and middlewares bound to one service."""

    def setup(self, app: web.Application) -> None:
        """Route /v2 to the handlers, behind the middlewares."""
        if self.metrics is not None:
            app.middlewares.append(self.measure)
        app.middlewares.append(self.middleware)
        r = app.router
        p = PREFIX
        r.add_get(f"{p}/openapi.json", self.openapi)
        r.add_post(f"{p}/event-destinations", self.create_destination)
        r.add_get(f"{p}/event-destinations", self.list_destinations)
        r.add_get(f"{p}/event-destinations/{{id}}", self.get_destination)
        r.add_patch(f"{p}/event-destinations/{{id}}", self.update_destination)
        r.add_delete(f"{p}/event-destinations/{{id}}", self.delete_destination)
        r.add_post(f"{p}/event-destinations/{{id}}/test", self.test_destination)
        r.add_post(f"{p}/event-destinations/{{id}}/filter/test", self.test_filter)
        r.add_post(f"{p}/event-destinations/{{id}}/verify", self.verify_destination)
        r.add_post(f"{p}/event-destinations/{{id}}/rotate-secret", self.rotate_secret)
        r.add_get(f"{p}/event-destinations/{{id}}/event-deliveries", self.list_deliveries)
        r.add_post(f"{p}/event-destinations/{{id}}/replay", self.replay)
        r.add_get(f"{p}/event-deliveries/{{id}}", self.get_delivery)
        r.add_post(f"{p}/event-deliveries/{{id}}/retry", self.retry_delivery)
        r.add_post(f"{p}/events", self.publish_event)
        r.add_get(f"{p}/events/{{id}}", self.get_event)
        r.add_get(f"{p}/event-types", self.list_event_types)
        r.add_get(f"{p}/event-types/{{type}}", self.get_event_type)
        r.add_put(f"{p}/event-types/{{type}}", self.put_event_type)
        r.add_delete(f"{p}/event-types/{{type}}", self.delete_event_type)
        r.add_get(f"{p}/replays", self.list_replays)
        r.add_get(f"{p}/replays/{{id}}", self.get_replay)
        r.add_post(f"{p}/token", self.create_token)

    # --- docs -----------------------------------------------------------------
    @functools.cached_property
    def _openapi(self) -> Served:
        return Served.build(self.models)

    async def openapi(self, request: web.Request) -> web.StreamResponse:
        """The OpenAPI document: no key needed, counted per client address (the
        middleware), and 304 to a client that already holds this version."""
        served = self._openapi
        headers = {"ETag": served.etag, "Cache-Control": "no-cache"}
        if served.matches(request.headers.get("If-None-Match", "")):
            return web.Response(status=304, headers=headers)
        return web.Response(body=served.body, content_type="application/json", headers=headers)
