"""The /v2 handlers of event destinations: create, list, read, change, delete, test,
verify and rotate a webhook's secret."""

from __future__ import annotations

import functools

from aiohttp import web

from herald.api import schemas
from herald.api.base import TENANT, ApiBase
from herald.api.request import (
    DESTINATION_STATUSES,
    json_body,
    page_limit,
    query_params,
    status_param,
)
from herald.audit import update_fields
from herald.fields import events_field, name_field
from herald.model import DestinationStatus
from herald.views import delivery_view, filter_test_view, health_view, verification_attempt_view


class DestinationHandlers(ApiBase):
    """``/v2/event-destinations``."""

    async def create_destination(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()

        async def run() -> web.Response:
            model = await json_body(
                request,
                self.models.create,
                precheck=self._known_type,
                field_checks=(name_field, functools.partial(events_field, required=True)),
            )
            dest = await self.service.create(request[TENANT], model.model_dump(exclude_unset=True))
            self._audit(request, "destination_created", destination_id=dest.id)
            return self._respond(self.models.destination, self._dest(dest), status=201)

        return await self._idempotent(request, raw, run)

    async def list_destinations(self, request: web.Request) -> web.StreamResponse:
        query = query_params(request, {"limit", "cursor", "status", "type"})
        limit = page_limit(query)
        status = status_param(query, DestinationStatus, DESTINATION_STATUSES)
        type_ = self.registry.canonical(query["type"]) if "type" in query else None
        filters = {"tenant": request[TENANT], "status": query.get("status"), "type": type_}
        pages = self._pages(query, endpoint="destinations", filters=filters)
        items, more = await self.service.list_destinations(
            request[TENANT], status=status, type=type_, before_id=pages.after, limit=limit
        )
        health = await self.service.health(items)
        views = [{**self._dest(d), "health": health_view(health.get(d.id))} for d in items]
        return self._page(request, pages, views, more, model=self.models.destination_list)

    async def get_destination(self, request: web.Request) -> web.StreamResponse:
        query_params(request, set())
        dest = await self.service.get(request[TENANT], request.match_info["id"])
        health = (await self.service.health([dest])).get(dest.id)
        view = {**self._dest(dest), "health": health_view(health)}
        if view["verification"]["state"] != "verified":
            attempt = await self.service.verification_attempt(dest)
            view["verification"]["last_attempt"] = verification_attempt_view(attempt)
        return self._respond(self.models.destination, view)

    async def update_destination(self, request: web.Request) -> web.StreamResponse:
        model = await json_body(
            request,
            self.models.update,
            field_checks=(name_field, functools.partial(events_field, required=False)),
        )
        body = model.model_dump(exclude_unset=True)
        dest = await self.service.update(request[TENANT], request.match_info["id"], body)
        self._audit(request, "destination_updated", destination_id=dest.id, **update_fields(body))
        return self._respond(self.models.destination, self._dest(dest))

    async def delete_destination(self, request: web.Request) -> web.StreamResponse:
        dest = await self.service.delete(request[TENANT], request.match_info["id"])
        self._audit(request, "destination_deleted", destination_id=dest.id)
        return self._respond(self.models.destination, self._dest(dest))

    async def test_destination(self, request: web.Request) -> web.StreamResponse:
        delivery = await self.service.test(request[TENANT], request.match_info["id"])
        self._audit(
            request,
            "destination_tested",
            destination_id=delivery.destination_id,
            delivery_id=delivery.id,
            outcome=delivery.status.value,
        )
        return self._respond(schemas.Delivery, delivery_view(delivery, with_attempts=True))

    async def test_filter(self, request: web.Request) -> web.StreamResponse:
        body = await json_body(request, schemas.FilterTestRequest, optional=True)
        spec, results = await self.service.test_filter(
            request[TENANT], request.match_info["id"], body.model_dump(exclude_unset=True)
        )
        return self._respond(schemas.FilterTestResult, filter_test_view(spec, results))

    async def verify_destination(self, request: web.Request) -> web.StreamResponse:
        dest = await self.service.verify(request[TENANT], request.match_info["id"])
        self._audit(request, "destination_verification_sent", destination_id=dest.id)
        return self._respond(self.models.destination, self._dest(dest), status=202)

    async def rotate_secret(self, request: web.Request) -> web.StreamResponse:
        body = await json_body(request, schemas.RotateSecretRequest, optional=True)
        dest, secret = await self.service.rotate_secret(
            request[TENANT], request.match_info["id"], body.secret
        )
        self._audit(request, "destination_secret_rotated", destination_id=dest.id)
        view = self._dest(dest)
        if body.secret is None:
            view["secret"] = secret  # generated here: the caller's only chance to see it
        return self._respond(self.models.rotated, view)
