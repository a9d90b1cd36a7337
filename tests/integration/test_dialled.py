"""What a tenant's config may make Herald reach (issue 18, items 1 and 3).

Every host a destination makes Herald connect to — not only ``endpoint_url`` and
the webhook URL, but a RabbitMQ ``server_url``, a Service Bus connection
string's ``Endpoint``, a Pub/Sub key's ``universe_domain`` — is held to the
egress policy when the destination is created or changed, and again before every
attempt (DNS can change, the operator can tighten the policy). And a keyless
cloud destination may publish with the daemon's own identity only for the
tenants in ``security.ambient_credentials_tenants``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest

from herald.adapters.aws_sqs import SQSAdapter
from herald.adapters.base import AdapterContext, DestinationConfig, Result
from herald.adapters.gcp_pubsub import PubSubAdapter
from herald.adapters.registry import Registry
from herald.config import Settings
from herald.egress import EgressPolicy
from herald.errors import ValidationError
from herald.model import Outcome
from tests.contract.adapter_contract import make_destination, make_event
from tests.integration.aws.support import isolate_aws_environment
from tests.integration.conftest import HarnessFactory
from tests.integration.gcp.peers import ServiceAccount
from tests.integration.rebinding import Listener

SA = ServiceAccount.generate()
REBIND = "broker.rebind.example"
UNIVERSE = "universe.example"


def sa_json(**changes: str) -> str:
    return json.dumps({**SA.info, **changes})


def hostile(type_id: str, port: int, host: str = "127.0.0.1") -> dict[str, str]:
    """A config of ``type_id`` that makes Herald dial ``host:port`` (or the fake universe)."""
    if type_id == "rabbitmq":
        return {"server_url": f"{host}:{port}", "exchange": "x", "username": "u", "password": "p"}
    if type_id == "azure_servicebus":
        return {
            "name": "orders",
            "connection_string": f"Endpoint=sb://{host}:{port}/;SharedAccessKeyName=k;"
            "SharedAccessKey=c2VjcmV0;UseDevelopmentEmulator=true",
        }
    assert type_id == "gcp_pubsub"
    return {
        "project_id": "my-project-1",
        "topic": "herald-events",
        "service_account_json": sa_json(universe_domain=UNIVERSE),
    }


FIELDS = {
    "rabbitmq": "rabbitmq.server_url",
    "azure_servicebus": "azure_servicebus.connection_string",
    "gcp_pubsub": "gcp_pubsub.service_account_json",
}


def create_body(type_id: str, config: dict[str, str]) -> dict[str, Any]:
    return {"name": "d", "type": type_id, "events": ["*"], type_id: config}


@pytest.fixture
def dns(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Answers for made-up names (the rest resolve as usually); change them between calls."""
    answers: dict[str, str] = {f"pubsub.{UNIVERSE}": "127.0.0.1", REBIND: "127.0.0.1"}
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(host, str) and host in answers:
            return real(answers[host], port, *args, **kwargs)
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return answers


@pytest.fixture
async def listener() -> AsyncIterator[Listener]:
    server = await Listener("127.0.0.1").start()
    yield server
    await server.stop()


def registry(policy: EgressPolicy, **settings: Any) -> Registry:
    return Registry(AdapterContext(settings=Settings(**settings), egress=policy))


async def attempt(reg: Registry, type_id: str, raw: dict[str, str], tenant: str) -> Result:
    config: DestinationConfig = reg.parse_config(type_id, raw)
    dest = dataclasses.replace(make_destination(type_id, config), tenant_id=tenant)
    return await asyncio.wait_for(reg.get(type_id).deliver(dest, config, make_event()), 20)


# --- item 1: create and update ----------------------------------------------------------------
@pytest.mark.parametrize("type_id", list(FIELDS))
async def test_create_refuses_a_private_host_in_any_field_that_is_dialled(
    harness_factory: HarnessFactory, dns: dict[str, str], type_id: str
) -> None:
    strict = await harness_factory(security={"allow_private_networks": False})
    with pytest.raises(ValidationError) as refused:
        await strict.service.create("default", create_body(type_id, hostile(type_id, 8080)))
    assert (refused.value.field, refused.value.code) == (FIELDS[type_id], "url_not_allowed")
    assert "egress denied" in refused.value.message
    assert "127.0.0.1" in refused.value.message
    assert (await strict.service.list_destinations("default"))[0] == []
    # Where the operator allows private networks, the same config is accepted.
    allowing = await harness_factory()
    await allowing.service.create("default", create_body(type_id, hostile(type_id, 8080)))


async def test_update_to_a_private_broker_is_refused_naming_the_field(
    harness_factory: HarnessFactory, dns: dict[str, str]
) -> None:
    dns[REBIND] = "93.184.216.34"  # a public address when created
    strict = await harness_factory(security={"allow_private_networks": False})
    dest = await strict.service.create(
        "default", create_body("rabbitmq", hostile("rabbitmq", 1, REBIND))
    )
    with pytest.raises(ValidationError) as refused:
        # Its credentials given again, as a new target needs (docs/security.md): what
        # refuses the change is then the address alone.
        await strict.service.update(
            "default", dest.id, {"rabbitmq": {"server_url": "127.0.0.1:1", "password": "p"}}
        )
    assert (refused.value.field, refused.value.code) == ("rabbitmq.server_url", "url_not_allowed")
    stored = await strict.service.get("default", dest.id)
    assert stored.config["server_url"] == f"{REBIND}:1"


# --- item 1: every attempt --------------------------------------------------------------------
@pytest.mark.parametrize("type_id", list(FIELDS))
async def test_an_attempt_to_a_host_the_policy_refuses_dials_nothing(
    listener: Listener, dns: dict[str, str], type_id: str
) -> None:
    """Stored while private networks were allowed, then the policy was tightened."""
    raw = hostile(type_id, listener.port)
    if type_id == "gcp_pubsub":  # a universe is always on port 443: the endpoint instead
        raw = {**raw, "service_account_json": sa_json()}
        # Plain text: a TLS channel made here, before tests/integration/gcp sets the
        # process's gRPC roots (GRPC_DEFAULT_SSL_ROOTS_FILE_PATH, read once), would
        # leave every later TLS test of the run without them.
        raw["endpoint_url"] = f"http://localhost:{listener.port}"
    strict = registry(EgressPolicy())
    try:
        result = await attempt(strict, type_id, raw, "default")
    finally:
        await strict.close()
    assert result.outcome is Outcome.FAILURE_PERMANENT, result
    assert result.error is not None
    assert "egress denied" in result.error
    assert "127.0.0.1" in result.error
    assert listener.connections == 0
    # The same attempt with the network allowed does connect: the refusal was the guard's.
    allowing = registry(EgressPolicy(allow_private=True))
    task = asyncio.create_task(attempt(allowing, type_id, raw, "default"))
    try:
        async with asyncio.timeout(15):
            while listener.connections == 0 and not task.done():
                await asyncio.sleep(0.02)
        assert listener.connections >= 1, task.result()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await allowing.close()


async def test_a_pubsub_key_universe_that_resolves_privately_is_refused_at_attempt(
    dns: dict[str, str],
) -> None:
    strict = registry(EgressPolicy())
    try:
        result = await attempt(strict, "gcp_pubsub", hostile("gcp_pubsub", 0), "default")
    finally:
        await strict.close()
    assert result.outcome is Outcome.FAILURE_PERMANENT, result
    assert result.error is not None
    assert f"pubsub.{UNIVERSE}" in result.error
    assert "egress denied" in result.error


async def test_a_dns_change_after_creation_is_refused_before_the_broker_is_dialled(
    listener: Listener, dns: dict[str, str]
) -> None:
    raw = hostile("rabbitmq", listener.port, REBIND)
    strict = registry(EgressPolicy())
    try:
        dns[REBIND] = "93.184.216.34"  # public when the destination is created
        adapter = strict.get("rabbitmq")
        await adapter.check(strict.parse_config("rabbitmq", raw), tenant_id="default")
        dns[REBIND] = "127.0.0.1"  # and private by the time it is used
        result = await attempt(strict, "rabbitmq", raw, "default")
    finally:
        await strict.close()
    assert result.outcome is Outcome.FAILURE_PERMANENT, result
    assert result.error is not None
    assert "egress denied" in result.error
    assert listener.connections == 0


async def test_an_aws_endpoint_is_checked_as_resolved_when_connecting(
    listener: Listener, monkeypatch: pytest.MonkeyPatch
) -> None:
    """aiobotocore connects through the guarded resolver: ``localhost`` is resolved
    and refused there, and an IP literal before the attempt."""
    isolate_aws_environment(monkeypatch)
    strict = registry(EgressPolicy())
    try:
        for host in ("localhost", "127.0.0.1"):
            raw = {
                "queue_url": f"http://{host}:{listener.port}/123456789012/q",
                "endpoint_url": f"http://{host}:{listener.port}",
                "key": "AKIAEXAMPLE",
                "secret": "s",
            }
            result = await attempt(strict, "aws_sqs", raw, "default")
            assert result.outcome is Outcome.FAILURE_PERMANENT, (host, result)
            assert result.error is not None
            assert "egress denied" in result.error, result.error
    finally:
        await strict.close()
    assert listener.connections == 0


# --- item 3: the daemon's own cloud identity --------------------------------------------------
KEYLESS = {
    "aws_sqs": ({"queue_url": "https://sqs.eu-west-1.amazonaws.com/123456789012/q"}, "key"),
    "aws_kinesis": ({"stream_name": "s", "region": "eu-west-1"}, "key"),
    "aws_s3": ({"bucket": "herald-bucket", "region": "eu-west-1"}, "key"),
    "aws_eventbridge": ({"event_bus_name": "b", "region": "eu-west-1"}, "access_key_id"),
    "gcp_pubsub": (
        {"project_id": "my-project-1", "topic": "herald-events"},
        "service_account_json",
    ),
}


@pytest.mark.parametrize("type_id", list(KEYLESS))
async def test_a_keyless_cloud_destination_needs_a_listed_tenant(
    harness_factory: HarnessFactory, type_id: str
) -> None:
    raw, field = KEYLESS[type_id]
    h = await harness_factory()
    with pytest.raises(ValidationError) as refused:
        await h.service.create("acme", create_body(type_id, raw))
    assert (refused.value.field, refused.value.code) == (
        f"{type_id}.{field}",
        "credentials_required",
    )
    assert "acme" in refused.value.message
    assert (await h.service.list_destinations("acme"))[0] == []
    # A listed tenant ("default" in these tests' settings; the default lists none) may.
    await h.service.create("default", create_body(type_id, raw))
    listed = await harness_factory(security={"ambient_credentials_tenants": ["acme"]})
    await listed.service.create("acme", create_body(type_id, raw))


async def test_dropping_the_keys_on_update_is_refused_for_an_unlisted_tenant(
    harness_factory: HarnessFactory,
) -> None:
    h = await harness_factory()
    raw = {**KEYLESS["aws_sqs"][0], "key": "AKIAEXAMPLE", "secret": "s"}
    dest = await h.service.create("acme", create_body("aws_sqs", raw))
    with pytest.raises(ValidationError) as refused:
        await h.service.update("acme", dest.id, {"aws_sqs": {"key": None, "secret": None}})
    assert refused.value.field == "aws_sqs.key"
    assert (await h.service.get("acme", dest.id)).secrets["key"] == "AKIAEXAMPLE"


async def test_an_attempt_never_asks_the_default_chain_for_an_unlisted_tenant(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Stored earlier (or the list changed since): the attempt fails permanently."""
    isolate_aws_environment(monkeypatch)
    asked: list[str] = []

    def default(*args: Any, **kwargs: Any) -> Any:
        asked.append("google.auth.default")
        raise AssertionError("the default credentials were asked for")

    monkeypatch.setattr("google.auth.default", default)
    reg = registry(EgressPolicy(), security={"ambient_credentials_tenants": []})
    try:
        for type_id in ("aws_sqs", "aws_eventbridge", "gcp_pubsub"):
            result = await attempt(reg, type_id, KEYLESS[type_id][0], "default")
            assert result.outcome is Outcome.FAILURE_PERMANENT, result
            assert result.error is not None
            assert "ambient credentials are not allowed for tenant 'default'" in result.error
            assert f"{type_id}.{KEYLESS[type_id][1]}" in result.error
        sqs = reg.get("aws_sqs")
        assert isinstance(sqs, SQSAdapter)
        assert sqs._session is None  # no session, so no credential chain, was ever built
        pubsub = reg.get("gcp_pubsub")
        assert isinstance(pubsub, PubSubAdapter)
        assert len(pubsub.clients) == 0
    finally:
        await reg.close()
    assert asked == []
