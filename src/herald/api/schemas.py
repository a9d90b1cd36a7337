"""Request and response bodies of the /v2 API, as pydantic models.

The handlers validate with these models and answer through them, and the
OpenAPI document is generated from them, so the three cannot drift apart.
Models that depend on the registered destination types are built at start-up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field
from pydantic import create_model as _create_model

from herald.adapters.registry import Registry
from herald.fields import (
    MAX_EVENT_TYPES,
    MAX_NAME_LENGTH,
    MAX_PATTERNS,
    MAX_RATE_PER_SECOND,
    MAX_TYPE_LENGTH,
)

# create_model's overloads do not type-check with computed field maps.
create_model = cast(Any, _create_model)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


def _documented(**limits: int) -> Any:
    """JSON-schema limits (maxLength, maxItems) the document states and the service
    checks (herald.service), so the service's 422 and its code answer a violation."""
    return Field(json_schema_extra=dict(limits))


_EVENT_TYPE_LENGTH = 128  # herald.match: the longest event type
_Name = Annotated[str, _documented(maxLength=MAX_NAME_LENGTH)]
_TypeName = Annotated[str, _documented(maxLength=MAX_TYPE_LENGTH)]
_EventType = Annotated[str, _documented(maxLength=_EVENT_TYPE_LENGTH)]
_Pattern = Annotated[str, _documented(maxLength=_EVENT_TYPE_LENGTH + 2)]  # family: "….*"
_Patterns = Annotated[list[_Pattern], _documented(maxItems=MAX_PATTERNS)]


# --- responses ------------------------------------------------------------------
_FILTER_FIELD: Any = (
    dict[str, Any] | None,
    Field(
        default=None,
        description="a payload filter (docs/catalog-and-filters.md): only events that pass it"
        " get a delivery; null for every event of its types",
        examples=[{"data": {"amount": {"$gte": 100}}}],
    ),
)


class ErrorItem(_Strict):
    type: str = Field(description="category, e.g. request, auth, rate_limit")
    code: str = Field(description="stable machine code")
    message: str
    resolution: str
    field: str | None = None


class ErrorBody(_Strict):
    errors: list[ErrorItem]
    request_id: str


class Attempt(_Strict):
    id: str
    object: Literal["event_delivery_attempt"]
    number: int
    started_at: str
    duration_ms: int
    outcome: Literal["success", "failure_retryable", "failure_permanent", "timeout"]
    response_status: int | None
    error: str | None
    response_excerpt: str | None


class Delivery(_Strict):
    id: str
    object: Literal["event_delivery"]
    event_id: str
    event_type: str
    destination_id: str
    status: Literal["pending", "success", "failure"]
    attempt_count: int
    next_attempt_at: str | None
    held: bool
    created_at: str
    updated_at: str
    last_attempt: Attempt | None
    replay_id: str | None = Field(description="the latest replay that re-queued it (rpl_…)")
    attempts: list[Attempt] | None = None


class Event(_Strict):
    id: str
    object: Literal["event"]
    type: str
    created_at: str
    data: dict[str, Any]
    ordering_key: str | None = Field(description="the producer's ordering key, if any")


class VerificationAttempt(_Strict):
    """The last attempt of a destination's newest verification ping
    (``herald.views.verification_attempt_view``)."""

    started_at: str
    outcome: str
    response_status: int | None
    error: str | None


class Verification(_Strict):
    """Where a destination's verification stands (``herald.views.verification_view``)."""

    state: Literal["verified", "pending", "failed"] = Field(
        description="failed: the ping ran out of attempts; the status stays"
        " pending_verification until a new ping (reverify) succeeds"
    )
    failed_at: str | None = Field(description="when the failed ping gave up")
    last_error: str | None = Field(description="the failed ping's last error")
    reverify: str | None = Field(description="the request that sends a new verification ping")
    last_attempt: VerificationAttempt | None = Field(
        default=None,
        description="on a read of one destination that is not verified: the last attempt of"
        " its newest verification ping, why it is still pending (null before its first"
        " attempt); absent elsewhere",
    )


class CircuitState(_Strict):
    """A destination's circuit breaker (``herald.views.circuit_view``,
    docs/flow-control.md)."""

    state: Literal["closed", "open", "half_open"] = Field(
        description="open: no attempts until next_probe_at; half_open: its one probe is out"
    )
    opened_at: str | None = Field(description="when it opened; null when closed")
    next_probe_at: str | None = Field(
        description="when the next probe may go (half_open: when the probe out is given up)"
    )


_RATE_FIELD = Field(
    default=None,
    description="attempts to this destination start no faster than this many a second"
    " (a token bucket holding one second's worth); null: no limit",
    json_schema_extra={"exclusiveMinimum": 0, "maximum": MAX_RATE_PER_SECOND},
)
_ORDERING = (
    "key: the events of one ordering_key are delivered one at a time, each after every"
    " earlier one of its key ended (docs/ordering.md); none (default): no order"
)
_BREAKER_FIELD = Field(
    description="open the circuit after delivery.breaker_failures consecutive failed"
    " attempts: no attempts until one probe after the cooldown (docs/flow-control.md)",
)


class DestinationHealth(_Strict):
    """How a destination has been answering (``herald.views.health_view``), from the
    counters kept as attempts are recorded; on reads of destinations only."""

    last_success_at: str | None = Field(description="the start of its last successful attempt")
    last_failure_at: str | None = Field(description="the start of its last failed attempt")
    attempts_24h: int = Field(description="attempts in the last 24 hours (this hour and 23)")
    failed_24h: int = Field(description="of them, those that failed")
    failure_rate: float | None = Field(description="failed_24h / attempts_24h; null without any")


class DeliveryList(_Strict):
    object: Literal["list"]
    data: list[Delivery]
    has_more: bool
    next_cursor: str | None
    request_id: str


class ReplayFilter(_Strict):
    """The fields that narrowed a replay; times as RFC 3339."""

    destination_id: str | None = None
    status: Literal["success", "failure", "pending"] | None = None
    event_types: list[str] | None = None
    replay_id: str | None = Field(default=None, description="the deliveries a replay re-queued")
    since: str | None = None
    until: str | None = None
    delivery_ids: list[str] | None = Field(default=None, description="the first 100")
    delivery_id_count: int | None = Field(default=None, description="when more than 100")


class ReplayOutcome(_Strict):
    """The replay's deliveries by status now; one a later replay re-queued counts there."""

    pending: int
    succeeded: int
    failed: int


class Replay(_Strict):
    id: str = Field(description="rpl_…")
    object: Literal["replay"]
    tenant_id: str | None = Field(description="null for an operator-wide replay")
    filter: ReplayFilter
    by: str = Field(
        description="who asked: api:<tenant>, portal:<tenant>, or operator (the CLI or the"
        " console: no operator's identity is shown to a tenant)"
    )
    created_at: str
    finished_at: str | None = Field(description="null while it runs, or if interrupted")
    cut_short: bool = Field(
        description="the daemon stopped it before it had re-queued every match"
        " (finished_at is then when it stopped, requeued how far it got)"
    )
    matched: int
    requeued: int
    outcome: ReplayOutcome
    request_id: str | None = Field(default=None, description="on a single replay")


class ReplayList(_Strict):
    object: Literal["list"]
    data: list[Replay]
    has_more: bool
    next_cursor: str | None
    request_id: str


class ReplayResult(_Strict):
    """What a replay request answers: a dry run counts (id null, nothing stored); a
    real one is the stored replay, with the sample it matched."""

    id: str | None = Field(description="rpl_…; null for a dry run")
    object: Literal["replay"]
    dry_run: bool
    matched: int
    requeued: int
    sample: list[Delivery]
    request_id: str
    tenant_id: str | None = None
    filter: ReplayFilter | None = None
    by: str | None = None
    created_at: str | None = None
    finished_at: str | None = None
    cut_short: bool | None = None
    outcome: ReplayOutcome | None = None


class Token(_Strict):
    """A session token (spec 000); ``token`` is shown here only."""

    id: str = Field(description="tok_…")
    object: Literal["token"]
    token: str = Field(description="tk_…; only its hash is stored")
    expires_at: str = Field(
        description="30 minutes after the last use; each use extends it by 30 minutes,"
        " never past 24 hours after created_at"
    )
    created_at: str
    request_id: str


class TokenRequest(_Strict):
    """POST /v2/token takes no body (an empty object is accepted)."""


class Health(_Open):
    status: str


# --- requests -------------------------------------------------------------------
class ReplayRequest(_Strict):
    status: Literal["success", "failure", "pending"] | None = None
    since: str | None = Field(
        default=None, description="RFC 3339 or a duration ago (2h); created at or after"
    )
    until: str | None = Field(
        default=None, description="RFC 3339 or a duration ago (2h); created before"
    )
    event_types: Annotated[list[_EventType], _documented(maxItems=MAX_EVENT_TYPES)] | None = None
    dry_run: bool = False


class RotateSecretRequest(_Strict):
    secret: str | None = Field(default=None, description="new whsec_ secret; generated if absent")


class EventCreate(_Strict):
    type: _EventType = Field(
        description="the event type; types under 'herald.' are Herald's own operational"
        " events and refused (422 event_type_reserved)"
    )
    data: dict[str, Any]
    id: Annotated[str, _documented(maxLength=255)] | None = Field(
        default=None, description="evt_… id; generated if absent"
    )
    created_at: str | None = Field(default=None, description="RFC 3339; default now")
    ordering_key: Annotated[str, _documented(minLength=1, maxLength=255)] | None = Field(
        default=None,
        description="events of one key reach a destination with ordering 'key' one at a"
        " time, in order (docs/ordering.md); 1 to 255 characters, no control characters",
    )


class _Aliased(_Strict):
    # ``schema`` would shadow BaseModel's: the field is ``schema_``, named by its alias.
    model_config = ConfigDict(extra="forbid", serialize_by_alias=True, validate_by_name=False)


class EventTypePut(_Aliased):
    description: Annotated[str, _documented(maxLength=2000)] = Field(
        default="", description="what the event means, for the people who subscribe"
    )
    schema_: dict[str, Any] | None = Field(
        default=None,
        alias="schema",
        description="a JSON Schema (draft 2020-12) every payload's data must match;"
        " null or absent: any data",
    )


class EventType(_Aliased):
    object: Literal["event_type"]
    type: str
    description: str
    schema_: dict[str, Any] | None = Field(alias="schema")
    builtin: bool = Field(description="Herald's own operational event type (herald.…)")
    created_at: str | None
    updated_at: str | None


class EventTypeList(_Strict):
    object: Literal["list"]
    data: list[EventType]
    has_more: bool
    next_cursor: str | None
    request_id: str


class FilterTestRequest(_Strict):
    filter: dict[str, Any] | None = Field(
        default=None,
        description="the filter to try; the destination's own when left out, none when null",
    )


class FilterTestEvent(Event):
    passes: bool = Field(description="whether the event passes the filter")


class FilterTestResult(_Strict):
    object: Literal["filter_test"]
    filter: dict[str, Any] | None
    tested: int = Field(description="how many events were tried (at most 50)")
    passed: int
    data: list[FilterTestEvent] = Field(
        description="the tenant's newest events of the destination's types, newest first"
    )


@dataclass(frozen=True)
class DestinationModels:
    """The models whose shape depends on the registered destination types."""

    create: type[BaseModel]
    update: type[BaseModel]
    destination: type[BaseModel]
    destination_list: type[BaseModel]
    rotated: type[BaseModel]
    type_names: tuple[str, ...]


def destination_models(registry: Registry) -> DestinationModels:
    names: list[str] = []
    create_fields: dict[str, Any] = {}
    update_fields: dict[str, Any] = {}
    out_fields: dict[str, Any] = {}
    for adapter in registry:
        config = adapter.config_model
        partial = create_model(
            f"{config.__name__}Update",
            __config__=ConfigDict(extra="forbid"),
            **dict.fromkeys(config.model_fields, (str | None, None)),
        )
        masked = create_model(
            f"{config.__name__}Out",
            __config__=ConfigDict(extra="forbid"),
            **dict.fromkeys(config.model_fields, (str | None, None)),
        )
        for name in registry.names_of(adapter.type_id):
            names.append(name)
            create_fields[name] = (config | None, None)
            update_fields[name] = (partial | None, None)
        out_fields[adapter.type_id] = (masked | None, None)
    type_field = Field(description="destination type", json_schema_extra={"enum": list[Any](names)})
    create = create_model(
        "DestinationCreate",
        __config__=ConfigDict(extra="forbid"),
        name=(_Name, ...),
        type=(str, type_field),
        events=(
            _Patterns,
            Field(
                description="event types, family patterns like a.* or *; * does not match"
                " Herald's operational events, which need herald.* or their own type"
            ),
        ),
        filter=_FILTER_FIELD,
        rate_limit_per_second=(float | None, _RATE_FIELD),
        circuit_breaker=(bool, Field(default=False, description=_BREAKER_FIELD.description)),
        ordering=(Literal["none", "key"], Field(default="none", description=_ORDERING)),
        **create_fields,
    )
    update = create_model(
        "DestinationUpdate",
        __config__=ConfigDict(extra="forbid"),
        name=(_Name | None, None),
        type=(_TypeName | None, None),
        events=(_Patterns | None, None),
        filter=_FILTER_FIELD,
        # The enum describes the string branch only: beside ``default: null`` at the top
        # it would make the default itself invalid (openapi-spec-validator refuses that).
        # The service checks the value (422 status_invalid), so pydantic does not.
        status=(
            Annotated[str, Field(json_schema_extra={"enum": ["active", "inactive"]})] | None,
            None,
        ),
        rate_limit_per_second=(float | None, _RATE_FIELD),
        circuit_breaker=(bool | None, Field(default=None, description=_BREAKER_FIELD.description)),
        ordering=(Literal["none", "key"] | None, Field(default=None, description=_ORDERING)),
        **update_fields,
    )
    destination = create_model(
        "Destination",
        __config__=ConfigDict(extra="forbid"),
        id=(str, ...),
        object=(Literal["event_destination"], ...),
        name=(str, ...),
        type=(str, ...),
        events=(list[str], ...),
        filter=(dict[str, Any] | None, None),
        status=(Literal["pending_verification", "active", "inactive"], ...),
        verification=(Verification, ...),
        health=(DestinationHealth | None, None),
        rate_limit_per_second=(float | None, _RATE_FIELD),
        circuit_breaker=(bool, ...),
        ordering=(Literal["none", "key"], Field(description=_ORDERING)),
        circuit=(
            CircuitState | None,
            Field(description="its circuit breaker's state; null when the breaker is off"),
        ),
        created_at=(str, ...),
        updated_at=(str, ...),
        deleted=(bool | None, None),
        deleted_at=(str | None, None),
        **out_fields,
    )
    destination_list = create_model(
        "DestinationList",
        __config__=ConfigDict(extra="forbid"),
        object=(Literal["list"], ...),
        data=(list[destination], ...),  # type: ignore[valid-type]
        has_more=(bool, ...),
        next_cursor=(str | None, ...),
        request_id=(str, ...),
    )
    rotated = create_model(
        "DestinationWithSecret",
        __base__=destination,
        secret=(
            str | None,
            Field(default=None, description="the generated signing secret, shown once"),
        ),
    )
    return DestinationModels(create, update, destination, destination_list, rotated, tuple(names))
