"""``azure_servicebus`` with the real azure-servicebus SDK against the AMQP 1.0 test
broker (``broker.py``), read back by receiving with the SDK's own receiver."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from herald.adapters.azure_servicebus import (
    ServiceBusAdapter,
    ServiceBusConfig,
    named_tls_context,
    normalize_endpoint,
    parse_connection_string,
)
from herald.adapters.base import AdapterContext
from herald.adapters.registry import Registry
from herald.config import Settings
from herald.egress import EgressPolicy
from herald.errors import ValidationError
from herald.model import Event, Outcome
from tests.contract.adapter_contract import AdapterContract, make_destination, make_event
from tests.integration.azure.broker import Broker, sas_ok, sas_token, subscription_path
from tests.integration.azure.conftest import ENTITY, receive
from tests.integration.conftest import closed_port
from tests.integration.gcp.peers import TLS_NAME, Tls
from tests.integration.rebinding import Listener, Rebinding, loopback_address


class TestServiceBusContract(AdapterContract):
    adapter_class = ServiceBusAdapter
    broker: Broker

    @pytest.fixture(autouse=True)
    def _broker(self, broker: Broker) -> None:
        self.broker = broker

    @pytest.fixture
    def good_config(self, broker: Broker) -> dict[str, str]:
        return {"name": ENTITY, "connection_string": broker.connection_string()}

    @pytest.fixture
    def missing_target_config(self, broker: Broker) -> dict[str, str]:
        return {"name": "no-such-queue", "connection_string": broker.connection_string()}

    @pytest.fixture
    def bad_credentials_config(self, broker: Broker) -> dict[str, str]:
        # A key name the broker does not know: put-token on $cbs answers 401.
        return {"name": ENTITY, "connection_string": broker.connection_string(key_name="other")}

    @pytest.fixture
    def unreachable_config(self) -> dict[str, str]:
        conn = (
            f"Endpoint=sb://127.0.0.1:{closed_port()};SharedAccessKeyName=herald;"
            "SharedAccessKey=c2VjcmV0LWtleQ==;UseDevelopmentEmulator=true"
        )
        return {"name": ENTITY, "connection_string": conn}

    async def read_back(self, config: dict[str, str], event: Event) -> dict[str, Any]:
        got = await receive(self.broker.connection_string(), config["name"], 1)
        message = got[0]
        assert message.message_id == event.id
        return {"body": message.body, "metadata": message.application_properties}

    async def test_message_properties_as_the_sdk_receives_them(
        self, adapter: ServiceBusAdapter, good_config: dict[str, str]
    ) -> None:
        event = make_event("task_run.failed", tenant="org_42")
        assert (await self.publish(adapter, good_config, event)).outcome is Outcome.SUCCESS
        [message] = await receive(self.broker.connection_string(), ENTITY, 1)
        assert json.loads(message.body) == json.loads(event.envelope())
        assert message.message_id == event.id
        assert message.subject == "task_run.failed"
        assert message.content_type == "application/json"
        assert message.application_properties == event.metadata()
        assert self.broker.stored(ENTITY) == []  # completed, so gone

    async def test_an_ordered_destination_sends_the_key_as_the_session_id(
        self, adapter: ServiceBusAdapter, good_config: dict[str, str]
    ) -> None:
        """Ordered: a keyed event's ``session_id`` is its ordering key (a key over 128
        characters as its SHA-256); no session for a keyless event, nor for any event of
        an unordered destination."""
        config = self.parse(good_config)
        base = make_destination(ServiceBusAdapter.type_id, config)
        ordered, unordered = (dataclasses.replace(base, ordering=o) for o in ("key", "none"))
        long_key = "k" * 200
        plan = [(ordered, "order-1"), (ordered, None), (unordered, "order-1"), (ordered, long_key)]
        sent = []
        for dest, key in plan:
            event = make_event()
            event.ordering_key = key
            sent.append(event)
            result = await adapter.deliver(dest, config, event)
            assert result.outcome is Outcome.SUCCESS, result
        got = await receive(self.broker.connection_string(), ENTITY, len(sent))
        sessions = {m.message_id: m.session_id for m in got}
        assert [sessions[e.id] for e in sent] == [
            "order-1",
            None,
            None,
            hashlib.sha256(long_key.encode()).hexdigest(),
        ]

    async def test_a_batch_never_spans_two_sessions(
        self, adapter: ServiceBusAdapter, good_config: dict[str, str]
    ) -> None:
        """Concurrent attempts of an ordered destination batch by session only (Service
        Bus refuses a batch across sessions on a partitioned entity with duplicate
        detection), each in the order it queued."""
        config = self.parse(good_config)
        dest = dataclasses.replace(
            make_destination(ServiceBusAdapter.type_id, config), ordering="key"
        )
        assert (await adapter.deliver(dest, config, make_event())).outcome is Outcome.SUCCESS
        events = []
        for i in range(30):
            event = make_event()
            event.ordering_key = f"key-{i % 3}" if i % 5 else None
            events.append(event)
        results = await asyncio.gather(*(adapter.deliver(dest, config, e) for e in events))
        assert {r.outcome for r in results} == {Outcome.SUCCESS}
        for sessions in self.broker.transfer_sessions:
            assert len(set(sessions)) == 1, self.broker.transfer_sessions
        got = await receive(self.broker.connection_string(), ENTITY, 31)
        assert {m.message_id for m in got} >= {e.id for e in events}

    async def test_missing_entity_is_permanent_then_recovers(
        self, adapter: ServiceBusAdapter, missing_target_config: dict[str, str]
    ) -> None:
        result = await self.publish(adapter, missing_target_config, make_event())
        assert result.outcome is Outcome.FAILURE_PERMANENT
        assert result.error is not None
        assert result.error.startswith("MessagingEntityNotFoundError: ")
        assert "no-such-queue" in result.error
        self.broker.add_entity("no-such-queue")  # the operator creates the queue
        again = await self.publish(adapter, missing_target_config, make_event())
        assert again.outcome is Outcome.SUCCESS, again
        assert len(self.broker.stored("no-such-queue")) == 1

    async def test_refused_credentials_are_permanent(
        self, adapter: ServiceBusAdapter, bad_credentials_config: dict[str, str]
    ) -> None:
        result = await self.publish(adapter, bad_credentials_config, make_event())
        assert result.outcome is Outcome.FAILURE_PERMANENT
        assert result.error is not None
        assert result.error.startswith("ServiceBusAuthenticationError: ")
        assert "SharedAccessKey" not in result.error

    async def test_concurrent_sends_share_one_sender(
        self, adapter: ServiceBusAdapter, good_config: dict[str, str]
    ) -> None:
        """Attempts overlap as they do in the engine (started at staggered times): the
        SDK's sender must not interleave them, or transfers reach the wire out of
        delivery-id order and the broker drops the connection."""
        assert (await self.publish(adapter, good_config, make_event())).outcome is Outcome.SUCCESS
        events = [make_event() for _ in range(60)]

        async def staggered(i: int, event: Event) -> Any:
            await asyncio.sleep((i % 12) * 0.02)
            return await self.publish(adapter, good_config, event)

        results = await asyncio.gather(*(staggered(i, e) for i, e in enumerate(events)))
        assert [r.error for r in results if r.outcome is not Outcome.SUCCESS] == []
        assert self.broker.errors == []
        assert len(adapter.clients) == 1
        # Attempts that queued up while a send was in flight went out as batches...
        assert self.broker.transfers < 1 + len(events)
        # ...each message intact inside.
        stored = {m.id: m for m in self.broker.stored(ENTITY)}
        for event in events:
            message = stored[event.id]
            assert message.subject == event.type
            assert dict(message.properties or {}) == event.metadata()
            assert isinstance(message.body, bytes | memoryview)
            assert json.loads(bytes(message.body)) == json.loads(event.envelope())

    async def test_sas_token_connection_string(
        self, adapter: ServiceBusAdapter, broker: Broker
    ) -> None:
        token = sas_token(f"sb://{broker.namespace}", "herald", broker.keys["herald"])
        conn = (
            f"Endpoint=sb://{broker.namespace}/;SharedAccessSignature={token};"
            "UseDevelopmentEmulator=true"
        )
        result = await self.publish(
            adapter, {"name": ENTITY, "connection_string": conn}, make_event()
        )
        assert result.outcome is Outcome.SUCCESS, result

    async def test_endpoint_url_routes_the_connection(
        self, adapter: ServiceBusAdapter, broker: Broker
    ) -> None:
        """The namespace in the connection string is not resolvable; ``endpoint_url``
        carries the connection to the broker (the SDK's custom endpoint address)."""
        conn = (
            "Endpoint=sb://herald-test.servicebus.invalid:5672/;SharedAccessKeyName=herald;"
            f"SharedAccessKey={broker.keys['herald']};UseDevelopmentEmulator=true"
        )
        raw = {"name": ENTITY, "connection_string": conn, "endpoint_url": broker.namespace}
        result = await self.publish(adapter, raw, make_event())
        assert result.outcome is Outcome.SUCCESS, result
        assert len(broker.stored(ENTITY)) == 1


async def publish(
    adapter: ServiceBusAdapter, raw: dict[str, str], event: Event | None = None
) -> Any:
    config = ServiceBusConfig.model_validate(raw)
    destination = make_destination("azure_servicebus", config)
    return await adapter.deliver(destination, config, event or make_event())


async def test_message_too_large_is_permanent_and_alone() -> None:
    """An event over the entity's size limit fails by itself; the others go out."""
    broker = Broker(entities=[ENTITY], max_message_size=4096).start()
    adapter = ServiceBusAdapter(
        AdapterContext(settings=Settings(), egress=EgressPolicy(allow_private=True))
    )
    try:
        raw = {"name": ENTITY, "connection_string": broker.connection_string()}
        small = [make_event() for _ in range(5)]
        big = dataclasses.replace(make_event(), data=json.dumps({"blob": "x" * 8000}).encode())
        assert (await publish(adapter, raw, small[0])).outcome is Outcome.SUCCESS
        results = await asyncio.gather(*(publish(adapter, raw, e) for e in [*small[1:], big]))
        assert [r.outcome for r in results[:-1]] == [Outcome.SUCCESS] * 4
        assert results[-1].outcome is Outcome.FAILURE_PERMANENT
        assert results[-1].error.startswith("MessageSizeExceededError: ")
        assert {m.id for m in broker.stored(ENTITY)} == {e.id for e in small}
        assert len(adapter.clients) == 1  # the sender was fine: kept
    finally:
        await adapter.close()
        broker.stop()


# --- hanging peers: every SDK call is bounded ---------------------------------------
@pytest.fixture
async def quick_adapter() -> AsyncIterator[ServiceBusAdapter]:
    settings = Settings.model_validate({"delivery": {"adapter_timeout_seconds": 2.0}})
    a = ServiceBusAdapter(
        AdapterContext(settings=settings, egress=EgressPolicy(allow_private=True))
    )
    yield a
    await a.close()


async def test_auth_that_never_answers_times_out_then_reconnects(
    quick_adapter: ServiceBusAdapter,
) -> None:
    """A broker that swallows put-token (as one that rejects claims-based auth does):
    the SDK would wait forever; the attempt ends at the bound, and the next attempt
    opens a fresh connection instead of reusing the stuck one."""
    broker = Broker(entities=[ENTITY], stall_auth=True).start()
    try:
        raw = {"name": ENTITY, "connection_string": broker.connection_string()}
        started = time.monotonic()
        result = await publish(quick_adapter, raw)
        assert time.monotonic() - started < 4
        assert result.outcome is Outcome.TIMEOUT
        assert result.error == "connecting and authenticating did not finish within 2 s"
        assert len(quick_adapter.clients) == 0
        broker.stall_auth = False
        result = await publish(quick_adapter, raw)
        assert result.outcome is Outcome.SUCCESS, result
        assert broker.auth_requests == 2
    finally:
        broker.stop()


async def test_silent_peer_times_out(quick_adapter: ServiceBusAdapter) -> None:
    """Accepts TCP, never speaks AMQP: bounded, typed as a timeout."""
    connections: list[asyncio.StreamWriter] = []

    async def swallow(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        conn = (
            f"Endpoint=sb://127.0.0.1:{port};SharedAccessKeyName=herald;"
            "SharedAccessKey=c2VjcmV0LWtleQ==;UseDevelopmentEmulator=true"
        )
        started = time.monotonic()
        result = await publish(quick_adapter, {"name": ENTITY, "connection_string": conn})
        assert time.monotonic() - started < 4
        assert result.outcome is Outcome.TIMEOUT
        assert connections, "the SDK never connected"
    finally:
        for writer in connections:
            writer.close()
        server.close()
        await server.wait_closed()


async def test_close_releases_senders(broker: Broker) -> None:
    adapter = ServiceBusAdapter(
        AdapterContext(settings=Settings(), egress=EgressPolicy(allow_private=True))
    )
    raw = {"name": ENTITY, "connection_string": broker.connection_string()}
    assert (await publish(adapter, raw)).outcome is Outcome.SUCCESS
    assert len(adapter.clients) == 1
    await adapter.close()
    assert len(adapter.clients) == 0
    # Reusable after close: a new sender is opened on demand.
    assert (await publish(adapter, raw)).outcome is Outcome.SUCCESS
    await adapter.close()


def test_broker_checks_the_sas_signature() -> None:
    """The broker refuses a token signed with the wrong key, not only an unknown name."""
    keys = {"herald": "c2VjcmV0LWtleQ=="}
    uri = "sb://127.0.0.1:5672"
    assert sas_ok(sas_token(uri, "herald", "c2VjcmV0LWtleQ=="), keys)
    assert not sas_ok(sas_token(uri, "herald", "d3Jvbmc="), keys)
    assert not sas_ok(sas_token(uri, "other", "c2VjcmV0LWtleQ=="), keys)
    assert not sas_ok("Bearer x", keys)


# --- config --------------------------------------------------------------------------
KEY = "c2VjcmV0LWtleS12YWx1ZQ=="
CONN = (
    "Endpoint=sb://herald.servicebus.windows.net/;"
    f"SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey={KEY}"
)

VALID: list[dict[str, str]] = [
    {"name": "orders", "connection_string": CONN},
    {"name": "orders", "connection_string": CONN + ";EntityPath=orders"},
    {"name": "a.b-c_d/e", "connection_string": CONN.lower().replace(KEY.lower(), KEY)},
    {
        "name": "orders",
        "connection_string": "Endpoint=sb://localhost:5672;SharedAccessKeyName=k;"
        "SharedAccessKey=v;UseDevelopmentEmulator=true",
    },
    {
        "name": "orders",
        "connection_string": "Endpoint=sb://ns.servicebus.windows.net/;"
        "SharedAccessSignature=SharedAccessSignature sr=x&sig=y&se=1&skn=k",
    },
    {"name": "orders", "connection_string": CONN, "endpoint_url": "sb://gateway.example:443"},
    {"name": "orders", "connection_string": CONN, "endpoint_url": "127.0.0.1:5672"},
]

INVALID: list[tuple[dict[str, str], str, str]] = [
    ({"connection_string": CONN}, "cloudC_servicebus.name", "is required"),
    ({"name": "orders"}, "cloudC_servicebus.connection_string", "is required"),
    ({"name": "-orders", "connection_string": CONN}, "cloudC_servicebus.name", "queue or topic"),
    ({"name": "or ders", "connection_string": CONN}, "cloudC_servicebus.name", "queue or topic"),
    ({"name": "x" * 261, "connection_string": CONN}, "cloudC_servicebus.name", "queue or topic"),
    (
        {"name": "orders", "connection_string": ""},
        "cloudC_servicebus.connection_string",
        "Key=Value",
    ),
    (
        {"name": "orders", "connection_string": "just a key"},
        "cloudC_servicebus.connection_string",
        "Key=Value",
    ),
    (
        {"name": "orders", "connection_string": f"SharedAccessKeyName=k;SharedAccessKey={KEY}"},
        "cloudC_servicebus.connection_string",
        "must contain Endpoint",
    ),
    (
        {"name": "orders", "connection_string": CONN.replace("sb://", "https://")},
        "cloudC_servicebus.connection_string",
        "not an sb://host/",
    ),
    (
        {"name": "orders", "connection_string": CONN.replace(f";SharedAccessKey={KEY}", "")},
        "cloudC_servicebus.connection_string",
        "SharedAccessKeyName and SharedAccessKey",
    ),
    (
        {
            "name": "orders",
            "connection_string": CONN + ";SharedAccessSignature=SharedAccessSignature sr=x",
        },
        "cloudC_servicebus.connection_string",
        "not both",
    ),
    (
        {
            "name": "orders",
            "connection_string": "Endpoint=sb://ns/;SharedAccessSignature=sig=abc",
        },
        "cloudC_servicebus.connection_string",
        "not a SAS token",
    ),
    (
        {"name": "orders", "connection_string": CONN.replace("herald.servicebus", "[::1")},
        "cloudC_servicebus.connection_string",
        "not an sb://host/",
    ),
    (
        {"name": "orders", "connection_string": CONN + ";EntityPath=invoices"},
        "cloudC_servicebus.connection_string",
        "EntityPath",
    ),
    (
        {"name": "orders", "connection_string": CONN + ";UseDevelopmentEmulator=yes"},
        "cloudC_servicebus.connection_string",
        "UseDevelopmentEmulator",
    ),
    (
        {"name": "orders", "connection_string": CONN + ";Endpoint=sb://other/"},
        "cloudC_servicebus.connection_string",
        "twice",
    ),
    (
        {"name": "orders", "connection_string": CONN, "endpoint_url": "https://gw"},
        "cloudC_servicebus.endpoint_url",
        "sb://host",
    ),
    (
        {"name": "orders", "connection_string": CONN, "endpoint_url": "sb://gw/path"},
        "cloudC_servicebus.endpoint_url",
        "path",
    ),
    (
        {"name": "orders", "connection_string": CONN, "topic": "t"},
        "cloudC_servicebus.topic",
        "not a field",
    ),
]


@pytest.fixture
def registry() -> Registry:
    ctx = AdapterContext(settings=Settings(), egress=EgressPolicy(allow_private=True))
    return Registry(ctx, [ServiceBusAdapter])


@pytest.mark.parametrize("raw", VALID)
def test_valid_configs(registry: Registry, raw: dict[str, str]) -> None:
    assert isinstance(registry.parse_config("cloudC_servicebus", raw), ServiceBusConfig)
    assert registry.canonical("cloudC_servicebus") == "azure_servicebus"


@pytest.mark.parametrize(("raw", "field", "message"), INVALID)
def test_invalid_configs(registry: Registry, raw: dict[str, str], field: str, message: str) -> None:
    with pytest.raises(ValidationError) as info:
        registry.parse_config("cloudC_servicebus", raw)
    assert info.value.field == field
    assert message in info.value.message
    # The key is never echoed, not even through the exception chain.
    assert KEY not in info.value.message
    assert KEY not in str(info.value.__cause__)


def test_endpoint_is_the_target_and_the_key_is_sensitive() -> None:
    config = ServiceBusConfig.model_validate({"name": "orders", "connection_string": CONN})
    plain, secrets = config.split()
    assert set(secrets) == {"connection_string"}
    assert plain == {"name": "orders"}
    assert config.target() == ("herald.servicebus.windows.net", None, "orders")
    rotated = ServiceBusConfig.model_validate(
        {"name": "orders", "connection_string": CONN.replace(KEY, "bmV3LWtleQ==")}
    )
    assert rotated.target() == config.target()
    moved = ServiceBusConfig.model_validate(
        {"name": "orders", "connection_string": CONN.replace("herald.", "other.")}
    )
    assert moved.target() != config.target()


def test_connection_string_parts() -> None:
    parsed = parse_connection_string(
        "endpoint=sb://127.0.0.1:5672;sharedaccesskeyname=k;sharedaccesskey=v;"
        "usedevelopmentemulator=TRUE;entitypath=orders;"
    )
    assert (parsed.namespace, parsed.entity_path, parsed.emulator) == (
        "127.0.0.1:5672",
        "orders",
        True,
    )
    assert normalize_endpoint("amqps://gw.example") == "sb://gw.example"
    assert normalize_endpoint("127.0.0.1:5672") == "sb://127.0.0.1:5672"


async def test_topic_name_fans_out_to_every_subscription() -> None:
    """``name`` may be a topic. The SDK's queue and topic senders make the same link (to the
    entity path), so the adapter sends to either without knowing which it is; Service Bus
    copies each message into every subscription, where the SDK's subscription receiver
    reads it."""
    topic, subscriptions = "events", ("audit", "billing")
    broker = Broker(topics={topic: subscriptions}).start()
    adapter = ServiceBusAdapter(
        AdapterContext(settings=Settings(), egress=EgressPolicy(allow_private=True))
    )
    try:
        conn = broker.connection_string()
        events = [make_event("task_run.failed", tenant="org_42") for _ in range(3)]
        for event in events:
            result = await publish(adapter, {"name": topic, "connection_string": conn}, event)
            assert result.outcome is Outcome.SUCCESS, result
        for subscription in subscriptions:
            got = await receive(conn, topic, len(events), subscription=subscription)
            assert [m.message_id for m in got] == [e.id for e in events]
            for message, event in zip(got, events, strict=True):
                assert json.loads(message.body) == json.loads(event.envelope())
                assert message.subject == "task_run.failed"
                assert message.content_type == "application/json"
                assert message.application_properties == event.metadata()
            assert broker.stored(subscription_path(topic, subscription)) == []
        assert broker.refused == []
    finally:
        await adapter.close()
        broker.stop()


# --- egress: the connection goes to the address the check pinned (issue 18, item 1) -----------
async def test_the_connection_goes_to_the_address_the_egress_check_pinned(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check sees 127.0.0.1 (allowed); every later lookup of the name answers
    another loopback address, where a listener on the broker's port counts
    connections. The SDK is handed the checked address, never the name."""
    name = "sb.rebind.test"
    dns = Rebinding(name, "127.0.0.1", later=loopback_address())
    dns.install(monkeypatch)
    decoy = await Listener(dns.later or "", broker.port).start()
    a = ServiceBusAdapter(AdapterContext(settings=Settings(), egress=dns.policy()))
    raw = {
        "name": ENTITY,
        "connection_string": broker.connection_string().replace("127.0.0.1", name),
    }
    config = ServiceBusConfig.model_validate(raw)
    events = [make_event(), make_event()]
    try:
        for event in events:
            result = await asyncio.wait_for(
                a.deliver(make_destination("azure_servicebus", config), config, event), 30
            )
            assert result.outcome is Outcome.SUCCESS, result
    finally:
        await a.close()
        await decoy.stop()
    got = await receive(broker.connection_string(), ENTITY, 2)
    assert [m.message_id for m in got] == [e.id for e in events]
    assert decoy.connections == 0
    assert dns.sdk_lookups == 0  # the SDK never resolved the name
    assert dns.policy_lookups == 1  # the second attempt reused the pinned pass and sender


async def test_tls_to_a_pinned_address_verifies_the_host_name(tmp_path: Path) -> None:
    """The context the adapter hands the SDK for a pinned connection checks the
    certificate against the dialled name, whatever address the SDK connected to
    (the test broker speaks no TLS, so this is the context against a TLS server)."""
    tls = Tls.generate()  # covers 127.0.0.1 and TLS_NAME
    (tmp_path / "cert.pem").write_bytes(tls.cert_pem)
    (tmp_path / "key.pem").write_bytes(tls.key_pem)
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")

    async def handshake(name: str) -> str | None:
        served: list[str | None] = []

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.close()

        server_context.sni_callback = lambda sock, sni, ctx: served.append(sni)
        server = await asyncio.start_server(accept, "127.0.0.1", 0, ssl=server_context)
        port = server.sockets[0].getsockname()[1]
        client = named_tls_context(name, cafile=str(tmp_path / "cert.pem"))
        try:
            # As the SDK opens it: to the (pinned) address, naming the address.
            _, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=client, server_hostname="127.0.0.1"
            )
            writer.close()
            return served[0] if served else None
        finally:
            server.close()
            await server.wait_closed()

    assert await handshake(TLS_NAME) == TLS_NAME  # SNI names the host, and it verifies
    with pytest.raises(ssl.SSLCertVerificationError, match=r"pubsub\.other\.test"):
        await handshake("pubsub.other.test")  # 127.0.0.1 is in the certificate: not enough
