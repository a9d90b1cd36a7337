"""The /v2 handlers of deliveries and replays: a destination's deliveries, one
delivery and its retry, a replay and the replays made."""

from __future__ import annotations

from aiohttp import web

from herald.api import schemas
from herald.api.base import REQUEST_ID, TENANT, ApiBase
from herald.api.request import (
    DELIVERY_STATUSES,
    json_body,
    page_limit,
    query_params,
    status_param,
    timestamp_param,
)
from herald.model import DeliveryFilter, DeliveryStatus
from herald.views import delivery_view, replay_result_view, replay_view


class DeliveryHandlers(ApiBase):
    """``/v2/event-deliveries``, a destination's ``event-deliveries`` and ``replay``,
    and ``/v2/replays``."""

    # --- deliveries -------------------------------------------------------------
    async def list_deliveries(self, request: web.Request) -> web.StreamResponse:
        query = query_params(request, {"limit", "cursor", "status", "event_type", "since", "until"})
        dest = await self.service.get(request[TENANT], request.match_info["id"], deleted=True)
        limit = page_limit(query)
        status = status_param(query, DeliveryStatus, DELIVERY_STATUSES)
        flt = DeliveryFilter(
            tenant_id=request[TENANT],
            destination_id=dest.id,
            status=status,
            event_types=(query["event_type"],) if "event_type" in query else (),
            since=timestamp_param(query, "since"),
            until=timestamp_param(query, "until"),
        )
        filters = {k: query.get(k) for k in ("status", "event_type", "since", "until")}
        filters["tenant"] = request[TENANT]
        pages = self._pages(query, endpoint=f"deliveries:{dest.id}", filters=filters)
        items, more = await self.service.list_deliveries(flt, before_id=pages.after, limit=limit)
        views = [delivery_view(d) for d in items]
        return self._page(request, pages, views, more, model=schemas.DeliveryList)

    async def get_delivery(self, request: web.Request) -> web.StreamResponse:
        delivery = await self.service.get_delivery(request[TENANT], request.match_info["id"])
        return self._respond(schemas.Delivery, delivery_view(delivery, with_attempts=True))

    async def retry_delivery(self, request: web.Request) -> web.StreamResponse:
        delivery = await self.service.retry(request[TENANT], request.match_info["id"])
        self._audit(request, "delivery_retried", delivery_id=delivery.id)
        return self._respond(
            schemas.Delivery, delivery_view(delivery, with_attempts=True), status=202
        )

    async def replay(self, request: web.Request) -> web.StreamResponse:
        body = await json_body(request, schemas.ReplayRequest, optional=True)
        dest = await self.service.get(request[TENANT], request.match_info["id"])
        event_types = tuple(body.event_types or ())
        flt = DeliveryFilter(
            tenant_id=request[TENANT],
            destination_id=dest.id,
            status=DeliveryStatus(body.status) if body.status else None,
            event_types=event_types,
            since=timestamp_param(body, "since"),
            until=timestamp_param(body, "until"),
        )
        # The same rate as `herald replay`: an API replay must not flood a recovering
        # endpoint either. Keys carry no id of their own, so the tenant names the caller.
        result = await self.service.replays.run(
            flt,
            by=f"api:{request[TENANT]}",
            dry_run=body.dry_run,
            rate_per_second=self.settings.delivery.replay_rate_per_second or None,
        )
        view = {**replay_result_view(result), "request_id": request[REQUEST_ID]}
        return self._respond(schemas.ReplayResult, view, status=200 if body.dry_run else 202)

    async def get_replay(self, request: web.Request) -> web.StreamResponse:
        query_params(request, set())
        replay = await self.service.replays.get(request[TENANT], request.match_info["id"])
        tenant = request[TENANT]
        view = {**replay_view(replay, for_tenant=tenant), "request_id": request[REQUEST_ID]}
        return self._respond(schemas.Replay, view)

    async def list_replays(self, request: web.Request) -> web.StreamResponse:
        query = query_params(request, {"limit", "cursor"})
        limit = page_limit(query)
        tenant = request[TENANT]
        pages = self._pages(query, endpoint="replays", filters={"tenant": tenant})
        items, more = await self.service.replays.page(tenant, before_id=pages.after, limit=limit)
        views = [replay_view(r, for_tenant=tenant) for r in items]
        return self._page(request, pages, views, more, model=schemas.ReplayList)
