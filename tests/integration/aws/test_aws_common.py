"""What the four AWS types share: registration, config, clients, credentials, errors."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from herald.adapters.aws import AWSAdapter, AWSConfig, client_error_result
from herald.adapters.aws_eventbridge import EventBridgeAdapter
from herald.adapters.aws_kinesis import KinesisAdapter
from herald.adapters.aws_s3 import S3Adapter
from herald.adapters.aws_sqs import SQSAdapter
from herald.adapters.base import AdapterContext
from herald.adapters.registry import Registry, adapter_classes
from herald.config import Settings
from herald.egress import EgressPolicy
from herald.model import Outcome
from tests.contract.adapter_contract import make_destination, make_event
from tests.integration.aws.conftest import AdapterFactory, FakeFactory, creds, deliver
from tests.integration.aws.support import (
    ACCESS_KEY,
    ACCOUNT,
    REGION,
    SECRET_KEY,
    MotoServer,
    eventbridge_to_queue,
)


@dataclass(frozen=True)
class Kind:
    """One AWS type, how to make its target in moto, and the permission it needs."""

    adapter: type[AWSAdapter]
    action: str
    setup: Callable[[MotoServer], dict[str, str]]

    def config(self, moto: MotoServer, endpoint: str | None = None, **creds: str) -> dict[str, str]:
        return {**self.setup(moto), "endpoint_url": endpoint or moto.endpoint, **creds}

    def creds(self, key: str = ACCESS_KEY, secret: str = SECRET_KEY) -> dict[str, str]:
        return creds(self.adapter, key, secret)


def _queue(moto: MotoServer) -> dict[str, str]:
    moto.client("sqs").create_queue(QueueName="common")
    return {"queue_url": f"{moto.endpoint}/{ACCOUNT}/common"}


def _stream(moto: MotoServer) -> dict[str, str]:
    moto.client("kinesis").create_stream(StreamName="common", ShardCount=1)
    return {"stream_name": "common", "region": REGION}


def _bucket(moto: MotoServer) -> dict[str, str]:
    moto.client("s3").create_bucket(Bucket="common")
    return {"bucket": "common", "region": REGION}


def _bus(moto: MotoServer) -> dict[str, str]:
    eventbridge_to_queue(moto, "common")
    return {"event_bus_name": "common", "region": REGION}


KINDS = {
    "sqs": Kind(SQSAdapter, "sqs:SendMessage", _queue),
    "kinesis": Kind(KinesisAdapter, "kinesis:PutRecord", _stream),
    "s3": Kind(S3Adapter, "s3:PutObject", _bucket),
    "eventbridge": Kind(EventBridgeAdapter, "events:PutEvents", _bus),
}
each_kind = pytest.mark.parametrize("kind", list(KINDS.values()), ids=list(KINDS))


# --- registration and config ---------------------------------------------------------------
def test_registered_after_webhook_with_the_spec_aliases() -> None:
    classes = adapter_classes()
    assert classes[0].type_id == "webhook"
    registry = Registry(
        AdapterContext(settings=Settings(), egress=EgressPolicy(allow_private=True)),
        [c for c in classes if issubclass(c, AWSAdapter)],
    )
    for canonical in ("aws_sqs", "aws_kinesis", "aws_s3", "aws_eventbridge"):
        alias = canonical.replace("aws_", "cloudA_")
        assert registry.canonical(alias) == canonical
        assert registry.names_of(canonical) == (canonical, alias)


@pytest.mark.parametrize(
    ("adapter", "sensitive"),
    [
        (SQSAdapter, {"key", "secret", "session"}),
        (KinesisAdapter, {"key", "secret", "session"}),
        (S3Adapter, {"key", "secret", "session"}),
        (EventBridgeAdapter, {"access_key_id", "secret_access_key"}),
    ],
)
def test_credentials_are_sensitive_and_split_from_the_plain_fields(
    adapter: type[AWSAdapter], sensitive: set[str]
) -> None:
    assert adapter.config_model.sensitive_fields() == sensitive
    assert "endpoint_url" in adapter.config_model.model_fields


@pytest.mark.parametrize(
    ("adapter", "base", "moves", "stays"),
    [
        (
            SQSAdapter,
            {"queue_url": "https://sqs.eu-west-1.amazonaws.com/1/q"},
            [{"queue_url": "https://sqs.eu-west-1.amazonaws.com/1/r"}],
            [{"key": "AKIA2", "secret": "s2", "session": "t2"}],
        ),
        (
            KinesisAdapter,
            {"stream_name": "s", "region": "eu-west-1"},
            [{"stream_name": "t"}, {"region": "eu-west-2"}],
            [{"key": "AKIA2", "secret": "s2"}],
        ),
        (
            S3Adapter,
            {"bucket": "b-1", "region": "eu-west-1"},
            [{"bucket": "b-2"}, {"region": "eu-west-2"}],
            [{"key": "AKIA2", "secret": "s2"}, {"storage_class": "GLACIER"}],
        ),
        (
            EventBridgeAdapter,
            {"event_bus_name": "b", "region": "eu-west-1"},
            [{"event_bus_name": "c"}, {"region": "eu-west-2"}],
            [{"access_key_id": "AKIA2", "secret_access_key": "s2"}],
        ),
    ],
)
def test_target_changes_with_where_messages_go_not_with_credentials(
    adapter: type[AWSAdapter],
    base: dict[str, str],
    moves: list[dict[str, str]],
    stays: list[dict[str, str]],
) -> None:
    model = adapter.config_model
    first = model.model_validate(base).target()
    for change in [*moves, {"endpoint_url": "http://127.0.0.1:4566"}]:
        assert model.model_validate({**base, **change}).target() != first, change
    for change in stays:
        assert model.model_validate({**base, **change}).target() == first, change


# --- clients ----------------------------------------------------------------------------------
async def test_one_client_per_key_reused_released_and_closed(
    moto: MotoServer, make_adapter: AdapterFactory
) -> None:
    kind = KINDS["sqs"]
    adapter = make_adapter(SQSAdapter)
    assert isinstance(adapter, SQSAdapter)
    raw = kind.config(moto, **kind.creds())
    config = adapter.config_model.model_validate(raw)
    first, second = (make_destination("aws_sqs", config) for _ in range(2))
    for dest in (first, second, first):
        assert (await adapter.deliver(dest, config, make_event())).outcome is Outcome.SUCCESS
    assert len(adapter.clients) == 1  # two destinations, three deliveries, one client

    rotated = adapter.config_model.model_validate({**raw, "key": "AKIAROTATED000000000"})
    assert (await adapter.deliver(second, rotated, make_event())).outcome is Outcome.SUCCESS
    assert len(adapter.clients) == 2  # credentials are part of the key

    await adapter.forget(first.id)  # the old key's last user: its client is closed
    assert len(adapter.clients) == 1
    await adapter.close()
    assert len(adapter.clients) == 0
    # Usable again after close (a new client on demand).
    assert (await adapter.deliver(first, config, make_event())).outcome is Outcome.SUCCESS


async def test_concurrent_first_deliveries_build_one_client(
    moto: MotoServer, make_adapter: AdapterFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    kind = KINDS["kinesis"]
    adapter = make_adapter(KinesisAdapter)
    assert isinstance(adapter, KinesisAdapter)
    built: list[object] = []
    open_client = adapter.open_client

    async def counting(key: Any) -> Any:
        built.append(key)
        return await open_client(key)

    monkeypatch.setattr(adapter, "open_client", counting)
    raw = kind.config(moto, **kind.creds())
    config = adapter.config_model.model_validate(raw)
    dest = make_destination("aws_kinesis", config)
    results = await asyncio.gather(
        *(adapter.deliver(dest, config, make_event()) for _ in range(20))
    )
    assert {r.outcome for r in results} == {Outcome.SUCCESS}
    assert len(built) == 1
    assert len(adapter.clients) == 1


async def test_an_attempt_cut_off_by_the_deadline_leaves_a_usable_client(
    moto: MotoServer, make_adapter: AdapterFactory
) -> None:
    kind = KINDS["sqs"]
    adapter = make_adapter(SQSAdapter)
    assert isinstance(adapter, SQSAdapter)
    config = adapter.config_model.model_validate(kind.config(moto, **kind.creds()))
    dest = make_destination("aws_sqs", config)
    # The engine cancels an attempt at its deadline, here while the client is being built.
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.001):
            await adapter.deliver(dest, config, make_event())
    assert (await adapter.deliver(dest, config, make_event())).outcome is Outcome.SUCCESS
    assert len(adapter.clients) == 1


# --- credentials ---------------------------------------------------------------------------------
@each_kind
async def test_explicit_credentials_need_only_the_documented_permission(
    kind: Kind, moto: MotoServer, make_adapter: AdapterFactory
) -> None:
    raw = kind.config(moto)
    allowed = moto.iam_user("publisher", [kind.action])
    denied = moto.iam_user("nobody", [])
    with moto.iam_enforced():
        ok = await deliver(make_adapter(kind.adapter), {**raw, **kind.creds(*allowed)})
        no = await deliver(make_adapter(kind.adapter), {**raw, **kind.creds(*denied)})
        bad = await deliver(make_adapter(kind.adapter), {**raw, **kind.creds("AKIANOBODY", "x")})
    assert ok.outcome is Outcome.SUCCESS, ok
    assert no.outcome is Outcome.FAILURE_PERMANENT
    assert no.status == 403
    assert no.error is not None
    assert no.error.startswith("AccessDenied"), no.error
    assert bad.outcome is Outcome.FAILURE_PERMANENT
    assert bad.status == 403
    assert bad.error is not None
    assert bad.error.split(":")[0] in {"InvalidClientTokenId", "InvalidAccessKeyId"}, bad.error


@each_kind
async def test_credentials_from_the_environment(
    kind: Kind, moto: MotoServer, make_adapter: AdapterFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = kind.config(moto)  # no credential fields: the standard chain
    key, secret = moto.iam_user("env-user", [kind.action])
    with moto.iam_enforced():
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
        ok = await deliver(make_adapter(kind.adapter), raw)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIANOTINIAM00000000")
        wrong = await deliver(make_adapter(kind.adapter), raw)
    assert ok.outcome is Outcome.SUCCESS, ok
    assert wrong.outcome is Outcome.FAILURE_PERMANENT
    assert wrong.status == 403


@each_kind
async def test_credentials_from_a_shared_credentials_file_profile(
    kind: Kind,
    moto: MotoServer,
    make_adapter: AdapterFactory,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """No credential fields and no key in the environment: the chain reads the profile
    ``AWS_PROFILE`` names from ``AWS_SHARED_CREDENTIALS_FILE``. IAM is enforced, and the
    file's default profile holds a key moto does not know, so only that profile works."""
    raw = kind.config(moto)
    key, secret = moto.iam_user("profile-user", [kind.action])
    path = tmp_path / "credentials"
    path.write_text(
        "[default]\naws_access_key_id = AKIANOTINIAM00000000\naws_secret_access_key = x\n\n"
        f"[herald]\naws_access_key_id = {key}\naws_secret_access_key = {secret}\n"
    )
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(path))
    assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} & set(os.environ)
    with moto.iam_enforced():
        monkeypatch.setenv("AWS_PROFILE", "herald")
        ok = await deliver(make_adapter(kind.adapter), raw)
        monkeypatch.setenv("AWS_PROFILE", "default")
        wrong = await deliver(make_adapter(kind.adapter), raw)
    assert ok.outcome is Outcome.SUCCESS, ok
    assert wrong.outcome is Outcome.FAILURE_PERMANENT, wrong
    assert wrong.status == 403


async def test_no_credentials_anywhere_is_a_permanent_failure(
    moto: MotoServer, make_adapter: AdapterFactory
) -> None:
    kind = KINDS["sqs"]
    result = await deliver(make_adapter(SQSAdapter), kind.config(moto))
    assert result.outcome is Outcome.FAILURE_PERMANENT
    assert result.error is not None
    assert result.error.startswith("NoCredentialsError"), result.error


# --- errors -----------------------------------------------------------------------------
@each_kind
async def test_throttling_503_is_retryable_after_exactly_one_request(
    kind: Kind,
    moto: MotoServer,
    fake_aws: FakeFactory,
    make_adapter: AdapterFactory,
) -> None:
    code = "SlowDown" if kind.adapter is S3Adapter else "ThrottlingException"
    fake = await fake_aws(status=503, code=code)
    raw = kind.config(moto, fake.url, **kind.creds())
    result = await deliver(make_adapter(kind.adapter), raw)
    assert result.outcome is Outcome.FAILURE_RETRYABLE
    assert result.status == 503
    assert result.error == f"{code}: Please reduce your request rate."
    # botocore's own retries are off: the engine's schedule is the only one.
    assert len(fake.requests) == 1, fake.requests


async def test_a_throttling_code_is_retryable_whatever_the_status(
    moto: MotoServer, fake_aws: FakeFactory, make_adapter: AdapterFactory
) -> None:
    fake = await fake_aws(status=400, code="ProvisionedThroughputExceededException")
    kind = KINDS["kinesis"]
    result = await deliver(
        make_adapter(KinesisAdapter), kind.config(moto, fake.url, **kind.creds())
    )
    assert result.outcome is Outcome.FAILURE_RETRYABLE
    assert result.status == 400
    assert result.error is not None
    assert result.error.startswith("ProvisionedThroughputExceededException: ")


async def test_a_validation_error_is_permanent(
    moto: MotoServer, fake_aws: FakeFactory, make_adapter: AdapterFactory
) -> None:
    fake = await fake_aws(status=400, code="ValidationException", message="too big")
    kind = KINDS["eventbridge"]
    raw = kind.config(moto, fake.url, **kind.creds())
    result = await deliver(make_adapter(EventBridgeAdapter), raw)
    assert result.outcome is Outcome.FAILURE_PERMANENT
    assert result.error == "ValidationException: too big"


def test_an_error_body_botocore_could_not_parse_still_yields_its_code() -> None:
    # What a JSON-protocol client gets when the service (or moto) answers in XML.
    xml = (
        '<?xml version="1.0"?><ErrorResponse><Errors><Error><Code>InvalidClientTokenId</Code>'
        "<Message>The security token included in the request is invalid.</Message>"
        "</Error></Errors></ErrorResponse>"
    )
    exc = ClientError(
        {"Error": {"Code": "403", "Message": xml}, "ResponseMetadata": {"HTTPStatusCode": 403}},
        "SendMessage",
    )
    result = client_error_result(exc)
    assert result.outcome is Outcome.FAILURE_PERMANENT
    assert result.error == (
        "InvalidClientTokenId: The security token included in the request is invalid."
    )
    page = ClientError(
        {
            "Error": {"Code": "502", "Message": "<html>Bad Gateway</html>"},
            "ResponseMetadata": {"HTTPStatusCode": 502},
        },
        "PutRecord",
    )
    assert client_error_result(page).outcome is Outcome.FAILURE_RETRYABLE


def test_every_aws_config_checks_its_endpoint_url() -> None:
    for cls in (SQSAdapter, KinesisAdapter, S3Adapter, EventBridgeAdapter):
        assert issubclass(cls.config_model, AWSConfig)
        with pytest.raises(ValueError, match="absolute"):
            cls.config_model.model_validate(
                {"endpoint_url": "ftp://x", "queue_url": "https://h/1/q", "region": REGION}
            )
