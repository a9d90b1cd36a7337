"""What a caller may send: the checks and limits of the fields of a request body.

The service layer (herald.service) validates every body with these, gathering
every field's problem into one error (:class:`Problems`); the API's schemas
(herald.api.schemas) document the same limits. Each limit is answered with
a 422 naming the field (docs/security.md); the webhook's own limits (url,
custom_headers) are in its config model (herald.adapters.webhook).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeVar

from herald.errors import BadRequest, HeraldError, ValidationError
from herald.ingest import control_problem
from herald.match import validate_event_type, validate_subscription

MAX_NAME_LENGTH = 255
MAX_TYPE_LENGTH = 64
"""A destination ``type`` (the names are short; a longer one is echoed nowhere)."""
MAX_PATTERNS = 100
"""Entries of a destination's ``events``."""
MAX_EVENT_TYPES = 100
"""Event types a delivery filter names (replay's ``event_types``)."""
MAX_CONFIG_VALUE = 16_384
"""Characters of any one field of a type's config object (a service account key
is about 2,400; the webhook's ``url`` has its own, tighter limit)."""


def str_field(
    body: Mapping[str, Any], name: str, *, required: bool, max_length: int | None = None
) -> str | None:
    """The string ``body[name]``, if present; its type and length checked."""
    value = body.get(name)
    if value is None:
        if required:
            raise ValidationError(f"{name} is required", field=name, code="field_required")
        return None
    if not isinstance(value, str):
        raise BadRequest(f"{name} must be a string", field=name, code="invalid_type")
    if max_length is not None and len(value) > max_length:
        raise ValidationError(
            f"{name} is longer than {max_length} characters", field=name, code="too_long"
        )
    return value


def name_field(body: Mapping[str, Any]) -> str | None:
    """A destination's ``name``, if present: 1 to 255 characters, none of them control."""
    name = str_field(body, "name", required=False)
    # The length as stored, not as stripped: spaces around a name are kept too.
    if name is not None and not (name.strip() and len(name) <= MAX_NAME_LENGTH):
        raise ValidationError(
            f"name must be 1 to {MAX_NAME_LENGTH} characters", field="name", code="name_invalid"
        )
    if name is not None and (problem := control_problem(name, "name")) is not None:
        raise ValidationError(problem, field="name", code="name_invalid")
    return name


FLOW_FIELDS = ("rate_limit_per_second", "circuit_breaker")
"""A destination's flow-control fields (herald.flow), beside its name and events."""

MAX_RATE_PER_SECOND = 1_000_000.0
"""The largest ``rate_limit_per_second`` (beyond it, a rate limit limits nothing)."""


def rate_field(body: Mapping[str, Any]) -> float | None:
    """A destination's ``rate_limit_per_second``: a number > 0, or null (or absent) for
    none."""
    value = body.get("rate_limit_per_second")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRequest(
            "rate_limit_per_second must be a number or null",
            field="rate_limit_per_second",
            code="invalid_type",
        )
    if not 0 < value <= MAX_RATE_PER_SECOND or value != value:
        raise ValidationError(
            f"rate_limit_per_second must be above 0 and at most {MAX_RATE_PER_SECOND:g}"
            " (null: no limit)",
            field="rate_limit_per_second",
            code="rate_limit_invalid",
        )
    return float(value)


def breaker_field(body: Mapping[str, Any]) -> bool | None:
    """A destination's ``circuit_breaker``: true or false; None when absent."""
    value = body.get("circuit_breaker")
    if value is None:
        return None
    if not isinstance(value, bool):
        raise BadRequest(
            "circuit_breaker must be true or false", field="circuit_breaker", code="invalid_type"
        )
    return value


def ordering_field(body: Mapping[str, Any]) -> Literal["none", "key"] | None:
    """A destination's ``ordering``: ``"none"`` or ``"key"``; None when absent."""
    value = body.get("ordering")
    if value is None:
        return None
    if not isinstance(value, str):
        raise BadRequest("ordering must be a string", field="ordering", code="invalid_type")
    if value == "key":
        return "key"
    if value == "none":
        return "none"
    raise ValidationError(
        "ordering must be 'none' or 'key'", field="ordering", code="ordering_invalid"
    )


def events_field(body: Mapping[str, Any], *, required: bool) -> tuple[str, ...] | None:
    """A destination's ``events``: valid patterns, at most :data:`MAX_PATTERNS`, deduplicated."""
    events = body.get("events")
    if events is None:
        if required:
            raise ValidationError("events is required", field="events", code="field_required")
        return None
    if not isinstance(events, list) or not all(isinstance(e, str) for e in events):
        raise BadRequest("events must be an array of strings", field="events", code="invalid_type")
    if not events:
        raise ValidationError(
            "events must name at least one event type or '*'", field="events", code="events_empty"
        )
    if len(events) > MAX_PATTERNS:
        raise ValidationError(
            f"events holds at most {MAX_PATTERNS} patterns", field="events", code="events_invalid"
        )
    for i, pattern in enumerate(events):
        try:
            validate_subscription(pattern)
        except ValidationError as exc:
            raise ValidationError(
                exc.message, field=f"events[{i}]", code="event_pattern_invalid"
            ) from exc
    return tuple(dict.fromkeys(events))


def check_event_types(event_types: tuple[str, ...], *, field: str = "event_types") -> None:
    """A filter's event types: at most :data:`MAX_EVENT_TYPES`, each a valid type."""
    if len(event_types) > MAX_EVENT_TYPES:
        raise ValidationError(
            f"{field} holds at most {MAX_EVENT_TYPES} event types",
            field=field,
            code="too_many_items",
        )
    for i, event_type in enumerate(event_types):
        try:
            validate_event_type(event_type)
        except ValueError as exc:
            name = field if len(event_types) == 1 else f"{field}[{i}]"
            raise ValidationError(str(exc), field=name, code="event_type_invalid") from exc


def config_lengths(used: str, raw: Mapping[str, Any]) -> None:
    """Each field of a type's config object within :data:`MAX_CONFIG_VALUE`. Checked
    after the type's own checks, whose limits (webhook.url's) are tighter;
    ``used`` is the key the caller gave the config object under."""
    for key, value in raw.items():
        if isinstance(value, str) and len(value) > MAX_CONFIG_VALUE:
            raise ValidationError(
                f"{used}.{key} is longer than {MAX_CONFIG_VALUE} characters",
                field=f"{used}.{key}",
                code="too_long",
            )


T = TypeVar("T")


class Problems:
    """The problems of one request body's fields, gathered so that one error names
    them all (the first, with the others in its ``also``), as the API's ``errors``
    array promises."""

    def __init__(self) -> None:
        self.found: list[HeraldError] = []

    def check(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
        """``fn(*args, **kwargs)``, or None with its problem kept."""
        try:
            return fn(*args, **kwargs)
        except (ValidationError, BadRequest) as exc:
            self.add(exc)
            return None

    def add(self, exc: HeraldError) -> None:
        """Keep ``exc`` and what rides with it, one problem per field."""
        for problem in (exc, *exc.also):
            if problem.field is None or not self.about(problem.field):
                self.found.append(problem)

    def about(self, field: str) -> bool:
        return any(p.field == field for p in self.found)

    def raise_any(self) -> None:
        if self.found:
            # A malformed field (400) leads, as it decides the status.
            first, *rest = sorted(self.found, key=lambda p: not isinstance(p, BadRequest))
            first.also = tuple(rest)
            raise first
