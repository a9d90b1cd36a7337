"""`herald run` delivering to SQS, Kinesis, S3 and EventBridge on moto's server.

The daemon is a subprocess; moto runs in a thread of this test process on
127.0.0.1, and every delivery is read back from it with boto3.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.conftest import HeraldFactory
from tests.e2e.test_delivery import rows, wait_active, wait_deliveries
from tests.integration.aws.support import (
    ACCESS_KEY,
    REGION,
    SECRET_KEY,
    MotoServer,
    eventbridge_to_queue,
    isolate_aws_environment,
    kinesis_records,
    receive_all,
    s3_objects,
    sqs_metadata,
)
from tests.support.api import Api, error_of

pytestmark = [pytest.mark.e2e, pytest.mark.backend_neutral]

N = 100
TYPE = "task_run.completed"
KEY_FORMAT = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z_(evt_\w+)\.json")


@pytest.fixture
def moto(monkeypatch: pytest.MonkeyPatch) -> Iterator[MotoServer]:
    isolate_aws_environment(monkeypatch)  # the daemon inherits this environment
    server = MotoServer().start()
    # moto keeps its state per process, not per server: start from nothing.
    server.reset()
    yield server
    server.stop()


def of_type(envelopes: list[dict[str, Any]]) -> list[str]:
    """The event ids of the ``TYPE`` events (the rest are verification pings)."""
    return [e["id"] for e in envelopes if e["type"] == TYPE]


async def test_hundred_events_to_one_destination_of_each_aws_type(
    herald_factory: HeraldFactory, moto: MotoServer
) -> None:
    sqs, kinesis, s3 = moto.client("sqs"), moto.client("kinesis"), moto.client("s3")
    queue_url = sqs.create_queue(QueueName="e2e")["QueueUrl"]
    kinesis.create_stream(StreamName="e2e", ShardCount=2)
    s3.create_bucket(Bucket="e2e-events")
    bus_queue_url = eventbridge_to_queue(moto, "e2e")

    h = herald_factory(start=False)
    await h.astart()
    creds = {"key": ACCESS_KEY, "secret": SECRET_KEY, "endpoint_url": moto.endpoint}
    configs: dict[str, dict[str, str]] = {
        "aws_sqs": {"queue_url": queue_url, **creds},
        # The spec's neutral names are accepted too, and answered with the canonical one.
        "cloudA_kinesis": {"stream_name": "e2e", "region": REGION, **creds},
        "aws_s3": {
            "bucket": "e2e-events",
            "region": REGION,
            "storage_class": "STANDARD_IA",
            **creds,
        },
        "cloudA_eventbridge": {
            "event_bus_name": "e2e",
            "region": REGION,
            "access_key_id": ACCESS_KEY,
            "secret_access_key": SECRET_KEY,
            "endpoint_url": moto.endpoint,
        },
    }
    created = await asyncio.gather(
        *(
            h.acli_json(
                "destinations",
                "create",
                "--data",
                json.dumps({"name": name, "type": name, name: config, "events": [TYPE]}),
            )
            for name, config in configs.items()
        )
    )
    for type_name, dest in zip(configs, created, strict=True):
        canonical = type_name.replace("cloudA_", "aws_")
        assert dest["type"] == canonical
        assert dest["status"] == "pending_verification"
        secret_field = "secret_access_key" if canonical == "aws_eventbridge" else "secret"
        assert dest[canonical][secret_field] == "********"
    # Verification is a real publish of destination.verification; its success activates.
    for dest in created:
        await wait_active(h, dest["id"], timeout=30)

    h.insert_events(rows(N, prefix="evt_aws", type_=TYPE))
    await wait_deliveries(h, "status = 'success' AND kind = 'event'", 4 * N, timeout=60)
    assert h.query("SELECT COUNT(*) FROM herald_deliveries WHERE status != 'success'") == [(0,)]
    expected = sorted(f"evt_aws{i:05d}" for i in range(N))

    messages = receive_all(sqs, queue_url, N + 1)
    assert sorted(of_type([json.loads(m["Body"]) for m in messages])) == expected
    for m in messages:
        meta = sqs_metadata(m)
        assert meta["event-id"] == json.loads(m["Body"])["id"]
        assert meta["tenant-id"] == "default"

    records = kinesis_records(kinesis, "e2e")
    assert len(records) == N + 1
    assert sorted(of_type([json.loads(r["Data"]) for r in records])) == expected
    assert all(json.loads(r["Data"])["id"] == r["PartitionKey"] for r in records)

    objects = s3_objects(s3, "e2e-events")
    assert len(objects) == N + 1
    assert {o["StorageClass"] for o in objects} == {"STANDARD_IA"}
    envelopes = []
    for o in objects:
        match = KEY_FORMAT.fullmatch(o["Key"])
        assert match, o["Key"]
        got = s3.get_object(Bucket="e2e-events", Key=o["Key"])
        assert got["ContentType"] == "application/json"
        envelope = json.loads(got["Body"].read())
        assert envelope["id"] == match.group(1) == got["Metadata"]["event-id"]
        envelopes.append(envelope)
    assert sorted(of_type(envelopes)) == expected

    routed = [json.loads(m["Body"]) for m in receive_all(sqs, bus_queue_url, N + 1)]
    assert sorted(of_type([r["detail"] for r in routed])) == expected
    assert {r["source"] for r in routed} == {"herald"}
    assert all(r["detail-type"] == r["detail"]["type"] for r in routed)

    assert await h.astop() == 0


async def test_unknown_s3_storage_class_is_422_over_the_api(api: Api) -> None:
    """Checked at create time against the classes botocore's S3 model lists, so a typo
    never reaches S3 (where every delivery would fail)."""
    config = {"bucket": "e2e-events", "region": REGION, "storage_class": "STANDARD_INFREQUENT"}
    status, _, body = await api.post(
        "/v2/event-destinations",
        json={"name": "s3", "type": "aws_s3", "aws_s3": config, "events": ["*"]},
    )
    assert status == 422, body
    error = error_of(body)
    assert (error["code"], error["field"]) == ("invalid_value", "aws_s3.storage_class")
    assert "unknown storage class 'STANDARD_INFREQUENT'" in error["message"]
    assert "STANDARD_IA" in error["message"]  # the classes that would do are listed
    assert (await api.get("/v2/event-destinations"))[2]["data"] == []
