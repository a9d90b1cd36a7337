"""``aws_kinesis`` against moto's Kinesis: data, partition key, region, errors."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from herald.adapters.aws_kinesis import KinesisAdapter, KinesisConfig
from herald.adapters.base import Adapter
from herald.model import Event, Outcome
from tests.contract.adapter_contract import AdapterContract, make_destination, make_event
from tests.integration.aws.conftest import AdapterFactory
from tests.integration.aws.support import (
    ACCESS_KEY,
    REGION,
    SECRET_KEY,
    MotoServer,
    closed_port,
    envelope_of,
    kinesis_records,
)


def creds() -> dict[str, str]:
    return {"key": ACCESS_KEY, "secret": SECRET_KEY}


async def deliver(adapter: Any, raw: dict[str, str], event: Event) -> Any:
    config = KinesisConfig.model_validate(raw)
    return await adapter.deliver(make_destination("aws_kinesis", config), config, event)


def record_of(records: list[Any], event: Event) -> Any:
    matching = [r for r in records if r["PartitionKey"] == event.id]
    assert len(matching) == 1, records
    return matching[0]


class TestKinesisContract(AdapterContract):
    adapter_class = KinesisAdapter

    @pytest.fixture(autouse=True)
    def _keep_moto(self, moto: MotoServer) -> None:
        self._moto = moto

    @pytest.fixture
    def good_config(self, moto: MotoServer) -> dict[str, str]:
        moto.client("kinesis").create_stream(StreamName="herald-contract", ShardCount=1)
        return {
            "stream_name": "herald-contract",
            "region": REGION,
            "endpoint_url": moto.endpoint,
            **creds(),
        }

    @pytest.fixture
    def missing_target_config(self, moto: MotoServer) -> dict[str, str]:
        return {"stream_name": "nope", "region": REGION, "endpoint_url": moto.endpoint, **creds()}

    @pytest.fixture
    def bad_credentials_config(
        self, moto: MotoServer, good_config: dict[str, str]
    ) -> Iterator[dict[str, str]]:
        with moto.iam_enforced():
            yield {**good_config, "key": "AKIAUNKNOWN000000000", "secret": "wrong"}

    @pytest.fixture
    def unreachable_config(self) -> dict[str, str]:
        closed = f"http://127.0.0.1:{closed_port()}"
        return {"stream_name": "s", "region": REGION, "endpoint_url": closed, **creds()}

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

    async def test_success_arrives_with_envelope_and_metadata(
        self, adapter: Adapter, good_config: dict[str, str]
    ) -> None:
        """The contract's check, less ``tenant-id``: a Kinesis record has no attributes
        and the design fixes the data as the envelope, which has no tenant field. The
        tenant is implied by the stream (a destination belongs to one tenant)."""
        event = make_event(tenant="acme")
        result = await self.publish(adapter, good_config, event)
        assert result.outcome is Outcome.SUCCESS, result
        got = await self.read_back(good_config, event)
        assert json.loads(got["body"]) == envelope_of(event)
        assert got["metadata"] == {
            "event-id": event.id,
            "event-type": event.type,
            "event-created-at": event.created_at,
        }


async def test_data_is_the_envelope_and_partition_key_the_event_id(
    moto: MotoServer, make_adapter: AdapterFactory
) -> None:
    kinesis = moto.client("kinesis")
    kinesis.create_stream(StreamName="events", ShardCount=4)
    adapter = make_adapter(KinesisAdapter)
    raw = {"stream_name": "events", "region": REGION, "endpoint_url": moto.endpoint, **creds()}
    sent = [make_event() for _ in range(5)]
    for event in sent:
        result = await deliver(adapter, raw, event)
        assert result.outcome is Outcome.SUCCESS, result
        assert result.status == 200
    records = kinesis_records(kinesis, "events")
    assert len(records) == 5
    for event in sent:
        assert record_of(records, event)["Data"] == event.envelope()


async def test_stream_in_another_region(moto: MotoServer, make_adapter: AdapterFactory) -> None:
    tokyo = moto.client("kinesis", region="ap-northeast-1")
    tokyo.create_stream(StreamName="far", ShardCount=1)
    raw = {"stream_name": "far", "region": "ap-northeast-1", "endpoint_url": moto.endpoint}
    event = make_event()
    result = await deliver(make_adapter(KinesisAdapter), {**raw, **creds()}, event)
    assert result.outcome is Outcome.SUCCESS, result
    record_of(kinesis_records(tokyo, "far"), event)
    # The same name in the default region does not exist there.
    elsewhere = await deliver(
        make_adapter(KinesisAdapter), {**raw, **creds(), "region": REGION}, event
    )
    assert elsewhere.outcome is Outcome.FAILURE_PERMANENT


async def test_missing_stream_is_a_permanent_failure_with_the_kinesis_code(
    moto: MotoServer, make_adapter: AdapterFactory
) -> None:
    raw = {"stream_name": "absent", "region": REGION, "endpoint_url": moto.endpoint, **creds()}
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
