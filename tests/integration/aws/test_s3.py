"""``aws_s3`` against moto's S3: key format, content type, storage class, metadata, errors."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from email.header import decode_header
from typing import Any

import pytest

from herald.adapters.aws_s3 import S3Adapter, S3Config, object_key, storage_classes
from herald.errors import ValidationError
from herald.model import Event, Outcome
from tests.contract.adapter_contract import make_event
from tests.integration.aws.conftest import AdapterFactory, AWSContract, creds, deliver
from tests.integration.aws.support import REGION, MotoServer, envelope_of, s3_objects
from tests.integration.conftest import Harness

KEY_FORMAT = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z_evt_\w+\.json")


class TestS3Contract(AWSContract):
    adapter_class = S3Adapter

    def target(self, endpoint: str) -> dict[str, str]:
        return {"bucket": "no-such-bucket", "region": REGION}

    @pytest.fixture
    def good_config(self, moto: MotoServer) -> dict[str, str]:
        moto.client("s3").create_bucket(Bucket="herald-contract")
        return self.config(moto.endpoint, bucket="herald-contract", region=REGION)

    async def read_back(self, config: dict[str, str], event: Event) -> dict[str, Any]:
        s3 = self._moto.client("s3", region=config["region"])
        obj = s3.get_object(Bucket=config["bucket"], Key=object_key(event))
        return {"body": obj["Body"].read(), "metadata": obj["Metadata"]}


async def test_object_key_content_type_storage_class_and_metadata(
    moto: MotoServer, make_adapter: AdapterFactory
) -> None:
    s3 = moto.client("s3")
    s3.create_bucket(Bucket="events")
    raw = {
        "bucket": "events",
        "region": REGION,
        "storage_class": "STANDARD_IA",
        "endpoint_url": moto.endpoint,
        **creds(S3Adapter),
    }
    event = make_event("task_run.completed", tenant="acme")
    result = await deliver(make_adapter(S3Adapter), raw, event)
    assert result.outcome is Outcome.SUCCESS, result
    assert result.status == 200
    (listed,) = s3_objects(s3, "events")
    assert listed["Key"] == f"2026-11-22T10:00:00.123456789Z_{event.id}.json"
    assert KEY_FORMAT.fullmatch(listed["Key"])
    assert listed["StorageClass"] == "STANDARD_IA"
    obj = s3.get_object(Bucket="events", Key=listed["Key"])
    assert obj["ContentType"] == "application/json"
    assert obj["StorageClass"] == "STANDARD_IA"
    assert json.loads(obj["Body"].read()) == envelope_of(event)
    assert obj["Metadata"] == {
        "event-id": event.id,
        "event-type": "task_run.completed",
        "event-created-at": "2026-11-22T10:00:00.123456789Z",
        "tenant-id": "acme",
    }


async def test_default_storage_class_is_standard(
    moto: MotoServer, make_adapter: AdapterFactory
) -> None:
    s3 = moto.client("s3")
    s3.create_bucket(Bucket="plain")
    raw = {"bucket": "plain", "region": REGION, "endpoint_url": moto.endpoint, **creds(S3Adapter)}
    assert S3Config.model_validate(raw).storage_class == "STANDARD"
    assert (await deliver(make_adapter(S3Adapter), raw, make_event())).outcome is Outcome.SUCCESS
    assert [o["StorageClass"] for o in s3_objects(s3, "plain")] == ["STANDARD"]


@pytest.mark.parametrize(
    ("created_at", "stamp"),
    [
        ("2026-11-22T10:00:00.123456Z", "2026-11-22T10:00:00.123456000Z"),
        ("2026-11-22T10:00:00Z", "2026-11-22T10:00:00.000000000Z"),
        ("2026-01-02T03:04:05.000000001Z", "2026-01-02T03:04:05.000000001Z"),
    ],
)
def test_object_key_has_nine_fractional_digits(created_at: str, stamp: str) -> None:
    event = replace(make_event(), created_at=created_at)
    assert object_key(event) == f"{stamp}_{event.id}.json"


async def test_bucket_in_another_region_and_non_ascii_metadata(
    moto: MotoServer, make_adapter: AdapterFactory
) -> None:
    s3 = moto.client("s3", region="eu-central-1")
    s3.create_bucket(
        Bucket="frankfurt", CreateBucketConfiguration={"LocationConstraint": "eu-central-1"}
    )
    raw = {"bucket": "frankfurt", "region": "eu-central-1", "endpoint_url": moto.endpoint}
    event = make_event(tenant="zürich")
    result = await deliver(make_adapter(S3Adapter), {**raw, **creds(S3Adapter)}, event)
    assert result.outcome is Outcome.SUCCESS, result
    meta = s3.head_object(Bucket="frankfurt", Key=object_key(event))["Metadata"]
    # S3 metadata is HTTP headers: non-ASCII values travel RFC 2047 encoded.
    ((value, charset),) = decode_header(meta["tenant-id"])
    assert isinstance(value, bytes)
    assert value.decode(charset or "ascii") == "zürich"


async def test_missing_bucket_is_a_permanent_failure_with_the_s3_code(
    moto: MotoServer, make_adapter: AdapterFactory
) -> None:
    raw = {
        "bucket": "never-made",
        "region": REGION,
        "endpoint_url": moto.endpoint,
        **creds(S3Adapter),
    }
    result = await deliver(make_adapter(S3Adapter), raw, make_event())
    assert result.outcome is Outcome.FAILURE_PERMANENT
    assert result.status == 404
    assert result.error is not None
    assert result.error.startswith("NoSuchBucket: "), result.error


def test_every_storage_class_of_the_provider_is_accepted() -> None:
    classes = storage_classes()
    assert {"STANDARD", "STANDARD_IA", "GLACIER_IR", "DEEP_ARCHIVE", "INTELLIGENT_TIERING"} <= set(
        classes
    )
    for name in classes:
        assert S3Config.model_validate({"bucket": "b-b", "region": REGION, "storage_class": name})


async def test_unknown_storage_class_is_refused_at_create_time(harness: Harness) -> None:
    body = {
        "name": "archive",
        "type": "cloudA_s3",
        "cloudA_s3": {"bucket": "events", "region": REGION, "storage_class": "COLD_STORAGE"},
        "events": ["*"],
    }
    with pytest.raises(ValidationError) as caught:
        await harness.service.create("default", body)
    assert caught.value.field == "cloudA_s3.storage_class"
    assert caught.value.code == "invalid_value"
    assert "COLD_STORAGE" in caught.value.message
    assert "STANDARD_IA" in caught.value.message  # the error lists what is accepted
    assert (
        await harness.store.list_destinations(
            tenant_id="default", status=None, type=None, before_id=None, limit=10
        )
        == []
    )
    # The alias is answered with the canonical type.
    body["cloudA_s3"] = {"bucket": "events", "region": REGION, "storage_class": "GLACIER"}
    dest = await harness.service.create("default", body)
    assert dest.type == "aws_s3"
    assert dest.config["storage_class"] == "GLACIER"
