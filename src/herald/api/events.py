"""The /v2 handlers of events and session tokens: publish an event, read one, and
make a session token (``POST /v2/token``)."""

from __future__ import annotations

import orjson
from aiohttp import web

from herald.access.tokens import IssuedToken
from herald.api import schemas
from herald.api.base import KEY_HASH, REQUEST_ID, TENANT, ApiBase, log
from herald.api.request import json_body
from herald.errors import Conflict
from herald.timeutil import format_epoch
from herald.views import event_view


class EventHandlers(ApiBase):
    """``/v2/events`` and ``/v2/token``."""

    # --- session tokens -------------------------------------------------------
    async def create_token(self, request: web.Request) -> web.StreamResponse:
        """A session token for the key's tenant (spec 000: 201, the token object). Only
        its hash is stored, so an idempotent repeat cannot answer the same value: it
        gives the same token a new one (the first stops working), as long as the token
        has not been traded, expired or been revoked (else 409 token_unavailable)."""
        raw = await request.read()
        tenant = request[TENANT]

        def answer(issued: IssuedToken, request_id: str) -> web.Response:
            view = {
                "id": issued.id,
                "object": "token",
                "token": issued.token,
                "expires_at": format_epoch(issued.expires_at),
                "created_at": format_epoch(issued.created_at),
                "request_id": request_id,
            }
            return self._respond(schemas.Token, view, status=201)

        async def run() -> web.Response:
            await json_body(request, schemas.TokenRequest, optional=True)
            issued = await self.tokens.create(tenant, key_hash=request[KEY_HASH])
            log.info("token_created", token_id=issued.id, tenant_id=tenant)
            return answer(issued, request[REQUEST_ID])

        def stored(body: bytes) -> bytes:
            return orjson.dumps({**orjson.loads(body), "token": None})

        async def replayed(body: bytes) -> web.Response:
            first = orjson.loads(body)
            issued = await self.tokens.reissue(tenant, first["id"])
            if issued is None:
                raise Conflict(
                    "the token made with this Idempotency-Key was exchanged, has expired or"
                    " was revoked; ask for a new one with another Idempotency-Key",
                    field="Idempotency-Key",
                    code="token_unavailable",
                )
            log.info("token_reissued", token_id=issued.id, tenant_id=tenant)
            return answer(issued, first["request_id"])

        return await self._idempotent(request, raw, run, stored=stored, replayed=replayed)

    # --- events -------------------------------------------------------------
    async def publish_event(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()

        async def run() -> web.Response:
            body = await json_body(request, schemas.EventCreate)
            event = await self.service.publish(
                request[TENANT],
                body.type,
                body.data,
                event_id=body.id,
                created_at=body.created_at,
                # Several traceparent headers are invalid (W3C): joined, they fail the check.
                traceparent=",".join(request.headers.getall("traceparent", ())) or None,
                ordering_key=body.ordering_key,
            )
            return self._respond(schemas.Event, event_view(event), status=202)

        return await self._idempotent(request, raw, run)

    async def get_event(self, request: web.Request) -> web.StreamResponse:
        event = await self.service.get_event(request[TENANT], request.match_info["id"])
        return self._respond(schemas.Event, event_view(event))
