"""``aws_sqs`` against moto's SQS: what arrives, FIFO ids, region, credentials, errors."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal

import pytest

from herald.adapters.aws_sqs import SQSAdapter, SQSConfig, fifo_id, region_from_queue_url
from herald.model import Event, Outcome
from tests.contract.adapter_contract import make_destination, make_event
from tests.integration.aws.conftest import AdapterFactory, AWSContract, creds, deliver
from tests.integration.aws.support import (
    ACCOUNT,
    MotoServer,
    envelope_of,
    receive_all,
    sqs_metadata,
)


def find(messages: list[Any], event: Event) -> Any:
    matching = [m for m in messages if json.loads(m["Body"])["id"] == event.id]
    assert len(matching) == 1, messages
    return matching[0]


class TestSQSContract(AWSContract):
    adapter_class = SQSAdapter

    def target(self, endpoint: str) -> dict[str, str]:
        return {"queue_url": f"{endpoint}/{ACCOUNT}/no-such-queue"}

    @pytest.fixture
    def good_config(self, moto: MotoServer) -> dict[str, str]:
        url = moto.client("sqs").create_queue(QueueName="herald-contract")["QueueUrl"]
        return self.config(moto.endpoint, queue_url=url)

    async def read_back(self, config: dict[str, str], event: Event) -> dict[str, Any]:
        # ``moto`` is reset per test, so the contract's queue holds only this test's messages.
        sqs = self._moto.client("sqs")
        message = find(receive_all(sqs, config["queue_url"], 1), event)
        return {"body": message["Body"].encode(), "metadata": sqs_metadata(message)}


async def test_attributes_are_strings_named_as_the_design_says(
    moto: MotoServer, make_adapter: AdapterFactory
) -> None:
    sqs = moto.client("sqs")
    url = sqs.create_queue(QueueName="plain")["QueueUrl"]
    event = make_event("task_run.failed", tenant="acme")
    result = await deliver(
        make_adapter(SQSAdapter),
        {"queue_url": url, "endpoint_url": moto.endpoint, **creds(SQSAdapter)},
        event,
    )
    assert result.outcome is Outcome.SUCCESS, result
    assert result.status == 200
    (message,) = receive_all(sqs, url, 1)
    assert json.loads(message["Body"]) == envelope_of(event)
    assert message["MessageAttributes"] == {
        "event-id": {"DataType": "String", "StringValue": event.id},
        "event-type": {"DataType": "String", "StringValue": "task_run.failed"},
        "event-created-at": {"DataType": "String", "StringValue": event.created_at},
        "tenant-id": {"DataType": "String", "StringValue": "acme"},
    }


async def test_fifo_queue_groups_by_destination_and_deduplicates_by_event_id(
    moto: MotoServer, make_adapter: AdapterFactory
) -> None:
    """Events without an ordering key share one group per destination."""
    sqs = moto.client("sqs")
    url = sqs.create_queue(QueueName="events.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
    adapter = make_adapter(SQSAdapter)
    config = SQSConfig.model_validate(
        {"queue_url": url, "endpoint_url": moto.endpoint, **creds(SQSAdapter)}
    )
    dest = make_destination(adapter.type_id, config)
    event = make_event(tenant="acme")
    for _ in range(2):  # a resend (at-least-once) is dropped by the queue
        assert (await adapter.deliver(dest, config, event)).outcome is Outcome.SUCCESS
    other = make_event(tenant="acme")
    assert (await adapter.deliver(dest, config, other)).outcome is Outcome.SUCCESS
    messages = receive_all(sqs, url, 2)
    assert [json.loads(m["Body"])["id"] for m in messages] == [event.id, other.id]
    attrs = messages[0]["Attributes"]
    assert attrs["MessageGroupId"] == dest.id
    assert attrs["MessageDeduplicationId"] == event.id
    counts = sqs.get_queue_attributes(
        QueueUrl=url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    assert counts == {
        "ApproximateNumberOfMessages": "0",  # the resend was deduplicated
        "ApproximateNumberOfMessagesNotVisible": "2",
    }


@pytest.mark.parametrize("ordering", ["key", "none"])
async def test_fifo_queue_groups_by_the_ordering_key_ordered_or_not(
    moto: MotoServer, make_adapter: AdapterFactory, ordering: Literal["none", "key"]
) -> None:
    """A FIFO queue needs a group for every message: the event's ordering key (hashed
    when SQS would refuse it), the destination id without one; the event id is the
    deduplication id. The same for an ordered destination and an unordered one."""
    sqs = moto.client("sqs")
    url = sqs.create_queue(QueueName="keyed.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
    adapter = make_adapter(SQSAdapter)
    config = SQSConfig.model_validate(
        {"queue_url": url, "endpoint_url": moto.endpoint, **creds(SQSAdapter)}
    )
    dest = dataclasses.replace(make_destination(adapter.type_id, config), ordering=ordering)
    keys = ["order-1", "order-2", "order-1", None, "customer 7/ü"]
    sent = []
    for key in keys:
        event = make_event()
        event.ordering_key = key
        sent.append(event)
        assert (await adapter.deliver(dest, config, event)).outcome is Outcome.SUCCESS
    got = {json.loads(m["Body"])["id"]: m["Attributes"] for m in receive_all(sqs, url, 5)}
    assert [got[e.id]["MessageGroupId"] for e in sent] == [
        "order-1",
        "order-2",
        "order-1",
        dest.id,
        fifo_id("customer 7/ü"),  # outside SQS's alphabet: its SHA-256, still one group
    ]
    assert [got[e.id]["MessageDeduplicationId"] for e in sent] == [e.id for e in sent]


async def test_a_standard_queue_gets_no_group_even_for_an_ordered_destination(
    moto: MotoServer, make_adapter: AdapterFactory
) -> None:
    sqs = moto.client("sqs")
    url = sqs.create_queue(QueueName="standard")["QueueUrl"]
    adapter = make_adapter(SQSAdapter)
    config = SQSConfig.model_validate(
        {"queue_url": url, "endpoint_url": moto.endpoint, **creds(SQSAdapter)}
    )
    dest = dataclasses.replace(make_destination(adapter.type_id, config), ordering="key")
    event = make_event()
    event.ordering_key = "order-1"
    assert (await adapter.deliver(dest, config, event)).outcome is Outcome.SUCCESS
    (message,) = receive_all(sqs, url, 1)
    assert "MessageGroupId" not in message["Attributes"]


def test_fifo_ids_sqs_would_refuse_are_hashed() -> None:
    assert fifo_id("evt_123") == "evt_123"
    hashed = fifo_id("tenant with spaces")
    assert len(hashed) == 64
    assert hashed == fifo_id("tenant with spaces")
    assert fifo_id("x" * 129) != "x" * 129


async def test_region_comes_from_the_queue_url(
    moto: MotoServer, make_adapter: AdapterFactory
) -> None:
    eu = moto.client("sqs", region="eu-west-1")
    eu.create_queue(QueueName="in-ireland")
    # The AWS form of the URL; endpoint_url only redirects the connection to moto,
    # which files the queue under the region the request is signed for.
    url = f"https://sqs.eu-west-1.amazonaws.com/{ACCOUNT}/in-ireland"
    adapter = make_adapter(SQSAdapter)
    raw = {"queue_url": url, "endpoint_url": moto.endpoint, **creds(SQSAdapter)}
    event = make_event()
    result = await deliver(adapter, raw, event)
    assert result.outcome is Outcome.SUCCESS, result
    local_url = eu.get_queue_url(QueueName="in-ireland")["QueueUrl"]
    find(receive_all(eu, local_url, 1), event)
    assert isinstance(adapter, SQSAdapter)
    assert adapter.client_key(SQSConfig.model_validate(raw)).region == "eu-west-1"


@pytest.mark.parametrize(
    ("url", "region"),
    [
        ("https://sqs.eu-west-1.amazonaws.com/123456789012/q", "eu-west-1"),
        ("https://sqs-fips.us-gov-west-1.amazonaws.com/123456789012/q", "us-gov-west-1"),
        ("https://ap-southeast-2.queue.amazonaws.com/123456789012/q", "ap-southeast-2"),
        ("https://queue.amazonaws.com/123456789012/q", "us-east-1"),
        ("https://sqs.cn-north-1.amazonaws.com.cn/123456789012/q", "cn-north-1"),
        ("https://sqs.eu-central-2.api.aws/123456789012/q", "eu-central-2"),
        ("https://vpce-0a1b-c2d3.sqs.us-east-2.vpce.amazonaws.com/123456789012/q", "us-east-2"),
        ("http://sqs.us-east-1.localhost.localstack.cloud:4566/000000000000/q", "us-east-1"),
        ("http://127.0.0.1:5000/123456789012/q", None),
        ("https://queue-host-1.internal/123456789012/q", None),
    ],
)
def test_region_from_queue_url(url: str, region: str | None) -> None:
    assert region_from_queue_url(url) == region


async def test_a_url_without_region_uses_the_environment_default(
    monkeypatch: pytest.MonkeyPatch, make_adapter: AdapterFactory
) -> None:
    raw = {"queue_url": "http://127.0.0.1:5000/123456789012/q"}
    adapter = make_adapter(SQSAdapter)
    assert isinstance(adapter, SQSAdapter)
    assert adapter.client_key(SQSConfig.model_validate(raw)).region == "us-east-1"
    monkeypatch.setenv("AWS_DEFAULT_REGION", "sa-east-1")
    later = make_adapter(SQSAdapter)
    assert isinstance(later, SQSAdapter)
    assert later.client_key(SQSConfig.model_validate(raw)).region == "sa-east-1"


async def test_wrong_queue_url_is_a_permanent_failure_with_the_sqs_code(
    moto: MotoServer, make_adapter: AdapterFactory
) -> None:
    raw = {
        "queue_url": f"{moto.endpoint}/{ACCOUNT}/never-created",
        "endpoint_url": moto.endpoint,
        **creds(SQSAdapter),
    }
    result = await deliver(make_adapter(SQSAdapter), raw, make_event())
    assert result.outcome is Outcome.FAILURE_PERMANENT
    assert result.status == 400
    assert result.error is not None
    assert result.error.startswith("AWS.SimpleQueueService.NonExistentQueue: "), result.error


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ({"queue_url": "sqs/orders"}, "full queue URL"),
        ({"queue_url": "https://sqs.us-east-1.amazonaws.com/"}, "queue name"),
        ({"queue_url": "https://h/1/q", "key": "AKIA"}, "go together"),
        ({"queue_url": "https://h/1/q", "session": "tok"}, "session needs"),
        ({"queue_url": "https://h/1/q", "endpoint_url": "localhost:4566"}, "absolute"),
        ({"queue_url": "https://h/1/q", "region": "eu-west-1"}, "Extra inputs"),
    ],
)
def test_invalid_configs_are_refused(raw: dict[str, str], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        SQSConfig.model_validate(raw)
