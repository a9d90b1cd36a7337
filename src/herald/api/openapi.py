"""The OpenAPI 3.1 document of the /v2 API, generated from the handlers' own models.

``python -m herald.api.openapi > docs/openapi.json`` refreshes the copy kept in
the repository; a test fails when the two differ. The API serves it as
:class:`Served`: built once per process, answered from those bytes with an ETag.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from herald import __version__
from herald.api import schemas
from herald.api.request import DELIVERY_STATUSES, DESTINATION_STATUSES
from herald.api.schemas import DestinationModels

REF = "#/components/schemas/{model}"
HEADER_REF = "#/components/headers/{name}"

# The request body media types spec 000 names; the handlers accept exactly these
# (herald.api.request.JSON_TYPES), and answer anything else with 400 content_type_invalid.
REQUEST_TYPES = ("application/json", "text/json", "application/*+json")

# Response headers, declared once under components.headers and referenced by name.
HEADERS: dict[str, dict[str, Any]] = {
    "X-Request-Id": {
        "description": "the request's id (req_…), also in every error body and in the log;"
        " an idempotent replay carries the first request's id",
        "required": True,
        "schema": {"type": "string", "pattern": "^req_"},
    },
    "RateLimit": {
        "description": "IETF RateLimit header: remaining requests (r) and seconds until the"
        ' window resets (t), e.g. "default";r=199;t=10. Sent on every response to a request'
        " with a valid API key",
        "schema": {"type": "string"},
    },
    "RateLimit-Policy": {
        "description": "IETF RateLimit-Policy header: quota (q) per window of w seconds, e.g."
        ' "default";q=200;w=10. Sent on every response to a request with a valid API key',
        "schema": {"type": "string"},
    },
    "WWW-Authenticate": {
        "description": 'the auth scheme: Bearer realm="herald", with error="invalid_token"'
        " when a key was sent but is not valid",
        "required": True,
        "schema": {"type": "string", "pattern": "^Bearer"},
    },
    "Retry-After": {
        "description": "seconds to wait before the next request",
        "required": True,
        "schema": {"type": "integer", "minimum": 1},
    },
    "Idempotent-Replayed": {
        "description": "true when this response replays the first one sent with the same"
        " Idempotency-Key and body",
        "schema": {"type": "string", "enum": ["true"]},
    },
}
# Statuses answered before the rate limiter sees the request carry no RateLimit headers.
_UNLIMITED = ("401",)
# Statuses an idempotent create can replay: what the first request answered, short of 5xx.
_REPLAYABLE = ("200", "201", "202", "400", "404", "409", "422")


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": REF.format(model=model.__name__)}


def _headers(*names: str) -> dict[str, Any]:
    return {name: {"$ref": HEADER_REF.format(name=name)} for name in names}


def _json(model: type[BaseModel], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref(model)}}}


def _with_headers(status: str, response: dict[str, Any], *, idempotent: bool) -> dict[str, Any]:
    names = ["X-Request-Id"]
    if status not in _UNLIMITED:
        names += ["RateLimit", "RateLimit-Policy"]
    if status == "401":
        names.append("WWW-Authenticate")
    if status == "429":
        names.append("Retry-After")
    if idempotent and status in _REPLAYABLE:
        names.append("Idempotent-Replayed")
    return {**response, "headers": _headers(*names)}


_ERRORS = {
    "400": "malformed request: invalid JSON, wrong types, unknown fields, bad cursor",
    "401": "missing or invalid API key",
    "404": "no such object for this tenant",
    "408": "the body did not arrive within api.body_timeout_seconds of the headers",
    "409": "the object's state does not allow the operation",
    "413": "body too large",
    "422": "invalid values",
    "429": "rate limited; see Retry-After",
    "500": "internal error",
}


_WRITE_ERRORS: tuple[str, ...] = (
    "400",
    "401",
    "404",
    "408",
    "409",
    "413",
    "422",
    "429",
    "500",
)

# The prefix of the ids each collection's {id} takes.
_ID_PREFIXES = {
    "event-destinations": "evtd_",
    "event-deliveries": "dlv_",
    "events": "evt_",
    "replays": "rpl_",
}


# Bodies a request may leave out (v2 reads none as {}): every field has a default.
_OPTIONAL_BODIES = (
    schemas.RotateSecretRequest,
    schemas.ReplayRequest,
    schemas.TokenRequest,
    schemas.FilterTestRequest,
)

# What each operation is for, and what its success response carries, by operationId.
_SUMMARIES = {
    "createDestination": "Create an event destination",
    "listDestinations": "List event destinations, newest first",
    "getDestination": "Get an event destination",
    "updateDestination": "Update an event destination (only fields given)",
    "deleteDestination": "Delete an event destination",
    "testDestination": "Send test.ping once, no retry",
    "testFilter": "Try a payload filter on the newest events of the destination's types",
    "verifyDestination": "Send a fresh verification ping",
    "rotateSecret": "Rotate the webhook signing secret",
    "listDeliveries": "List deliveries to a destination, newest first",
    "replayDeliveries": "Re-queue matching deliveries",
    "getDelivery": "Get a delivery with its attempts",
    "retryDelivery": "Re-queue one delivery now",
    "publishEvent": "Publish an event through the outbox",
    "getEvent": "Get an event",
    "listEventTypes": "List the tenant's event-type catalog, in type order",
    "getEventType": "Get an event type's description and schema",
    "putEventType": "Create or replace an event type's description and schema",
    "deleteEventType": "Delete an event type from the catalog",
    "listReplays": "List replays, newest first",
    "getReplay": "Get a replay and its outcome",
    "createToken": "Create a session token for the tenant portal",
}
_RESULTS = {
    "createDestination": "the destination, pending verification",
    "listDestinations": "a page of destinations",
    "getDestination": "the destination",
    "updateDestination": "the destination",
    "deleteDestination": "the deleted destination",
    "testDestination": "the test delivery and its attempt",
    "testFilter": "each event tried and whether it passes; nothing is stored or sent",
    "verifyDestination": "the destination",
    "rotateSecret": "the destination and its new secret, shown once",
    "listDeliveries": "a page of deliveries",
    "replayDeliveries": "the replay (rpl_…) and how many it re-queued",
    "getDelivery": "the delivery",
    "retryDelivery": "the re-queued delivery",
    "publishEvent": "the accepted event",
    "getEvent": "the event",
    "listEventTypes": "a page of event types (Herald's own herald.… types among them)",
    "getEventType": "the event type",
    "putEventType": "the event type as stored",
    "deleteEventType": "the deleted event type",
    "listReplays": "a page of replays",
    "getReplay": "the replay, its deliveries counted by status now",
    "createToken": "the session token; its value is shown only here",
}


def _op(
    method: str,
    path: str,
    op_id: str,
    status: str,
    model: type[BaseModel],
    body: type[BaseModel] | None = None,
    *,
    query: tuple[dict[str, Any], ...] = (),
    idempotent: bool = False,
    refusable: bool = False,
) -> tuple[str, str, dict[str, Any]]:
    """One operation as (path, method, operation).

    The path's ``{id}`` makes its parameter; a read (GET, DELETE) answers no 409 or
    413, a 404 only with an id and a 422 only with query filters to be invalid (or when
    ``refusable``: a DELETE the service may refuse)."""
    with_id = "{id}" in path or "{type}" in path
    params = [_path_param(path)] if with_id else []
    params.extend(query)
    errors = _WRITE_ERRORS
    if method in ("GET", "DELETE"):
        dropped = {
            "408",
            "409",
            "413",
            *(() if with_id else ("404",)),
            *(() if query or refusable else ("422",)),
        }
        errors = tuple(code for code in _WRITE_ERRORS if code not in dropped)
    op: dict[str, Any] = {
        "operationId": op_id,
        "summary": _SUMMARIES[op_id],
        "security": [{"bearer": []}],
        "parameters": params,
        "responses": {status: _json(model, _RESULTS[op_id])},
    }
    for code in errors:
        op["responses"][code] = _json(schemas.ErrorBody, _ERRORS[code])
    if body is not None:
        op["requestBody"] = {
            "required": body not in _OPTIONAL_BODIES,
            "content": {media: {"schema": _ref(body)} for media in REQUEST_TYPES},
        }
    if idempotent:
        op["parameters"].append(_IDEMPOTENCY_KEY)
    return path, method.lower(), op


_IDEMPOTENCY_KEY = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "description": "the same key and body within 24 h (api.idempotency_ttl_seconds)"
    " replays the first response; the same key with another body is a 422",
    "schema": {"type": "string", "minLength": 1, "maxLength": 255},
}


_TRACEPARENT = {
    "name": "traceparent",
    "in": "header",
    "required": False,
    "description": "the producer's W3C trace context (00-<trace id>-<parent id>-<flags>),"
    " sent on to the receivers; an invalid one is dropped with a warning, never the event",
    "schema": {"type": "string"},
}


def _path_param(path: str) -> dict[str, Any]:
    if "{type}" in path:
        return {
            "name": "type",
            "in": "path",
            "required": True,
            "schema": {"type": "string", "maxLength": 128},
            "description": "an event type, such as order.paid",
        }
    return _path_id(_ID_PREFIXES[path.split("/")[2]])


def _path_id(prefix: str) -> dict[str, Any]:
    return {
        "name": "id",
        "in": "path",
        "required": True,
        "schema": {"type": "string"},
        "description": f"id with prefix {prefix}",
    }


def _q(name: str, description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": schema or {"type": "string"},
    }


_PAGING = (
    _q(
        "limit",
        "page size, 1 to 100 (default 20)",
        {"type": "integer", "minimum": 1, "maximum": 100},
    ),
    _q("cursor", "next_cursor of the previous page"),
)


def _operations(models: DestinationModels) -> list[tuple[str, str, dict[str, Any]]]:
    D, L, R, S = models.destination, models.destination_list, models.rotated, schemas
    dests = "/v2/event-destinations"
    dest = f"{dests}/{{id}}"
    dest_query = (
        *_PAGING,
        _q("status", "filter", {"enum": list(DESTINATION_STATUSES)}),
        _q("type", "filter by type", {"enum": list(models.type_names)}),
    )
    dlv_query = (
        *_PAGING,
        _q("status", "filter", {"enum": list(DELIVERY_STATUSES)}),
        _q("event_type", "filter"),
        _q("since", "created at or after: RFC 3339, or a duration ago such as 2h"),
        _q("until", "created before: RFC 3339, or a duration ago such as 2h"),
    )
    dest_deliveries = f"{dest}/event-deliveries"
    return [
        _op("POST", dests, "createDestination", "201", D, models.create, idempotent=True),
        _op("GET", dests, "listDestinations", "200", L, query=dest_query),
        _op("GET", dest, "getDestination", "200", D),
        _op("PATCH", dest, "updateDestination", "200", D, models.update),
        _op("DELETE", dest, "deleteDestination", "200", D),
        _op("POST", f"{dest}/test", "testDestination", "200", S.Delivery),
        _op(
            "POST",
            f"{dest}/filter/test",
            "testFilter",
            "200",
            S.FilterTestResult,
            S.FilterTestRequest,
        ),
        _op("POST", f"{dest}/verify", "verifyDestination", "202", D),
        _op("POST", f"{dest}/rotate-secret", "rotateSecret", "200", R, S.RotateSecretRequest),
        _op("GET", dest_deliveries, "listDeliveries", "200", S.DeliveryList, query=dlv_query),
        _op("POST", f"{dest}/replay", "replayDeliveries", "202", S.ReplayResult, S.ReplayRequest),
        _op("GET", "/v2/event-deliveries/{id}", "getDelivery", "200", S.Delivery),
        _op("POST", "/v2/event-deliveries/{id}/retry", "retryDelivery", "202", S.Delivery),
        _op(
            "POST",
            "/v2/events",
            "publishEvent",
            "202",
            S.Event,
            S.EventCreate,
            query=(_TRACEPARENT,),  # (a header: parameters other than the path's)
            idempotent=True,
        ),
        _op("GET", "/v2/events/{id}", "getEvent", "200", S.Event),
        _op("GET", "/v2/event-types", "listEventTypes", "200", S.EventTypeList, query=_PAGING),
        _op("GET", "/v2/event-types/{type}", "getEventType", "200", S.EventType),
        _op("PUT", "/v2/event-types/{type}", "putEventType", "200", S.EventType, S.EventTypePut),
        _op(
            "DELETE",
            "/v2/event-types/{type}",
            "deleteEventType",
            "200",
            S.EventType,
            refusable=True,  # Herald's own types: 422 event_type_reserved
        ),
        _op("GET", "/v2/replays", "listReplays", "200", S.ReplayList, query=_PAGING),
        _op("GET", "/v2/replays/{id}", "getReplay", "200", S.Replay),
        _op("POST", "/v2/token", "createToken", "201", S.Token, S.TokenRequest, idempotent=True),
    ]


def document(models: DestinationModels) -> dict[str, Any]:
    all_models: list[type[BaseModel]] = [
        schemas.ErrorBody,
        schemas.Attempt,
        schemas.Delivery,
        schemas.DeliveryList,
        schemas.Event,
        schemas.EventCreate,
        schemas.ReplayRequest,
        schemas.ReplayResult,
        schemas.Replay,
        schemas.ReplayList,
        schemas.Token,
        schemas.TokenRequest,
        schemas.RotateSecretRequest,
        schemas.FilterTestRequest,
        schemas.FilterTestResult,
        schemas.EventTypePut,
        schemas.EventType,
        schemas.EventTypeList,
        models.create,
        models.update,
        models.destination,
        models.destination_list,
        models.rotated,
    ]
    _, top = models_json_schema(
        [
            (m, "validation" if m in (models.create, models.update) else "serialization")
            for m in all_models
        ],
        ref_template=REF,
    )
    paths: dict[str, dict[str, Any]] = {}
    for path, method, op in _operations(models):
        paths.setdefault(path, {})[method] = op
    # Paginated dry-run replays answer 200 as well as 202.
    paths["/v2/event-destinations/{id}/replay"]["post"]["responses"]["200"] = _json(
        schemas.ReplayResult, "dry run: how many would be re-queued"
    )
    for methods in paths.values():
        for op in methods.values():
            idempotent = any(p["name"] == "Idempotency-Key" for p in op["parameters"])
            op["responses"] = {
                status: _with_headers(status, response, idempotent=idempotent)
                for status, response in op["responses"].items()
            }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Herald event destinations API",
            "version": __version__,
            "description": "Event destinations, deliveries and events (spec 001) with the "
            "conventions of spec 000.",
        },
        "servers": [{"url": "/"}],
        "components": {
            "schemas": top.get("$defs", {}),
            "headers": HEADERS,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "sk_live_…"}
            },
        },
        "paths": paths,
    }


@dataclass(frozen=True, slots=True)
class Served:
    """The document as the API serves it: its JSON bytes, built once (about 100 KB and
    tens of milliseconds of CPU to build, for a route that needs no key), and their
    strong ETag, so a client revalidates instead of downloading it again."""

    body: bytes
    etag: str
    """The quoted entity tag: a digest of ``body``."""

    @classmethod
    def build(cls, models: DestinationModels) -> Served:
        body = orjson.dumps(document(models))
        return cls(body, f'"{hashlib.sha256(body).hexdigest()[:32]}"')

    def matches(self, if_none_match: str) -> bool:
        """Whether an ``If-None-Match`` value names this version (weak comparison, as
        RFC 9110 asks for this header; ``*`` matches any)."""
        for tag in if_none_match.split(","):
            tag = tag.strip()
            if tag == "*" or tag.removeprefix("W/") == self.etag:
                return True
        return False


def main() -> None:
    from herald.adapters.base import AdapterContext
    from herald.adapters.registry import Registry
    from herald.config import Settings
    from herald.egress import EgressPolicy

    registry = Registry(AdapterContext(settings=Settings(), egress=EgressPolicy()))
    doc = document(schemas.destination_models(registry))
    print(orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode())


if __name__ == "__main__":
    main()
