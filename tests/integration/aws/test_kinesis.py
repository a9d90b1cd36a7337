"""``aws_kinesis`` against moto's Kinesis: data, partition key, region, errors."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

import pytest

from herald.adapters.aws_kinesis import KinesisAdapter, KinesisConfig, partition_key
from herald.model import Destination, Event, Outcome
from tests.contract.adapter_contract import make_destination, make_event
from tests.integration.aws.conftest import (
    AdapterFactory,
    EnvelopeOnlyContract,
    creds,
    deliver,
)
from tests.integration.aws.support import REGION, MotoServer, kinesis_records


def record_of(records: list[Any], event: Event) -> Any:
    matching = [r for r in records if r["PartitionKey"] == event.id]
    assert len(matching) == 1, records
    return matching[0]


class TestKinesisContract(EnvelopeOnlyContract):
    adapter_class = KinesisAdapter

    def target(self, endpoint: str) -> dict[str, str]:
        return {"stream_name": "nope", "region": REGION}

    @pytest.fixture
    def good_config(self, moto: MotoServer) -> dict[str, str]:
        moto.client("kinesis").create_stream(StreamName="herald-contract", ShardCount=1)
        return self.config(moto.endpoint, stream_name="herald-contract", region=REGION)

    carries_traceparent = False  # a record has no attributes: only HTTP and attributes carry it

    async def read_back(self, config: dict[str, str], event: Event) -> dict[str, Any]:
        """A record has only data and a partition key: the metadata is what those carry."""
        kinesis = self._moto.client("kinesis", region=config["region"])
        record = record_of(kinesis_records(kinesis, config["stream_name"]), event)
        envelope = json.loads(record["Data"])
        return {
            "body": record["Data"],
            "metadata": {
                "event-id": record["PartitionKey"],
                "event-type": envelope["type"],
                "event-created-at": envelope["created_at"],
            },
        }


async def test_data_is_the_envelope_and_partition_key_the_event_id(
    moto: MotoServer, make_adapter: AdapterFactory
) -> None:
    kinesis = moto.client("kinesis")
    kinesis.create_stream(StreamName="events", ShardCount=4)
    adapter = make_adapter(KinesisAdapter)
    raw = {
        "stream_name": "events",
        "region": REGION,
        "endpoint_url": moto.endpoint,
        **creds(KinesisAdapter),
    }
    sent = [make_event() for _ in range(5)]
    for event in sent:
        result = await deliver(adapter, raw, event)
        assert result.outcome is Outcome.SUCCESS, result
        assert result.status == 200
    records = kinesis_records(kinesis, "events")
    assert len(records) == 5
    for event in sent:
        assert record_of(records, event)["Data"] == event.envelope()


async def test_an_ordered_destination_partitions_by_the_ordering_key(
    moto: MotoServer, make_adapter: AdapterFactory
) -> None:
    """Ordered destination: a keyed event's partition key is its ordering key, so one
    key's records share a shard, in the order sent; an unkeyed event, and any event of
    an unordered destination, keeps the event id."""
    kinesis = moto.client("kinesis")
    kinesis.create_stream(StreamName="ordered", ShardCount=4)
    adapter = make_adapter(KinesisAdapter)
    config = KinesisConfig.model_validate(
        {
            "stream_name": "ordered",
            "region": REGION,
            "endpoint_url": moto.endpoint,
            **creds(KinesisAdapter),
        }
    )
    base = make_destination(adapter.type_id, config)
    ordered, unordered = (dataclasses.replace(base, ordering=o) for o in ("key", "none"))
    plan: list[tuple[Destination, str | None]] = [(ordered, f"order-{i % 3}") for i in range(9)]
    plan += [(ordered, None), (unordered, "order-0")]
    sent = []
    for dest, key in plan:
        event = make_event()
        event.ordering_key = key
        sent.append(event)
        result = await adapter.deliver(dest, config, event)
        assert result.outcome is Outcome.SUCCESS, result
    records = kinesis_records(kinesis, "ordered")
    by_id = {json.loads(r["Data"])["id"]: r for r in records}
    expected = [f"order-{i % 3}" for i in range(9)] + [sent[9].id, sent[10].id]
    assert [by_id[e.id]["PartitionKey"] for e in sent] == expected
    # One key's records, read back from the stream, in the order they were sent.
    for key in ("order-0", "order-1", "order-2"):
        ids = [json.loads(r["Data"])["id"] for r in records if r["PartitionKey"] == key]
        assert ids == [
            e.id for (d, k), e in zip(plan, sent, strict=True) if k == key and d is ordered
        ]


def test_an_overlong_ordering_key_is_hashed_to_a_partition_key() -> None:
    config = KinesisConfig.model_validate({"stream_name": "s", "region": REGION})
    dest = dataclasses.replace(make_destination("aws_kinesis", config), ordering="key")
    event = make_event()
    event.ordering_key = "k" * 300
    assert partition_key(dest, event) == hashlib.sha256(b"k" * 300).hexdigest()
    event.ordering_key = "k" * 256
    assert partition_key(dest, event) == "k" * 256


async def test_stream_in_another_region(moto: MotoServer, make_adapter: AdapterFactory) -> None:
    tokyo = moto.client("kinesis", region="ap-northeast-1")
    tokyo.create_stream(StreamName="far", ShardCount=1)
    raw = {"stream_name": "far", "region": "ap-northeast-1", "endpoint_url": moto.endpoint}
    event = make_event()
    result = await deliver(make_adapter(KinesisAdapter), {**raw, **creds(KinesisAdapter)}, event)
    assert result.outcome is Outcome.SUCCESS, result
    record_of(kinesis_records(tokyo, "far"), event)
    # The same name in the default region does not exist there.
    elsewhere = await deliver(
        make_adapter(KinesisAdapter), {**raw, **creds(KinesisAdapter), "region": REGION}, event
    )
    assert elsewhere.outcome is Outcome.FAILURE_PERMANENT


async def test_missing_stream_is_a_permanent_failure_with_the_kinesis_code(
    moto: MotoServer, make_adapter: AdapterFactory
) -> None:
    raw = {
        "stream_name": "absent",
        "region": REGION,
        "endpoint_url": moto.endpoint,
        **creds(KinesisAdapter),
    }
    result = await deliver(make_adapter(KinesisAdapter), raw, make_event())
    assert result.outcome is Outcome.FAILURE_PERMANENT
    assert result.error is not None
    assert result.error.startswith("ResourceNotFoundException: "), result.error
    assert result.status == 400


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ({"stream_name": "s"}, "region"),
        ({"stream_name": "has space", "region": REGION}, "letters, digits"),
        ({"stream_name": "s", "region": "Europe West"}, "region identifier"),
        ({"stream_name": "s", "region": REGION, "secret": "x"}, "go together"),
    ],
)
def test_invalid_configs_are_refused(raw: dict[str, str], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        KinesisConfig.model_validate(raw)
