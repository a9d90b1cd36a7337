"""Event types' schemas: 2020-12 checks naming the place, violations as data paths,
one compiled validator per schema text, and Herald's own types described."""

from __future__ import annotations

from typing import Any

import pytest

from herald.errors import ValidationError
from herald.eventschema import (
    MAX_VIOLATIONS,
    OPERATIONAL_CATALOG,
    check_schema,
    schema_text,
    validator_for,
    violations,
)
from herald.model import OPERATIONAL_TYPES

TASK_RUN: dict[str, Any] = {
    "type": "object",
    "required": ["task_run_id", "status"],
    "properties": {
        "task_run_id": {"type": "string"},
        "status": {"enum": ["queued", "running", "done"]},
        "steps": {"type": "array", "items": {"type": "object", "required": ["name"]}},
    },
}


def test_a_valid_schema_is_kept() -> None:
    assert check_schema(TASK_RUN) is TASK_RUN
    assert check_schema({"$schema": "https://json-schema.org/draft/2020-12/schema"})


@pytest.mark.parametrize(
    ("schema", "field"),
    [
        ([], "schema"),
        ({"type": "strin"}, "schema.type"),
        ({"properties": {"a": {"minLength": -1}}}, "schema.properties.a.minLength"),
        ({"required": "a"}, "schema.required"),
        ({"$schema": "http://json-schema.org/draft-07/schema#"}, "schema.$schema"),
        ({"description": "x" * 70_000}, "schema"),
    ],
)
def test_an_invalid_schema_is_refused_naming_the_place(schema: Any, field: str) -> None:
    with pytest.raises(ValidationError) as info:
        check_schema(schema)
    assert info.value.field == field
    assert info.value.code == "schema_invalid"


def test_violations_name_each_place_in_data() -> None:
    v = validator_for(schema_text(TASK_RUN))
    assert violations(v, {"task_run_id": "tr_1", "status": "done"}) == []
    found = violations(v, {"status": "lost", "steps": [{"name": "a"}, {}]})
    assert [path for path, _ in found] == ["data.task_run_id", "data.status", "data.steps[1].name"]
    assert '"lost" is not one of' in found[1][1]
    assert violations(v, {"task_run_id": 5, "status": "done"})[0][0] == "data.task_run_id"


def test_at_most_twenty_violations() -> None:
    schema = {"type": "object", "additionalProperties": {"type": "string"}}
    found = violations(validator_for(schema_text(schema)), {f"k{i}": i for i in range(50)})
    assert len(found) == MAX_VIOLATIONS


def test_one_validator_per_schema_text() -> None:
    a = validator_for(schema_text({"type": "object", "required": ["a"]}))
    b = validator_for(schema_text({"required": ["a"], "type": "object"}))
    assert a is b


def test_remote_refs_are_not_fetched_but_refused() -> None:
    with pytest.raises(ValidationError, match="does not fetch") as info:
        check_schema({"$ref": "https://example.invalid/schema.json"})
    assert info.value.field == "schema"
    local = {"$defs": {"id": {"type": "string"}}, "properties": {"a": {"$ref": "#/$defs/id"}}}
    assert violations(validator_for(schema_text(check_schema(local))), {"a": 1})[0][0] == "data.a"


def test_patterns_run_on_a_linear_engine() -> None:
    """``(a+)+$`` on a long run of a's and a '!': a backtracking engine would not return."""
    schema = check_schema({"properties": {"s": {"pattern": "^(a+)+$"}}})
    found = violations(validator_for(schema_text(schema)), {"s": "a" * 100_000 + "!"})
    assert [path for path, _ in found] == ["data.s"]
    with pytest.raises(ValidationError) as info:
        check_schema({"properties": {"s": {"pattern": "(a)\\1"}}})  # no back-references
    assert (info.value.field or "").startswith("schema")


def test_herald_types_are_described_with_valid_schemas() -> None:
    assert set(OPERATIONAL_CATALOG) == set(OPERATIONAL_TYPES)
    for description, schema in OPERATIONAL_CATALOG.values():
        assert description
        check_schema(schema)


def test_herald_types_schemas_accept_what_herald_writes() -> None:
    """Each operational event as :mod:`herald.signals` makes it matches its entry."""
    from herald.flow import BreakerSettings, Flow
    from herald.model import (
        Attempt,
        AttemptRecord,
        DeliveryKind,
        DeliveryStatus,
        DueDelivery,
        Event,
        Outcome,
    )
    from herald.signals import (
        DestinationState,
        circuits,
        episodes,
        exhausted,
        verification_failed,
    )

    def record(ok: bool, kind: DeliveryKind = DeliveryKind.EVENT) -> AttemptRecord:
        event = Event("evt_1", "acme", "a.b", "2026-11-22T10:00:00Z", 1.8e9, b"{}")
        outcome = Outcome.SUCCESS if ok else Outcome.FAILURE_RETRYABLE
        attempt = Attempt("att_1", "dlv_1", 3, 1.8e9, 1.0, outcome, 500, "HTTP 500")
        status = DeliveryStatus.SUCCESS if ok else DeliveryStatus.FAILURE
        return AttemptRecord(
            attempt, status, None, None, DueDelivery("dlv_1", "evtd_a", kind, 2, 3, event)
        )

    state = DestinationState("webhook", 0, None)
    failing, _ = episodes([record(False)], {"evtd_a": state}, failing_after=1, now=1.8e9)
    recovered, _ = episodes([record(True)], {"evtd_a": state}, failing_after=1, now=1.8e9 + 5)
    made = [*failing, *recovered]
    ran_out = exhausted(record(False), "webhook")
    assert ran_out is not None
    made.append(ran_out)
    made.append(verification_failed(record(False, DeliveryKind.VERIFICATION), "webhook"))
    # A circuit that opens after its failures, then closes on a probe's success.
    flow = Flow("evtd_a", breaker=True)
    settings = BreakerSettings(failures=1)
    kinds = {"evtd_a": "webhook"}
    opened, _ = circuits([record(False)], {"evtd_a": flow}, {}, kinds, settings=settings, now=1.8e9)
    shut, _ = circuits([record(True)], {"evtd_a": flow}, {}, kinds, settings=settings, now=1.9e9)
    made += [*opened, *shut]
    assert {s.type for s in made} == set(OPERATIONAL_TYPES)
    for signal in made:
        schema = OPERATIONAL_CATALOG[signal.type][1]
        assert violations(validator_for(schema_text(schema)), signal.data) == [], signal.type
