"""``gcp_pubsub`` against real gRPC peers: the shared adapter contract, the error
mapping, credentials over TLS, client reuse and the config validation table."""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import json
import uuid
from typing import Any

import grpc
import pytest

from herald.adapters.base import AdapterContext
from herald.adapters.gcp_pubsub import PubSubAdapter, PubSubConfig, parse_endpoint
from herald.adapters.registry import Registry
from herald.config import Settings
from herald.egress import EgressPolicy
from herald.errors import ValidationError
from herald.model import Event, Outcome
from tests.contract.adapter_contract import (
    AMBIENT,
    AdapterContract,
    make_destination,
    make_event,
)
from tests.integration.conftest import closed_port
from tests.integration.gcp.conftest import PROJECT
from tests.integration.gcp.peers import (
    TLS_NAME,
    FakePublisher,
    Peer,
    ServiceAccount,
    find,
    wait_for,
)
from tests.integration.rebinding import Rebinding, loopback_address


def new_topic() -> str:
    return f"events-{uuid.uuid4().hex[:10]}"


class TestPubSubContract(AdapterContract):
    """Runs once per available peer: the emulator (where installed) and the in-process server."""

    adapter_class = PubSubAdapter
    peer: Peer

    @pytest.fixture
    async def good_config(self, pubsub_peer: Peer) -> dict[str, str]:
        self.peer = pubsub_peer
        topic = new_topic()
        await pubsub_peer.create_topic(PROJECT, topic)
        return {"project_id": PROJECT, "topic": topic, "endpoint_url": pubsub_peer.endpoint}

    @pytest.fixture
    def missing_target_config(self, pubsub_peer: Peer) -> dict[str, str]:
        return {"project_id": PROJECT, "topic": new_topic(), "endpoint_url": pubsub_peer.endpoint}

    @pytest.fixture
    async def bad_credentials_config(
        self, secure_publisher: FakePublisher, untrusted_account: ServiceAccount
    ) -> dict[str, str]:
        # The emulator authenticates nobody: refused credentials need the TLS server.
        topic = new_topic()
        await secure_publisher.create_topic(PROJECT, topic)
        return {
            "project_id": PROJECT,
            "topic": topic,
            "endpoint_url": secure_publisher.endpoint,
            "service_account_json": untrusted_account.json,
        }

    @pytest.fixture
    def unreachable_config(self) -> dict[str, str]:
        return {
            "project_id": PROJECT,
            "topic": "events",
            "endpoint_url": f"127.0.0.1:{closed_port()}",
        }

    async def read_back(self, config: dict[str, str], event: Event) -> dict[str, Any]:
        async def look() -> Any:
            return find(await self.peer.messages(PROJECT, config["topic"]), event.id)

        message = await wait_for(look, what=f"{event.id} on {self.peer.name}")
        return {"body": message.data, "metadata": dict(message.attributes)}

    async def test_missing_topic_is_permanent_not_found(
        self, adapter: PubSubAdapter, missing_target_config: dict[str, str]
    ) -> None:
        result = await self.publish(adapter, missing_target_config, make_event())
        assert result.outcome is Outcome.FAILURE_PERMANENT
        assert result.error is not None
        assert result.error.startswith("NOT_FOUND: ")

    async def test_refused_credentials_are_permanent_unauthenticated(
        self, adapter: PubSubAdapter, bad_credentials_config: dict[str, str]
    ) -> None:
        result = await self.publish(adapter, bad_credentials_config, make_event())
        assert result.outcome is Outcome.FAILURE_PERMANENT
        assert result.error is not None
        assert result.error.startswith("UNAUTHENTICATED: ")
        assert "PRIVATE KEY" not in result.error

    async def test_unreachable_is_retryable_unavailable(
        self, adapter: PubSubAdapter, unreachable_config: dict[str, str]
    ) -> None:
        result = await self.publish(adapter, unreachable_config, make_event())
        assert result.outcome is Outcome.FAILURE_RETRYABLE
        assert result.error is not None
        assert result.error.startswith("UNAVAILABLE: ")

    async def test_an_ordered_destination_publishes_the_ordering_key(
        self, adapter: PubSubAdapter, good_config: dict[str, str]
    ) -> None:
        """The key is the message's ``ordering_key`` for an ordered destination; an
        unordered one sends none (nor does a keyless event)."""
        config = self.parse(good_config)
        base = make_destination(PubSubAdapter.type_id, config)
        ordered, unordered = (dataclasses.replace(base, ordering=o) for o in ("key", "none"))
        plan = [(ordered, "order-1"), (ordered, None), (unordered, "order-1")]
        sent = []
        for dest, key in plan:
            event = make_event()
            event.ordering_key = key
            sent.append(event)
            result = await adapter.deliver(dest, config, event)
            assert result.outcome is Outcome.SUCCESS, result

        async def all_there() -> list[Any] | None:
            got = await self.peer.messages(PROJECT, good_config["topic"])
            found = [find(got, e.id) for e in sent]
            return found if all(m is not None for m in found) else None

        messages = await wait_for(all_there, what="3 messages")
        assert [m.ordering_key for m in messages] == ["order-1", "", ""]
        assert [m.attributes["event-id"] for m in messages] == [e.id for e in sent]

    async def test_a_failed_ordered_publish_does_not_hold_the_key(
        self, adapter: PubSubAdapter, missing_target_config: dict[str, str], pubsub_peer: Peer
    ) -> None:
        """The high-level publisher pauses a key after a failed publish until
        ``resume_publish``; Herald's unary Publish keeps no such state, so the retry of
        the same keyed event goes out once the topic is there."""
        config = self.parse(missing_target_config)
        dest = dataclasses.replace(make_destination(PubSubAdapter.type_id, config), ordering="key")
        event = make_event()
        event.ordering_key = "order-9"
        failed = await adapter.deliver(dest, config, event)
        assert failed.outcome is Outcome.FAILURE_PERMANENT, failed
        await pubsub_peer.create_topic(PROJECT, missing_target_config["topic"])
        again = await adapter.deliver(dest, config, event)
        assert again.outcome is Outcome.SUCCESS, again
        following = make_event()
        following.ordering_key = "order-9"
        assert (await adapter.deliver(dest, config, following)).outcome is Outcome.SUCCESS

        async def both() -> list[Any] | None:
            got = await pubsub_peer.messages(PROJECT, missing_target_config["topic"])
            found = [find(got, e.id) for e in (event, following)]
            return found if all(m is not None for m in found) else None

        messages = await wait_for(both, what="the retried and the next message")
        assert [m.ordering_key for m in messages] == ["order-9", "order-9"]

    async def test_concurrent_publishes_share_one_client(
        self, adapter: PubSubAdapter, good_config: dict[str, str]
    ) -> None:
        events = [make_event() for _ in range(40)]
        results = await asyncio.gather(*(self.publish(adapter, good_config, e) for e in events))
        assert {r.outcome for r in results} == {Outcome.SUCCESS}
        assert len(adapter.clients) == 1

        async def all_there() -> bool:
            got = await self.peer.messages(PROJECT, good_config["topic"])
            return all(find(got, e.id) is not None for e in events)

        await wait_for(all_there, what="40 messages")


# --- beyond the contract: the in-process server's knobs ------------------------------
@pytest.fixture
async def adapter() -> Any:
    a = PubSubAdapter(
        AdapterContext(settings=Settings(**AMBIENT), egress=EgressPolicy(allow_private=True))
    )
    yield a
    await a.close()


async def publish(adapter: PubSubAdapter, raw: dict[str, str], event: Event | None = None) -> Any:
    config = PubSubConfig.model_validate(raw)
    return await adapter.deliver(
        make_destination("gcp_pubsub", config), config, event or make_event()
    )


@pytest.mark.parametrize(
    ("code", "outcome"),
    [
        (grpc.StatusCode.NOT_FOUND, Outcome.FAILURE_PERMANENT),
        (grpc.StatusCode.PERMISSION_DENIED, Outcome.FAILURE_PERMANENT),
        (grpc.StatusCode.UNAUTHENTICATED, Outcome.FAILURE_PERMANENT),
        (grpc.StatusCode.INVALID_ARGUMENT, Outcome.FAILURE_PERMANENT),
        (grpc.StatusCode.UNAVAILABLE, Outcome.FAILURE_RETRYABLE),
        (grpc.StatusCode.DEADLINE_EXCEEDED, Outcome.FAILURE_RETRYABLE),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, Outcome.FAILURE_RETRYABLE),
        (grpc.StatusCode.INTERNAL, Outcome.FAILURE_RETRYABLE),
        (grpc.StatusCode.ABORTED, Outcome.FAILURE_RETRYABLE),
        (grpc.StatusCode.UNKNOWN, Outcome.FAILURE_RETRYABLE),
    ],
)
async def test_grpc_status_codes_map_to_outcomes(
    adapter: PubSubAdapter, fake_publisher: FakePublisher, code: Any, outcome: Outcome
) -> None:
    await fake_publisher.create_topic(PROJECT, "events")
    fake_publisher.fail_next.append(code)
    raw = {"project_id": PROJECT, "topic": "events", "endpoint_url": fake_publisher.endpoint}
    result = await publish(adapter, raw)
    assert result.outcome is outcome
    assert result.error == f"{code.name}: injected {code.name}"
    # The library's own retries are off: exactly one RPC per attempt.
    assert fake_publisher.calls == 1
    # And the channel survives a failed call.
    assert (await publish(adapter, raw)).outcome is Outcome.SUCCESS


async def test_service_account_over_tls_publishes(
    adapter: PubSubAdapter, secure_publisher: FakePublisher, trusted_account: ServiceAccount
) -> None:
    """The credentials path: TLS, a key parsed from the config, a self-signed JWT
    (its token_uri points at a closed port, so no token endpoint is involved)."""
    await secure_publisher.create_topic(PROJECT, "events")
    raw = {
        "project_id": PROJECT,
        "topic": "events",
        "endpoint_url": secure_publisher.endpoint,
        "service_account_json": trusted_account.json,
    }
    event = make_event()
    result = await publish(adapter, raw, event)
    assert result.outcome is Outcome.SUCCESS, result
    got = find(await secure_publisher.messages(PROJECT, "events"), event.id)
    assert got is not None
    assert json.loads(got.data) == json.loads(event.envelope())


async def test_rotated_key_gets_its_own_client_and_same_target(
    adapter: PubSubAdapter,
    secure_publisher: FakePublisher,
    trusted_account: ServiceAccount,
    untrusted_account: ServiceAccount,
) -> None:
    await secure_publisher.create_topic(PROJECT, "events")
    base = {"project_id": PROJECT, "topic": "events", "endpoint_url": secure_publisher.endpoint}
    first = {**base, "service_account_json": untrusted_account.json}
    second = {**base, "service_account_json": trusted_account.json}
    assert (await publish(adapter, first)).outcome is Outcome.FAILURE_PERMANENT
    assert (await publish(adapter, second)).outcome is Outcome.SUCCESS
    assert len(adapter.clients) == 2
    assert (
        PubSubConfig.model_validate(first).target() == PubSubConfig.model_validate(second).target()
    )
    await adapter.close()
    assert len(adapter.clients) == 0


async def test_process_wide_emulator_variable_is_ignored(
    adapter: PubSubAdapter, fake_publisher: FakePublisher, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", f"127.0.0.1:{closed_port()}")
    await fake_publisher.create_topic(PROJECT, "events")
    raw = {"project_id": PROJECT, "topic": "events", "endpoint_url": fake_publisher.endpoint}
    assert (await publish(adapter, raw)).outcome is Outcome.SUCCESS


async def test_missing_default_credentials_are_permanent(
    adapter: PubSubAdapter, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """No key and no endpoint: Application Default Credentials, here a missing file
    (found before any network access, so nothing leaves the machine)."""
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "absent.json"))
    result = await publish(adapter, {"project_id": PROJECT, "topic": "events"})
    assert result.outcome is Outcome.FAILURE_PERMANENT
    assert result.error is not None
    assert "Application Default Credentials" in result.error


@pytest.mark.parametrize("trusted", [True, False], ids=["trusted-key", "untrusted-key"])
async def test_default_credentials_from_a_key_file_publish(
    secure_publisher: FakePublisher,
    trusted_account: ServiceAccount,
    untrusted_account: ServiceAccount,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Any,
    trusted: bool,
) -> None:
    """No ``service_account_json``: Application Default Credentials, here the key file
    ``GOOGLE_APPLICATION_CREDENTIALS`` names. The TLS server accepts only JWTs signed by
    the trusted key, so the untrusted file failing shows the file is what signs."""
    account = trusted_account if trusted else untrusted_account
    key_file = tmp_path / "adc.json"
    key_file.write_text(account.json)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key_file))
    await secure_publisher.create_topic(PROJECT, "events")
    raw = {"project_id": PROJECT, "topic": "events", "endpoint_url": secure_publisher.endpoint}
    a = PubSubAdapter(
        AdapterContext(settings=Settings(**AMBIENT), egress=EgressPolicy(allow_private=True))
    )
    try:
        event = make_event()
        result = await publish(a, raw, event)
    finally:
        await a.close()
    got = find(await secure_publisher.messages(PROJECT, "events"), event.id)
    if trusted:
        assert result.outcome is Outcome.SUCCESS, result
        assert got is not None
        assert json.loads(got.data) == json.loads(event.envelope())
        assert dict(got.attributes) == event.metadata()
    else:
        assert result.outcome is Outcome.FAILURE_PERMANENT, result
        assert result.error is not None
        assert result.error.startswith("UNAUTHENTICATED: ")
        assert got is None


async def test_rpc_deadline_is_the_attempt_timeout(fake_publisher: FakePublisher) -> None:
    """A server slower than the attempt's deadline: DEADLINE_EXCEEDED, and the
    channel is still good for the next attempt."""
    settings = Settings.model_validate({"delivery": {"adapter_timeout_seconds": 0.3}})
    a = PubSubAdapter(AdapterContext(settings=settings, egress=EgressPolicy(allow_private=True)))
    try:
        await fake_publisher.create_topic(PROJECT, "events")
        raw = {"project_id": PROJECT, "topic": "events", "endpoint_url": fake_publisher.endpoint}
        fake_publisher.hold = asyncio.Event()
        result = await publish(a, raw)
        assert result.outcome is Outcome.FAILURE_RETRYABLE
        assert result.error is not None
        assert result.error.startswith("DEADLINE_EXCEEDED: ")
        fake_publisher.hold.set()
        fake_publisher.hold = None
        assert (await publish(a, raw)).outcome is Outcome.SUCCESS
    finally:
        await a.close()


# --- config ------------------------------------------------------------------------------
SA = ServiceAccount.generate()
SA_INFO = SA.info


def sa_json(**changes: Any) -> str:
    info = {k: v for k, v in {**SA_INFO, **changes}.items() if v is not None}
    return json.dumps(info)


GOOD = {"project_id": "my-project-1", "topic": "herald-events"}

VALID: list[dict[str, str]] = [
    GOOD,
    {"project_id": "example.com:my-project", "topic": "a.b-c_d~e+f%20"},
    {**GOOD, "service_account_json": SA.json},
    {**GOOD, "endpoint_url": "127.0.0.1:8085"},
    {**GOOD, "endpoint_url": "http://localhost:8085"},
    {**GOOD, "endpoint_url": "https://europe-west1-pubsub.googleapis.com"},
    {**GOOD, "endpoint_url": "https://[::1]:8443"},
]

INVALID: list[tuple[dict[str, Any], str, str]] = [
    ({"topic": "t-1"}, "cloudB_pubsub.project_id", "is required"),
    ({"project_id": "my-project-1"}, "cloudB_pubsub.topic", "is required"),
    ({**GOOD, "project_id": "My_Project"}, "cloudB_pubsub.project_id", "project id"),
    ({**GOOD, "project_id": "short"}, "cloudB_pubsub.project_id", "project id"),
    ({**GOOD, "project_id": "1project"}, "cloudB_pubsub.project_id", "project id"),
    ({**GOOD, "topic": "projects/p/topics/t"}, "cloudB_pubsub.topic", "topic name alone"),
    ({**GOOD, "topic": "ab"}, "cloudB_pubsub.topic", "topic name"),
    ({**GOOD, "topic": "google-events"}, "cloudB_pubsub.topic", "not with goog"),
    ({**GOOD, "topic": "has space"}, "cloudB_pubsub.topic", "topic name"),
    ({**GOOD, "topic": "x" * 256}, "cloudB_pubsub.topic", "topic name"),
    ({**GOOD, "service_account_json": "not json"}, "cloudB_pubsub.service_account_json", "JSON"),
    ({**GOOD, "service_account_json": "[1, 2]"}, "cloudB_pubsub.service_account_json", "object"),
    (
        {**GOOD, "service_account_json": sa_json(type="authorized_user")},
        "cloudB_pubsub.service_account_json",
        '"type": "service_account"',
    ),
    (
        {**GOOD, "service_account_json": sa_json(client_email=None)},
        "cloudB_pubsub.service_account_json",
        "missing client_email",
    ),
    (
        {**GOOD, "service_account_json": sa_json(private_key=None)},
        "cloudB_pubsub.service_account_json",
        "missing private_key",
    ),
    (
        {**GOOD, "service_account_json": sa_json(token_uri=None)},
        "cloudB_pubsub.service_account_json",
        "missing token_uri",
    ),
    (
        {**GOOD, "service_account_json": sa_json(token_uri="http://10.0.0.1/token")},
        "cloudB_pubsub.service_account_json",
        "https://",
    ),
    (
        {**GOOD, "service_account_json": sa_json(private_key="-----BEGIN PRIVATE KEY-----\nnope")},
        "cloudB_pubsub.service_account_json",
        "PEM-encoded RSA private key",
    ),
    ({**GOOD, "endpoint_url": "127.0.0.1"}, "cloudB_pubsub.endpoint_url", "needs a port"),
    ({**GOOD, "endpoint_url": "grpc://h:1"}, "cloudB_pubsub.endpoint_url", "host:port"),
    ({**GOOD, "endpoint_url": "https://u:p@h"}, "cloudB_pubsub.endpoint_url", "credentials"),
    ({**GOOD, "endpoint_url": "https://h/v1"}, "cloudB_pubsub.endpoint_url", "path"),
    ({**GOOD, "endpoint_url": "h:99999"}, "cloudB_pubsub.endpoint_url", "invalid port"),
    ({**GOOD, "endpoint_url": "http://[::1"}, "cloudB_pubsub.endpoint_url", "host:port"),
    ({**GOOD, "region": "x"}, "cloudB_pubsub.region", "not a field"),
]


@pytest.fixture
def registry() -> Registry:
    ctx = AdapterContext(settings=Settings(**AMBIENT), egress=EgressPolicy(allow_private=True))
    return Registry(ctx, [PubSubAdapter])


@pytest.mark.parametrize("raw", VALID)
def test_valid_configs(registry: Registry, raw: dict[str, str]) -> None:
    config = registry.parse_config("cloudB_pubsub", raw)
    assert isinstance(config, PubSubConfig)
    assert registry.canonical("cloudB_pubsub") == "gcp_pubsub"


@pytest.mark.parametrize(("raw", "field", "message"), INVALID)
def test_invalid_configs(registry: Registry, raw: dict[str, str], field: str, message: str) -> None:
    with pytest.raises(ValidationError) as info:
        registry.parse_config("cloudB_pubsub", raw)
    assert info.value.field == field
    assert message in info.value.message
    # A rejected key is never echoed, not even through the exception chain.
    assert "PRIVATE KEY" not in info.value.message
    assert "PRIVATE KEY" not in str(info.value.__cause__)


def test_key_is_sensitive_and_not_part_of_the_target() -> None:
    config = PubSubConfig.model_validate({**GOOD, "service_account_json": SA.json})
    plain, secrets = config.split()
    assert set(secrets) == {"service_account_json"}
    assert "service_account_json" not in plain
    assert config.target() == (None, "my-project-1", "herald-events")
    moved = PubSubConfig.model_validate({**GOOD, "endpoint_url": "127.0.0.1:8085"})
    assert moved.target() != config.target()


@pytest.mark.parametrize(
    ("value", "target", "tls"),
    [
        ("127.0.0.1:8085", "127.0.0.1:8085", False),
        ("http://emulator:8085/", "emulator:8085", False),
        ("https://pubsub.example.com", "pubsub.example.com:443", True),
        ("https://[::1]:8443", "[::1]:8443", True),
    ],
)
def test_endpoint_forms(value: str, target: str, tls: bool) -> None:
    endpoint = parse_endpoint(value)
    assert (endpoint.target, endpoint.tls) == (target, tls)


# --- egress: the channel goes to the address the check pinned (issue 18, item 1) -------------
def pinned_adapter(dns: Rebinding) -> PubSubAdapter:
    return PubSubAdapter(AdapterContext(settings=Settings(**AMBIENT), egress=dns.policy()))


async def test_a_plaintext_channel_goes_to_the_address_the_egress_check_pinned(
    fake_publisher: FakePublisher,
) -> None:
    """The check answers 127.0.0.1 for a name no other resolver knows: gRPC, handed
    the name, would fail to resolve it; pinned, it reaches the server there."""
    await fake_publisher.create_topic(PROJECT, "events")
    dns = Rebinding("pubsub.rebind.test", "127.0.0.1", later=loopback_address())
    a = pinned_adapter(dns)
    raw = {
        "project_id": PROJECT,
        "topic": "events",
        "endpoint_url": f"pubsub.rebind.test:{fake_publisher.port}",
    }
    try:
        for _ in range(2):
            event = make_event()
            result = await publish(a, raw, event)
            assert result.outcome is Outcome.SUCCESS, result
            assert find(await fake_publisher.messages(PROJECT, "events"), event.id) is not None
    finally:
        await a.close()
    assert dns.policy_lookups == 1  # the second attempt reused the pinned pass and channel


async def test_a_tls_channel_to_a_pinned_address_still_verifies_the_host_name(
    secure_publisher: FakePublisher, trusted_account: ServiceAccount
) -> None:
    """The certificate covers 127.0.0.1 and TLS_NAME. Pinned to 127.0.0.1, the channel
    verifies the name it was given: TLS_NAME passes (and the JWT is accepted), a name
    the certificate does not cover is refused although the address is in it."""
    await secure_publisher.create_topic(PROJECT, "events")
    for name, ok in ((TLS_NAME, True), ("pubsub.other.test", False)):
        dns = Rebinding(name, "127.0.0.1")
        a = pinned_adapter(dns)
        raw = {
            "project_id": PROJECT,
            "topic": "events",
            "endpoint_url": f"https://{name}:{secure_publisher.port}",
            "service_account_json": trusted_account.json,
        }
        event = make_event()
        try:
            result = await publish(a, raw, event)
        finally:
            await a.close()
        published = find(await secure_publisher.messages(PROJECT, "events"), event.id)
        if ok:
            assert result.outcome is Outcome.SUCCESS, result
            assert published is not None
        else:
            assert result.outcome is Outcome.FAILURE_RETRYABLE, result
            assert published is None
            assert result.error is not None
            assert "Peer name pubsub.other.test is not in peer certificate" in result.error


async def test_a_refusing_pinned_address_falls_back_to_the_other_checked_ones(
    fake_publisher: FakePublisher,
) -> None:
    """Two permitted addresses, the first refusing connections: the channel's address
    list carries both, in order, so gRPC reaches the server at the second."""
    await fake_publisher.create_topic(PROJECT, "events")
    refusing = loopback_address()

    async def both(host: str) -> list[str]:
        assert host == "pubsub.rebind.test"
        return [refusing, "127.0.0.1"]

    networks = (ipaddress.ip_network(refusing), ipaddress.ip_network("127.0.0.1"))
    policy = EgressPolicy(allowed_networks=networks, resolver=both)
    a = PubSubAdapter(AdapterContext(settings=Settings(**AMBIENT), egress=policy))
    raw = {
        "project_id": PROJECT,
        "topic": "events",
        "endpoint_url": f"pubsub.rebind.test:{fake_publisher.port}",
    }
    event = make_event()
    try:
        result = await publish(a, raw, event)
    finally:
        await a.close()
    assert result.outcome is Outcome.SUCCESS, result
    assert find(await fake_publisher.messages(PROJECT, "events"), event.id) is not None
