"""``aws_eventbridge`` against moto's EventBridge, read back through a rule into SQS."""

from __future__ import annotations

import json
from typing import Any

import pytest

from herald.adapters.aws_eventbridge import EventBridgeAdapter, EventBridgeConfig
from herald.model import Event, Outcome
from tests.contract.adapter_contract import make_event
from tests.integration.aws.conftest import (
    AdapterFactory,
    EnvelopeOnlyContract,
    FakeFactory,
    creds,
    deliver,
)
from tests.integration.aws.support import (
    REGION,
    MotoServer,
    envelope_of,
    eventbridge_to_queue,
    receive_all,
)


def routed(moto: MotoServer, queue_url: str, event: Event) -> dict[str, Any]:
    """The EventBridge event the bus's rule put into ``queue_url`` for ``event``."""
    messages = receive_all(moto.client("sqs"), queue_url, 1)
    bodies: list[dict[str, Any]] = [json.loads(m["Body"]) for m in messages]
    matching = [b for b in bodies if b["detail"]["id"] == event.id]
    assert len(matching) == 1, bodies
    return matching[0]


class TestEventBridgeContract(EnvelopeOnlyContract):
    adapter_class = EventBridgeAdapter

    def target(self, endpoint: str) -> dict[str, str]:
        return {"event_bus_name": "nope", "region": REGION}

    @pytest.fixture
    def good_config(self, moto: MotoServer) -> dict[str, str]:
        self._queue_url = eventbridge_to_queue(moto, "herald-contract")
        return self.config(moto.endpoint, event_bus_name="herald-contract", region=REGION)

    carries_traceparent = False  # a record has no attributes: only HTTP and attributes carry it

    async def read_back(self, config: dict[str, str], event: Event) -> dict[str, Any]:
        """EventBridge has no message attributes: the metadata is the event's own fields."""
        got = routed(self._moto, self._queue_url, event)
        return {
            "body": json.dumps(got["detail"]).encode(),
            "metadata": {
                "event-id": got["detail"]["id"],
                "event-type": got["detail-type"],
                "event-created-at": got["detail"]["created_at"],
            },
        }


async def test_detail_type_source_detail_and_time(
    moto: MotoServer, make_adapter: AdapterFactory
) -> None:
    queue_url = eventbridge_to_queue(moto, "orders")
    raw = {"event_bus_name": "orders", "region": REGION, "endpoint_url": moto.endpoint}
    event = make_event("task_run.interaction_required")
    result = await deliver(
        make_adapter(EventBridgeAdapter), {**raw, **creds(EventBridgeAdapter)}, event
    )
    assert result.outcome is Outcome.SUCCESS, result
    assert result.status == 200
    got = routed(moto, queue_url, event)
    assert got["detail-type"] == "task_run.interaction_required"
    assert got["source"] == "herald"
    assert got["detail"] == envelope_of(event)
    assert got["region"] == REGION
    # EventBridge keeps whole seconds; the nanoseconds stay in detail.created_at.
    assert got["time"] == "2026-11-22T10:00:00Z"


async def test_source_comes_from_the_config_key(
    moto: MotoServer, make_adapter: AdapterFactory
) -> None:
    queue_url = eventbridge_to_queue(moto, "custom", source="acme.events")
    adapter = make_adapter(EventBridgeAdapter, delivery={"eventbridge_source": "acme.events"})
    raw = {"event_bus_name": "custom", "region": REGION, "endpoint_url": moto.endpoint}
    event = make_event()
    assert (
        await deliver(adapter, {**raw, **creds(EventBridgeAdapter)}, event)
    ).outcome is Outcome.SUCCESS
    assert routed(moto, queue_url, event)["source"] == "acme.events"


async def test_bus_by_arn_in_another_region(moto: MotoServer, make_adapter: AdapterFactory) -> None:
    queue_url = eventbridge_to_queue(moto, "west", region="us-west-2")
    arn = "arn:aws:events:us-west-2:123456789012:event-bus/west"
    raw = {"event_bus_name": arn, "region": "us-west-2", "endpoint_url": moto.endpoint}
    event = make_event()
    result = await deliver(
        make_adapter(EventBridgeAdapter), {**raw, **creds(EventBridgeAdapter)}, event
    )
    assert result.outcome is Outcome.SUCCESS, result
    messages = receive_all(moto.client("sqs", region="us-west-2"), queue_url, 1)
    assert json.loads(messages[0]["Body"])["detail"]["id"] == event.id


async def test_missing_bus_is_a_permanent_failure_with_the_code(
    moto: MotoServer, make_adapter: AdapterFactory
) -> None:
    raw = {"event_bus_name": "absent", "region": REGION, "endpoint_url": moto.endpoint}
    result = await deliver(
        make_adapter(EventBridgeAdapter), {**raw, **creds(EventBridgeAdapter)}, make_event()
    )
    assert result.outcome is Outcome.FAILURE_PERMANENT
    assert result.error is not None
    assert result.error.startswith("ResourceNotFoundException: "), result.error


@pytest.mark.parametrize(
    ("code", "outcome"),
    [
        ("ThrottlingException", Outcome.FAILURE_RETRYABLE),
        ("InternalFailure", Outcome.FAILURE_RETRYABLE),
        ("NotAuthorizedForSourceException", Outcome.FAILURE_PERMANENT),
        ("InvalidArgument", Outcome.FAILURE_PERMANENT),
    ],
)
async def test_a_failed_entry_is_a_failed_attempt_with_its_code(
    fake_aws: FakeFactory,
    make_adapter: AdapterFactory,
    code: str,
    outcome: Outcome,
) -> None:
    # moto fails entries only for inputs Herald never sends, so a stand-in answers
    # the 200-with-FailedEntryCount response AWS gives.
    fake = await fake_aws(entry_error=code, message="entry refused")
    raw = {
        "event_bus_name": "b",
        "region": REGION,
        "endpoint_url": fake.url,
        **creds(EventBridgeAdapter),
    }
    result = await deliver(make_adapter(EventBridgeAdapter), raw, make_event())
    assert result.outcome is outcome
    assert result.status == 200
    assert result.error == f"{code}: entry refused"
    assert fake.requests == ["AWSEvents.PutEvents"]


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ({"event_bus_name": "b"}, "region"),
        ({"event_bus_name": "has space", "region": REGION}, "event bus name"),
        ({"event_bus_name": "b", "region": REGION, "access_key_id": "AKIA"}, "go together"),
        ({"event_bus_name": "b", "region": REGION, "key": "AKIA", "secret": "s"}, "Extra"),
    ],
)
def test_invalid_configs_are_refused(raw: dict[str, str], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        EventBridgeConfig.model_validate(raw)
