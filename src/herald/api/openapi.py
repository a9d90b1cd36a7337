"""The OpenAPI 3.1 document of the /v2 API, generated from the handlers' own models.

``python -m herald.api.openapi > docs/openapi.json`` refreshes the copy kept in
the repository; a test fails when the two differ.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from herald import __version__
from herald.api import schemas
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
    if status == "429":
        names.append("Retry-After")
    if idempotent and status in _REPLAYABLE:
        names.append("Idempotent-Replayed")
    return {**response, "headers": _headers(*names)}


_ERRORS = {
    "400": "malformed request: invalid JSON, wrong types, unknown fields, bad cursor",
    "401": "missing or invalid API key",
    "404": "no such object for this tenant",
    "409": "the object's state does not allow the operation",
    "413": "body too large",
    "422": "invalid values",
    "429": "rate limited; see Retry-After",
    "500": "internal error",
}


def _op(
    op_id: str,
    summary: str,
    ok: tuple[str, type[BaseModel], str],
    *,
    body: type[BaseModel] | None = None,
    body_required: bool = True,
    params: list[dict[str, Any]] | None = None,
    errors: tuple[str, ...] = ("400", "401", "404", "409", "413", "422", "429", "500"),
    idempotent: bool = False,
) -> dict[str, Any]:
    op: dict[str, Any] = {
        "operationId": op_id,
        "summary": summary,
        "security": [{"bearer": []}],
        "parameters": list(params or []),
        "responses": {ok[0]: _json(ok[1], ok[2])},
    }
    for code in errors:
        op["responses"][code] = _json(schemas.ErrorBody, _ERRORS[code])
    if body is not None:
        op["requestBody"] = {
            "required": body_required,
            "content": {media: {"schema": _ref(body)} for media in REQUEST_TYPES},
        }
    if idempotent:
        op["parameters"].append(
            {
                "name": "Idempotency-Key",
                "in": "header",
                "required": False,
                "description": "the same key and body within 24 h (api.idempotency_ttl_seconds)"
                " replays the first response; the same key with another body is a 422",
                "schema": {"type": "string", "minLength": 1, "maxLength": 255},
            }
        )
    return op


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


_PAGING = [
    _q(
        "limit",
        "page size, 1 to 100 (default 20)",
        {"type": "integer", "minimum": 1, "maximum": 100},
    ),
    _q("cursor", "next_cursor of the previous page"),
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
        schemas.RotateSecretRequest,
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
    dest_id = [_path_id("evtd_")]
    D, L = models.destination, models.destination_list
    paths: dict[str, Any] = {
        "/v2/event-destinations": {
            "post": _op(
                "createDestination",
                "Create an event destination",
                ("201", D, "the destination, pending verification"),
                body=models.create,
                idempotent=True,
            ),
            "get": _op(
                "listDestinations",
                "List event destinations, newest first",
                ("200", L, "a page of destinations"),
                params=[
                    *_PAGING,
                    _q(
                        "status", "filter", {"enum": ["pending_verification", "active", "inactive"]}
                    ),
                    _q("type", "filter by type", {"enum": list(models.type_names)}),
                ],
                errors=("400", "401", "422", "429", "500"),
            ),
        },
        "/v2/event-destinations/{id}": {
            "get": _op(
                "getDestination",
                "Get an event destination",
                ("200", D, "the destination"),
                params=dest_id,
                errors=("400", "401", "404", "429", "500"),
            ),
            "patch": _op(
                "updateDestination",
                "Update an event destination (only fields given)",
                ("200", D, "the destination"),
                body=models.update,
                params=dest_id,
            ),
            "delete": _op(
                "deleteDestination",
                "Delete an event destination",
                ("200", D, "the deleted destination"),
                params=dest_id,
                errors=("400", "401", "404", "429", "500"),
            ),
        },
        "/v2/event-destinations/{id}/test": {
            "post": _op(
                "testDestination",
                "Send test.ping once, no retry",
                ("200", schemas.Delivery, "the test delivery and its attempt"),
                params=dest_id,
            ),
        },
        "/v2/event-destinations/{id}/verify": {
            "post": _op(
                "verifyDestination",
                "Send a fresh verification ping",
                ("202", D, "the destination"),
                params=dest_id,
            ),
        },
        "/v2/event-destinations/{id}/rotate-secret": {
            "post": _op(
                "rotateSecret",
                "Rotate the webhook signing secret",
                ("200", models.rotated, "the destination and its new secret, shown once"),
                body=schemas.RotateSecretRequest,
                body_required=False,
                params=dest_id,
            ),
        },
        "/v2/event-destinations/{id}/event-deliveries": {
            "get": _op(
                "listDeliveries",
                "List deliveries to a destination, newest first",
                ("200", schemas.DeliveryList, "a page of deliveries"),
                params=[
                    *dest_id,
                    *_PAGING,
                    _q("status", "filter", {"enum": ["success", "failure", "pending"]}),
                    _q("event_type", "filter"),
                    _q("since", "created at or after (RFC 3339)"),
                    _q("until", "created before (RFC 3339)"),
                ],
                errors=("400", "401", "404", "422", "429", "500"),
            ),
        },
        "/v2/event-destinations/{id}/replay": {
            "post": _op(
                "replayDeliveries",
                "Re-queue matching deliveries",
                ("202", schemas.ReplayResult, "how many were re-queued"),
                body=schemas.ReplayRequest,
                body_required=False,
                params=dest_id,
            ),
        },
        "/v2/event-deliveries/{id}": {
            "get": _op(
                "getDelivery",
                "Get a delivery with its attempts",
                ("200", schemas.Delivery, "the delivery"),
                params=[_path_id("dlv_")],
                errors=("400", "401", "404", "429", "500"),
            ),
        },
        "/v2/event-deliveries/{id}/retry": {
            "post": _op(
                "retryDelivery",
                "Re-queue one delivery now",
                ("202", schemas.Delivery, "the re-queued delivery"),
                params=[_path_id("dlv_")],
            ),
        },
        "/v2/events": {
            "post": _op(
                "publishEvent",
                "Publish an event through the outbox",
                ("202", schemas.Event, "the accepted event"),
                body=schemas.EventCreate,
                idempotent=True,
            ),
        },
        "/v2/events/{id}": {
            "get": _op(
                "getEvent",
                "Get an event",
                ("200", schemas.Event, "the event"),
                params=[_path_id("evt_")],
                errors=("400", "401", "404", "429", "500"),
            ),
        },
    }
    # Paginated dry-run replays answer 200 as well as 202.
    paths["/v2/event-destinations/{id}/replay"]["post"]["responses"]["200"] = _json(
        schemas.ReplayResult, "dry run: how many would be re-queued"
    )
    for path in paths.values():
        for op in path.values():
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


def main() -> None:
    import orjson

    from herald.adapters.base import AdapterContext
    from herald.adapters.registry import Registry
    from herald.config import Settings
    from herald.egress import EgressPolicy

    registry = Registry(AdapterContext(settings=Settings(), egress=EgressPolicy()))
    doc = document(schemas.destination_models(registry))
    print(orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode())


if __name__ == "__main__":
    main()
