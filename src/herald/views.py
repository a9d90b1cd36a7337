"""The JSON representations the API and the CLI's ``--json`` share."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import orjson

from herald.config import MASK
from herald.model import (
    Attempt,
    Delivery,
    Destination,
    DestinationHealth,
    DestinationStatus,
    Event,
    EventType,
    Replay,
    ReplayResult,
)
from herald.signals import REVERIFY
from herald.timeutil import format_epoch

if TYPE_CHECKING:
    from herald.adapters.registry import Registry


def _ts(value: float | None) -> str | None:
    return None if value is None else format_epoch(value)


def destination_view(dest: Destination, registry: Registry) -> dict[str, Any]:
    type_config: dict[str, Any] = {k: v for k, v in dest.config.items() if not k.startswith("_")}
    for name in dest.secrets:
        if not name.startswith("_"):
            type_config[name] = MASK
    view: dict[str, Any] = {
        "id": dest.id,
        "object": "event_destination",
        "name": dest.name,
        "type": dest.type,
        dest.type: type_config,
        "events": list(dest.events),
        "filter": dest.filter,
        "status": dest.status.value,
        "verification": verification_view(dest),
        "rate_limit_per_second": dest.rate_limit_per_second,
        "circuit_breaker": dest.circuit_breaker,
        "ordering": dest.ordering,
        "circuit": circuit_view(dest),
        "created_at": _ts(dest.created_at),
        "updated_at": _ts(dest.updated_at),
    }
    if dest.deleted_at is not None:
        view["deleted"] = True
        view["deleted_at"] = _ts(dest.deleted_at)
    return view


def circuit_view(dest: Destination) -> dict[str, Any] | None:
    """Where its circuit breaker stands (herald.flow); None when the breaker is off."""
    if not dest.circuit_breaker:
        return None
    circuit = dest.circuit
    if circuit is None:
        return {"state": "closed", "opened_at": None, "next_probe_at": None}
    return {
        "state": circuit.state,
        "opened_at": _ts(circuit.opened_at),
        "next_probe_at": _ts(circuit.next_probe_at),
    }


def health_view(health: DestinationHealth | None) -> dict[str, Any]:
    """How a destination has been answering (the recorder's counters): its last
    success and failure, and its attempts and failure rate over the last 24 hours
    (``failure_rate`` null without an attempt)."""
    health = health or DestinationHealth()
    return {
        "last_success_at": _ts(health.last_success_at),
        "last_failure_at": _ts(health.last_failure_at),
        "attempts_24h": health.successes + health.failures,
        "failed_24h": health.failures,
        "failure_rate": None if health.failure_rate is None else round(health.failure_rate, 4),
    }


def rate_text(health: DestinationHealth | None) -> str:
    """A failure rate for people: ``25 % (1 of 4)``, ``-`` without an attempt."""
    if health is None or health.failure_rate is None:
        return "-"
    shown = f"{health.failure_rate * 100:.1f}".removesuffix(".0")
    return f"{shown} % ({health.failures} of {health.successes + health.failures})"


def verification_view(dest: Destination) -> dict[str, Any]:
    """Where the destination's verification stands: ``verified``, ``pending`` (a ping is
    being retried) or ``failed`` (it ran out of attempts; the status stays
    ``pending_verification`` until a new ping, ``reverify``, succeeds)."""
    if dest.status is not DestinationStatus.PENDING_VERIFICATION:
        state = "verified"
    elif dest.verification_failed_at is not None:
        state = "failed"
    else:
        state = "pending"
    return {
        "state": state,
        "failed_at": _ts(dest.verification_failed_at) if state == "failed" else None,
        "last_error": dest.verification_error if state == "failed" else None,
        "reverify": REVERIFY.format(id=dest.id) if state != "verified" else None,
    }


def verification_attempt_view(a: Attempt | None) -> dict[str, Any] | None:
    """The last attempt of a destination's newest verification ping: why it is still
    pending (``verification.last_attempt`` on a read of one destination)."""
    if a is None:
        return None
    return {
        "started_at": _ts(a.started_at),
        "outcome": a.outcome.value,
        "response_status": a.response_status,
        "error": a.error,
    }


def attempt_said(a: Mapping[str, Any]) -> str:
    """What an attempt's view says went wrong, for people: its error (or outcome), after
    its HTTP status unless the error names it already."""
    said = str(a.get("error") or a["outcome"])
    status = a.get("response_status")
    if status is not None and not said.startswith("HTTP"):
        said = f"HTTP {status}: {said}"
    return said


def attempt_view(a: Attempt) -> dict[str, Any]:
    return {
        "id": a.id,
        "object": "event_delivery_attempt",
        "number": a.number,
        "started_at": _ts(a.started_at),
        "duration_ms": round(a.duration_ms),
        "outcome": a.outcome.value,
        "response_status": a.response_status,
        "error": a.error,
        "response_excerpt": a.response_excerpt,
    }


def delivery_view(d: Delivery, *, with_attempts: bool = False) -> dict[str, Any]:
    view: dict[str, Any] = {
        "id": d.id,
        "object": "event_delivery",
        "event_id": d.event_id,
        "event_type": d.event_type,
        "destination_id": d.destination_id,
        "status": d.status.value,
        "attempt_count": d.attempt_count,
        "next_attempt_at": _ts(d.next_attempt_at) if d.status.value == "pending" else None,
        "held": d.held,
        "created_at": _ts(d.created_at),
        "updated_at": _ts(d.updated_at),
        "last_attempt": attempt_view(d.last_attempt) if d.last_attempt else None,
        "replay_id": d.replay_id,
    }
    if with_attempts:
        view["attempts"] = [attempt_view(a) for a in d.attempts]
    return view


def event_view(e: Event) -> dict[str, Any]:
    return {
        "id": e.id,
        "object": "event",
        "type": e.type,
        "created_at": e.created_at,
        "data": orjson.loads(e.data),
        "ordering_key": e.ordering_key,
    }


def event_type_view(entry: EventType) -> dict[str, Any]:
    """One entry of a tenant's event-type catalog; Herald's own have no times."""
    return {
        "object": "event_type",
        "type": entry.type,
        "description": entry.description,
        "schema": entry.schema,
        "builtin": entry.builtin,
        "created_at": None if entry.builtin else _ts(entry.created_at),
        "updated_at": None if entry.builtin else _ts(entry.updated_at),
    }


def filter_test_view(
    spec: dict[str, Any] | None, results: list[tuple[Event, bool]]
) -> dict[str, Any]:
    """What a filter's test answers: each event tried and whether it passes."""
    return {
        "object": "filter_test",
        "filter": spec,
        "tested": len(results),
        "passed": sum(ok for _, ok in results),
        "data": [{**event_view(e), "passes": ok} for e, ok in results],
    }


def replay_by(by: str, tenant_id: str) -> str:
    """Who made a replay, as its tenant reads it: its own API key or portal session
    (``api:<tenant>``, ``portal:<tenant>``), or else ``operator`` — never an
    operator's identity (``cli:<user>``, ``console:<key id>``)."""
    return by if by in (f"api:{tenant_id}", f"portal:{tenant_id}") else "operator"


def replay_view(r: Replay, *, for_tenant: str | None = None) -> dict[str, Any]:
    """A replay and its outcome: its deliveries by status now (those a later replay
    took over count there). ``for_tenant``: as that tenant reads it (:func:`replay_by`)."""
    return {
        "id": r.id,
        "object": "replay",
        "tenant_id": r.tenant_id,
        "filter": r.filter,
        "by": r.by if for_tenant is None else replay_by(r.by, for_tenant),
        "created_at": _ts(r.created_at),
        "finished_at": _ts(r.finished_at),
        "cut_short": r.cut_short,
        "matched": r.matched,
        "requeued": r.requeued,
        "outcome": {
            "pending": r.outcome.pending,
            "succeeded": r.outcome.succeeded,
            "failed": r.outcome.failed,
        },
    }


def replay_result_view(result: ReplayResult) -> dict[str, Any]:
    """A replay request's answer: the stored replay and its sample, or for a dry run
    (``id`` null) the count and the sample only."""
    view: dict[str, Any] = {"id": None} if result.replay is None else replay_view(result.replay)
    view.update(
        object="replay",
        dry_run=result.dry_run,
        matched=result.matched,
        requeued=result.requeued,
        sample=[delivery_view(d) for d in result.sample],
    )
    return view


def list_view(
    data: list[dict[str, Any]], *, has_more: bool, next_cursor: str | None, request_id: str
) -> dict[str, Any]:
    return {
        "object": "list",
        "data": data,
        "has_more": has_more,
        "next_cursor": next_cursor,
        "request_id": request_id,
    }
