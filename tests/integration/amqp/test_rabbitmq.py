"""The rabbitmq adapter against the real RabbitMQ on 127.0.0.1 (AMQP 0-9-1, aio-pika).

Every publish goes to the broker and is read back from a queue bound to the
test's own topic exchange. The TLS and outage tests use the run's private node
(a CA made by the run signed its TLS certificate; the outage test stops the node).
"""

from __future__ import annotations

import asyncio
import ipaddress
import secrets
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import aio_pika
import pytest

from herald.adapters.base import Adapter, AdapterContext, DestinationConfig, Result
from herald.adapters.rabbitmq import ORDERING_KEY_HEADER, RabbitMQAdapter, RabbitMQConfig
from herald.adapters.registry import Registry
from herald.config import DeliverySettings, Settings
from herald.egress import EgressPolicy
from herald.errors import ValidationError
from herald.model import VERIFICATION_EVENT_TYPE, Destination, Event, Outcome
from herald.views import destination_view
from tests.contract.adapter_contract import AdapterContract, make_destination, make_event
from tests.integration.amqp import broker
from tests.integration.amqp.broker import HOST, PORT, BrokerUser, Inspector, PrivateBroker
from tests.integration.rebinding import Listener, Rebinding, loopback_address
from tests.support.daemon import free_port

GUEST = {"username": "guest", "password": "guest"}


async def read_message(url: str, exchange: str, event_id: str) -> Any:
    ins = await Inspector.open(url)
    try:
        got = await ins.collect(
            broker.queue_for(exchange),
            until=lambda ms: any(m.message_id == event_id for m in ms),
            timeout=10,
        )
    finally:
        await ins.close()
    return next(m for m in got if m.message_id == event_id)


class TestRabbitMQContract(AdapterContract):
    adapter_class = RabbitMQAdapter

    @pytest.fixture
    def good_config(self, exchange: str) -> dict[str, str]:
        return {"server_url": f"{HOST}:{PORT}", "exchange": exchange, **GUEST}

    @pytest.fixture
    def missing_target_config(self, rabbitmq: None) -> dict[str, str]:
        return {"server_url": f"{HOST}:{PORT}", "exchange": "herald.test.missing", **GUEST}

    @pytest.fixture
    def bad_credentials_config(self, exchange: str) -> dict[str, str]:
        return {
            "server_url": f"{HOST}:{PORT}",
            "exchange": exchange,
            "username": "guest",
            "password": "not-the-password",
        }

    @pytest.fixture
    def unreachable_config(self) -> dict[str, str]:
        return {"server_url": f"{HOST}:{free_port()}", "exchange": "x", **GUEST}

    async def read_back(self, config: dict[str, str], event: Event) -> dict[str, Any]:
        message = await read_message(broker.GUEST_URL, config["exchange"], event.id)
        return {"body": message.body, "metadata": dict(message.headers)}


# --- helpers --------------------------------------------------------------------------------
LOOPBACK_ALLOWED = EgressPolicy(
    allowed_networks=(ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))
)


@pytest.fixture
async def adapter() -> AsyncIterator[RabbitMQAdapter]:
    # Brokers live on private networks; the operator allows them by name (README).
    a = RabbitMQAdapter(AdapterContext(settings=Settings(), egress=LOOPBACK_ALLOWED))
    yield a
    await a.close()


def parse(raw: dict[str, str]) -> RabbitMQConfig:
    return RabbitMQConfig.model_validate(raw)


async def send(
    adapter: Adapter, raw: dict[str, str] | DestinationConfig, event: Event | None = None
) -> tuple[Result, Event, Destination]:
    config = raw if isinstance(raw, DestinationConfig) else parse(raw)
    dest = make_destination("rabbitmq", config)
    event = event or make_event()
    return await adapter.deliver(dest, config, event), event, dest


# --- what arrives ---------------------------------------------------------------------------
async def test_message_carries_routing_key_headers_id_and_persistence(
    adapter: RabbitMQAdapter, exchange: str
) -> None:
    event = make_event("task_run.completed", tenant="acme")
    result, _, _ = await send(
        adapter, {"server_url": f"{HOST}:{PORT}", "exchange": exchange, **GUEST}, event
    )
    assert result.outcome is Outcome.SUCCESS, result
    message = await read_message(broker.GUEST_URL, exchange, event.id)
    assert message.body == event.envelope()
    assert message.routing_key == "task_run.completed"
    assert message.exchange == exchange
    assert message.message_id == event.id
    assert message.content_type == "application/json"
    assert message.delivery_mode == 2  # persistent
    assert dict(message.headers) == {
        "event-id": event.id,
        "event-type": "task_run.completed",
        "event-created-at": "2026-11-22T10:00:00.123456789Z",
        "tenant-id": "acme",
    }


async def test_an_ordering_key_travels_as_the_ordering_key_header(
    adapter: RabbitMQAdapter, exchange: str
) -> None:
    """The key is a header whenever the event has one (ordered destination or not); an
    event without a key has no such header."""
    raw = {"server_url": f"{HOST}:{PORT}", "exchange": exchange, **GUEST}
    keyed = make_event()
    keyed.ordering_key = "customer/42 ü"
    plain = make_event()
    for event in (keyed, plain):
        result, _, _ = await send(adapter, raw, event)
        assert result.outcome is Outcome.SUCCESS, result
    ins = await Inspector.open(broker.GUEST_URL)
    try:
        got = await ins.collect(broker.queue_for(exchange), until=lambda ms: len(ms) >= 2)
    finally:
        await ins.close()
    headers = {m.message_id: dict(m.headers) for m in got}
    assert ORDERING_KEY_HEADER == "ordering-key"
    assert headers[keyed.id][ORDERING_KEY_HEADER] == "customer/42 ü"
    assert ORDERING_KEY_HEADER not in headers[plain.id]


async def test_credentials_and_vhost_come_from_the_url_and_write_is_enough(
    adapter: RabbitMQAdapter, broker_user: BrokerUser
) -> None:
    """A user whose password needs percent-encoding, on a vhost with a slash in its name,
    with only the ``write`` permission: Herald never declares, so that is all it needs."""
    ins = await Inspector.open(broker_user.guest_url)
    name = f"herald.test.{secrets.token_hex(4)}"
    try:
        await ins.topic(name)
        config = parse({"server_url": broker_user.url, "exchange": name})
        assert config.username == broker_user.name
        assert config.password == broker_user.password
        assert "p@ss" not in config.server_url
        assert config.key().vhost == broker_user.vhost
        result, event, _ = await send(adapter, config)
        assert result.outcome is Outcome.SUCCESS, result
        message = await read_message(broker_user.guest_url, name, event.id)
        assert message.body == event.envelope()
    finally:
        await ins.delete(name)
        await ins.close()


async def test_no_write_permission_is_a_permanent_failure(
    adapter: RabbitMQAdapter, broker_user: BrokerUser
) -> None:
    ins = await Inspector.open(broker_user.guest_url)
    name = f"other.{secrets.token_hex(4)}"  # outside the user's write permission
    try:
        await ins.topic(name)
        result, _, _ = await send(adapter, {"server_url": broker_user.url, "exchange": name})
        assert result.outcome is Outcome.FAILURE_PERMANENT, result
        assert result.error is not None
        assert result.error.startswith(f"access refused: user {broker_user.name!r} may not publish")
        assert broker_user.password not in result.error
    finally:
        await ins.delete(name)
        await ins.close()


async def test_explicit_username_and_password_win_over_the_url(
    adapter: RabbitMQAdapter, exchange: str
) -> None:
    raw = {"server_url": f"amqp://nobody:wrong@{HOST}:{PORT}/", "exchange": exchange, **GUEST}
    result, event, _ = await send(adapter, raw)
    assert result.outcome is Outcome.SUCCESS, result
    await read_message(broker.GUEST_URL, exchange, event.id)


async def test_mandatory_makes_unroutable_a_failure_but_not_for_verification(
    adapter: RabbitMQAdapter, inspector: Inspector
) -> None:
    name = f"herald.test.{secrets.token_hex(4)}"
    await inspector.topic(name, binding="task_run.#")
    try:
        base = {"server_url": f"{HOST}:{PORT}", "exchange": name, **GUEST}
        strict = {**base, "mandatory": "true"}
        unroutable, _, _ = await send(adapter, strict, make_event("workflow_run.started"))
        assert unroutable.outcome is Outcome.FAILURE_PERMANENT
        assert unroutable.error is not None
        assert "unroutable" in unroutable.error
        assert "workflow_run.started" in unroutable.error
        routed, _, _ = await send(adapter, strict, make_event("task_run.completed"))
        assert routed.outcome is Outcome.SUCCESS, routed
        lenient, _, _ = await send(adapter, base, make_event("workflow_run.started"))
        assert lenient.outcome is Outcome.SUCCESS, lenient
        # A verification ping proves broker, credentials and exchange; no binding needed.
        ping, _, _ = await send(adapter, strict, make_event(VERIFICATION_EVENT_TYPE))
        assert ping.outcome is Outcome.SUCCESS, ping
    finally:
        await inspector.delete(name)


async def test_a_message_the_broker_nacks_is_a_retryable_failure(
    adapter: RabbitMQAdapter, inspector: Inspector
) -> None:
    """Publisher confirms: the broker refuses the message (basic.nack) because the only
    queue it routes to is full and rejects publishes; the attempt must fail, retryably
    (the queue may drain), and the same channel must publish again once it can."""
    name = f"herald.test.{secrets.token_hex(4)}"
    queue = broker.queue_for(name)
    full = {"x-max-length": 0, "x-overflow": "reject-publish"}

    async def declare(arguments: dict[str, Any] | None) -> None:
        async with inspector.connection.channel() as channel:
            ex = await channel.declare_exchange(name, aio_pika.ExchangeType.TOPIC, robust=False)
            q = await channel.declare_queue(queue, arguments=arguments, robust=False)
            await q.bind(ex, "#", robust=False)

    await declare(full)
    try:
        config = parse({"server_url": f"{HOST}:{PORT}", "exchange": name, **GUEST})
        refused, _, dest = await send(adapter, config)
        assert refused.outcome is Outcome.FAILURE_RETRYABLE, refused
        assert refused.error is not None
        assert refused.error.startswith("the broker refused the message"), refused.error
        assert "Nack" in refused.error, refused.error
        assert await inspector.drain(queue) == []
        # The queue gets room: the next attempt, on the same connection, is confirmed.
        async with inspector.connection.channel() as channel:
            await channel.queue_delete(queue)
        await declare(None)
        event = make_event()
        accepted = await adapter.deliver(dest, config, event)
        assert accepted.outcome is Outcome.SUCCESS, accepted
        assert adapter.connection_count == 1
        message = await read_message(broker.GUEST_URL, name, event.id)
        assert message.body == event.envelope()
    finally:
        await inspector.delete(name)


async def test_missing_exchange_is_clear_and_does_not_disturb_other_destinations(
    adapter: RabbitMQAdapter, exchange: str
) -> None:
    good = parse({"server_url": f"{HOST}:{PORT}", "exchange": exchange, **GUEST})
    missing = parse({"server_url": f"{HOST}:{PORT}", "exchange": "herald.test.nope", **GUEST})
    good_dest = make_destination("rabbitmq", good)
    missing_dest = make_destination("rabbitmq", missing)
    events = [make_event() for _ in range(40)]
    results = await asyncio.gather(
        *(
            adapter.deliver(*((good_dest, good) if i % 2 else (missing_dest, missing)), e)
            for i, e in enumerate(events)
        )
    )
    assert adapter.connection_count == 1  # one broker, one shared connection
    for i, r in enumerate(results):
        if i % 2:
            assert r.outcome is Outcome.SUCCESS, r
        else:
            assert r.outcome is Outcome.FAILURE_PERMANENT, r
            assert r.error == (
                "exchange 'herald.test.nope' does not exist in vhost '/'; Herald never declares it"
            )


async def test_connections_are_shared_per_broker_and_closed_with_the_adapter(
    adapter: RabbitMQAdapter, exchange: str, inspector: Inspector
) -> None:
    other = f"herald.test.{secrets.token_hex(4)}"
    await inspector.topic(other)
    try:
        a = parse({"server_url": f"{HOST}:{PORT}", "exchange": exchange, **GUEST})
        b = parse({"server_url": f"amqp://guest:guest@{HOST}:{PORT}/", "exchange": other})
        c = parse({"server_url": f"localhost:{PORT}", "exchange": exchange, **GUEST})
        dests = [make_destination("rabbitmq", cfg) for cfg in (a, b, c)]
        results = await asyncio.gather(
            *(
                adapter.deliver(dest, cfg, make_event())
                for dest, cfg in zip(dests * 5, (a, b, c) * 5, strict=True)
            )
        )
        assert all(r.outcome is Outcome.SUCCESS for r in results), results
        assert adapter.connection_count == 2  # a and b share one; c names another host
        await adapter.forget(dests[0].id)  # b still uses the connection
        again = await adapter.deliver(dests[1], b, make_event())
        assert again.outcome is Outcome.SUCCESS, again
        await adapter.close()
        assert adapter.connection_count == 0
        after = await adapter.deliver(dests[0], a, make_event())  # reopens on demand
        assert after.outcome is Outcome.SUCCESS, after
        assert adapter.connection_count == 1
    finally:
        await inspector.delete(other)


async def test_unknown_vhost_is_a_permanent_failure(
    adapter: RabbitMQAdapter, rabbitmq: None
) -> None:
    raw = {"server_url": f"amqp://{HOST}:{PORT}/no-such-vhost", "exchange": "x", **GUEST}
    result, _, _ = await send(adapter, raw)
    assert result.outcome is Outcome.FAILURE_PERMANENT
    assert result.error is not None
    assert "'no-such-vhost'" in result.error


async def test_bad_password_never_appears_in_the_error(
    adapter: RabbitMQAdapter, exchange: str
) -> None:
    password = "Sup3r-" + secrets.token_hex(6)
    raw = {"server_url": f"amqp://guest:{password}@{HOST}:{PORT}/", "exchange": exchange}
    result, _, _ = await send(adapter, raw)
    assert result.outcome is Outcome.FAILURE_PERMANENT
    assert result.error is not None
    assert "authentication failed for user 'guest'" in result.error
    assert password not in result.error


# --- the broker goes away and comes back ------------------------------------------------------
async def test_broker_outage_fails_fast_and_the_same_adapter_recovers(
    private_broker: PrivateBroker, adapter: RabbitMQAdapter, private_exchange: str
) -> None:
    server = f"{HOST}:{private_broker.port}"
    config = parse({"server_url": server, "exchange": private_exchange, **GUEST})
    dest = make_destination("rabbitmq", config)
    first = await adapter.deliver(dest, config, make_event())
    assert first.outcome is Outcome.SUCCESS, first
    await asyncio.to_thread(private_broker.stop)
    try:
        t0 = time.perf_counter()
        down = await adapter.deliver(dest, config, make_event())
        assert time.perf_counter() - t0 < 2.0
        assert down.outcome is Outcome.FAILURE_RETRYABLE, down
        assert down.error
    finally:
        await asyncio.to_thread(private_broker.start)
    deadline = time.monotonic() + 20
    while True:
        result = await adapter.deliver(dest, config, make_event())
        if result.outcome is Outcome.SUCCESS:
            break
        assert result.outcome is Outcome.FAILURE_RETRYABLE, result
        assert time.monotonic() < deadline, f"no recovery: {result}"
        await asyncio.sleep(0.2)
    assert adapter.connection_count == 1


# --- TLS ------------------------------------------------------------------------------------
@pytest.fixture
def trust(tls_broker: PrivateBroker, monkeypatch: pytest.MonkeyPatch) -> PrivateBroker:
    """Trust the run's CA the way an operator trusts a private CA: SSL_CERT_FILE."""
    monkeypatch.setenv("SSL_CERT_FILE", str(tls_broker.tls.ca))
    return tls_broker


@pytest.mark.parametrize("tls", ["true", "on"])
async def test_tls_publishes_over_amqps_with_verification(
    trust: PrivateBroker, adapter: RabbitMQAdapter, private_exchange: str, tls: str
) -> None:
    raw = {
        "server_url": f"{HOST}:{trust.tls_port}",
        "exchange": private_exchange,
        "tls": tls,
        **GUEST,
    }
    result, event, _ = await send(adapter, raw)
    assert result.outcome is Outcome.SUCCESS, result
    message = await read_message(trust.url, private_exchange, event.id)
    assert message.body == event.envelope()


async def test_tls_with_an_untrusted_certificate_is_refused(
    tls_broker: PrivateBroker,
    adapter: RabbitMQAdapter,
    private_exchange: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(tls_broker.tls.other_ca))
    raw = {
        "server_url": f"{HOST}:{tls_broker.tls_port}",
        "exchange": private_exchange,
        "tls": "true",
        **GUEST,
    }
    result, _, _ = await send(adapter, raw)
    assert result.outcome is Outcome.FAILURE_PERMANENT, result
    assert result.error is not None
    assert "certificate verification failed" in result.error


async def test_tls_false_speaks_plain_amqp(adapter: RabbitMQAdapter, exchange: str) -> None:
    raw = {"server_url": f"{HOST}:{PORT}", "exchange": exchange, "tls": "false", **GUEST}
    result, _, _ = await send(adapter, raw)
    assert result.outcome is Outcome.SUCCESS, result


# --- config validation ------------------------------------------------------------------------
@pytest.fixture
def registry() -> Registry:
    ctx = AdapterContext(settings=Settings(), egress=EgressPolicy())
    return Registry(ctx, classes=[RabbitMQAdapter])


BASE = {"exchange": "events", **GUEST}


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        ({"exchange": "events", **GUEST}, "amqp_broker.server_url is required"),
        ({"server_url": "mq:5672", **GUEST}, "amqp_broker.exchange is required"),
        ({**BASE, "server_url": ""}, "amqp_broker.server_url: must be host:port or amqp://"),
        ({**BASE, "server_url": " mq:5672"}, "without spaces"),
        ({**BASE, "server_url": "http://mq:5672"}, "must use the amqp:// or amqps:// scheme"),
        ({**BASE, "server_url": "mq:99999"}, "has an invalid port"),
        ({**BASE, "server_url": "mq:0"}, "has an invalid port"),
        ({**BASE, "server_url": "mq:port"}, "has an invalid port"),
        ({**BASE, "server_url": "amqp://mq:5672/?heartbeat=5"}, "must not carry a query"),
        ({**BASE, "server_url": "mq:5672/prod"}, "host:port form takes no path"),
        ({**BASE, "server_url": "amqp://:5672"}, "has no host"),
        (
            {"server_url": "mq:5672", "exchange": "e", "password": "p"},
            "amqp_broker.username: required unless server_url carries it",
        ),
        (
            {"server_url": "amqp://alice@mq:5672", "exchange": "e"},
            "amqp_broker.password: required unless server_url carries it",
        ),
        ({**BASE, "server_url": "mq", "username": ""}, "amqp_broker.username: must not be empty"),
        ({**BASE, "server_url": "mq", "exchange": ""}, "must name an existing exchange"),
        ({**BASE, "server_url": "mq", "exchange": "x" * 256}, "at most 255 bytes"),
        ({**BASE, "server_url": "mq", "tls": "yes"}, "amqp_broker.tls: must be one of false, on"),
        ({**BASE, "server_url": "mq", "tls": "off"}, "amqp_broker.tls: must be one of"),
        ({**BASE, "server_url": "amqps://mq", "tls": "false"}, "server_url uses amqps://"),
        ({**BASE, "server_url": "mq", "mandatory": "on"}, "amqp_broker.mandatory: must be one of"),
        (
            {**BASE, "server_url": "mq", "endpoint_url": "amqp://other:5672"},
            "amqp_broker.endpoint_url: is not used by rabbitmq destinations",
        ),
        ({**BASE, "server_url": "mq", "vhost": "prod"}, "amqp_broker.vhost is not a field"),
    ],
)
def test_invalid_configs(registry: Registry, raw: dict[str, str], error: str) -> None:
    with pytest.raises(ValidationError) as caught:
        registry.parse_config("amqp_broker", raw)
    assert error in caught.value.message
    assert "p@ss" not in caught.value.message


@pytest.mark.parametrize(
    ("raw", "stored_url", "key"),
    [
        (
            {**BASE, "server_url": "127.0.0.1:5672"},
            "127.0.0.1:5672",
            ("127.0.0.1", 5672, "/", False, "guest"),
        ),
        ({**BASE, "server_url": "mq"}, "mq", ("mq", 5672, "/", False, "guest")),
        ({**BASE, "server_url": "mq", "tls": "on"}, "mq", ("mq", 5671, "/", True, "guest")),
        ({**BASE, "server_url": "mq", "tls": "TRUE"}, "mq", ("mq", 5671, "/", True, "guest")),
        (
            {**BASE, "server_url": "mq:5672", "tls": "true"},
            "mq:5672",
            ("mq", 5672, "/", True, "guest"),
        ),
        ({**BASE, "server_url": "[::1]:5673"}, "[::1]:5673", ("::1", 5673, "/", False, "guest")),
        (
            {"exchange": "e", "server_url": "amqp://alice:s3cr%40t@mq:5673/prod"},
            "amqp://mq:5673/prod",
            ("mq", 5673, "prod", False, "alice"),
        ),
        (
            {"exchange": "e", "server_url": "amqps://bob:pw@mq/%2Fteam"},
            "amqps://mq/%2Fteam",
            ("mq", 5671, "/team", True, "bob"),
        ),
        (
            {"exchange": "e", "server_url": "carol:pw@mq:5672"},
            "mq:5672",
            ("mq", 5672, "/", False, "carol"),
        ),
        (
            {**BASE, "server_url": "amqp://alice:other@mq:5672/"},
            "amqp://mq:5672/",
            ("mq", 5672, "/", False, "guest"),
        ),
    ],
)
def test_valid_configs(
    registry: Registry, raw: dict[str, str], stored_url: str, key: tuple[Any, ...]
) -> None:
    config = registry.parse_config("amqp_broker", raw)
    assert isinstance(config, RabbitMQConfig)
    assert config.server_url == stored_url
    k = config.key()
    assert (k.host, k.port, k.vhost, k.tls, k.username) == key


def test_the_password_in_server_url_is_stored_only_as_a_credential(registry: Registry) -> None:
    raw = {"server_url": "amqp://alice:s3cr%40t-pw@mq:5672/prod", "exchange": "e"}
    config = registry.parse_config("amqp_broker", raw)
    plain, secrets_ = config.split()
    assert secrets_ == {"password": "s3cr@t-pw"}
    assert "s3cr" not in repr(plain)
    assert plain == {"server_url": "amqp://mq:5672/prod", "exchange": "e", "username": "alice"}
    dest = make_destination("rabbitmq", config)
    view = destination_view(dest, registry)
    assert view["rabbitmq"]["password"] == "********"
    assert "s3cr" not in repr(view)
    # The stored form parses back to the same config (what the catalog does on load).
    again = registry.parse_config("rabbitmq", {**plain, **secrets_})
    assert again == config


def test_target_follows_where_messages_go_not_who_sends_them(registry: Registry) -> None:
    def target(**over: str) -> tuple[Any, ...]:
        return registry.parse_config("rabbitmq", {**BASE, "server_url": "MQ", **over}).target()

    assert target() == target(server_url="mq:5672")
    assert target() == target(password="rotated", username="someone-else")
    assert target() == target(mandatory="true")
    assert target() != target(exchange="other")
    assert target() != target(server_url="mq:5673")
    assert target() != target(server_url="amqp://mq:5672/prod")
    assert target() != target(tls="true")


# --- egress: the connection goes to the address the check pinned (issue 18, item 1) ----------
REBIND_NAME = "broker.rebind.test"


async def test_the_connection_goes_to_the_address_the_egress_check_pinned(
    exchange: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check sees 127.0.0.1 (allowed); every later lookup of the name answers
    another loopback address, where a listener counts connections. aio-pika is
    handed the checked address, so it never resolves the name and never gets there."""
    dns = Rebinding(REBIND_NAME, HOST, later=loopback_address())
    dns.install(monkeypatch)
    decoy = await Listener(dns.later or "", PORT).start()
    a = RabbitMQAdapter(AdapterContext(settings=Settings(), egress=dns.policy()))
    try:
        raw = {"server_url": f"{REBIND_NAME}:{PORT}", "exchange": exchange, **GUEST}
        for _ in range(2):
            result, event, _ = await send(a, raw)
            assert result.outcome is Outcome.SUCCESS, result
            message = await read_message(broker.GUEST_URL, exchange, event.id)
            assert message.body == event.envelope()
    finally:
        await a.close()
        await decoy.stop()
    assert decoy.connections == 0
    assert dns.sdk_lookups == 0  # aio-pika never resolved the name
    assert dns.policy_lookups == 1  # the second attempt reused the pinned pass


async def test_a_refusing_pinned_address_falls_back_to_the_other_checked_ones(
    exchange: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name with two permitted addresses, the first refusing connections (as an
    unreachable IPv6 address of a dual-stack name would): the connection goes to
    the second, which the same check permitted, without resolving again."""
    refusing = loopback_address()
    dns = Rebinding(REBIND_NAME, HOST)
    dns.install(monkeypatch)
    networks = (ipaddress.ip_network(refusing), ipaddress.ip_network(HOST))

    async def both(host: str) -> list[str]:
        await dns.resolve(host)
        return [refusing, HOST]

    policy = EgressPolicy(allowed_networks=networks, resolver=both)
    a = RabbitMQAdapter(AdapterContext(settings=Settings(), egress=policy))
    try:
        raw = {"server_url": f"{REBIND_NAME}:{PORT}", "exchange": exchange, **GUEST}
        result, event, _ = await send(a, raw)
    finally:
        await a.close()
    assert result.outcome is Outcome.SUCCESS, result
    message = await read_message(broker.GUEST_URL, exchange, event.id)
    assert message.body == event.envelope()
    assert dns.sdk_lookups == 0


async def test_tls_to_a_pinned_address_still_verifies_the_broker_name(
    trust: PrivateBroker, private_exchange: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The certificate covers ``localhost`` and 127.0.0.1. Pinned to 127.0.0.1 the
    connection verifies the name it was given: ``localhost`` passes, a name the
    certificate does not cover is refused although the address it reached is in it."""
    for name, expected in (("localhost", Outcome.SUCCESS), (REBIND_NAME, None)):
        dns = Rebinding(name, HOST)  # the SDK itself could not resolve the name at all
        dns.install(monkeypatch)
        a = RabbitMQAdapter(AdapterContext(settings=Settings(), egress=dns.policy()))
        raw = {
            "server_url": f"amqps://{name}:{trust.tls_port}",
            "exchange": private_exchange,
            **GUEST,
        }
        try:
            result, event, _ = await send(a, raw)
        finally:
            await a.close()
        assert dns.sdk_lookups == 0
        if expected is Outcome.SUCCESS:
            assert result.outcome is Outcome.SUCCESS, result
            message = await read_message(trust.url, private_exchange, event.id)
            assert message.body == event.envelope()
        else:
            assert result.outcome is Outcome.FAILURE_PERMANENT, result
            assert result.error is not None
            assert "certificate verification failed" in result.error
            assert REBIND_NAME in result.error


# --- a hostile "broker": the attempt fails retryably within its deadline, the loop runs on -----
async def _hostile_peer(
    behaviour: str, reader: asyncio.StreamReader, w: asyncio.StreamWriter
) -> None:
    try:
        if behaviour == "closes at once":
            pass
        elif behaviour == "answers HTTP and closes":
            w.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
        elif behaviour == "answers an undecodable frame":
            w.write(b"\x01\x00\x00\x00\x00\x00\x04abcdX")
        elif behaviour == "streams an endless frame":
            w.write(b"\x01\x00\x00\xff\xff\xff\xff")
            for _ in range(2000):  # 128 MB if anybody buffered it
                w.write(b"\xff" * 65536)
                await w.drain()
        elif behaviour == "says nothing":
            await asyncio.sleep(30)
        await w.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        w.close()


def _attempt_in_own_loop(behaviour: str, deadline: float) -> tuple[Result, float, float]:
    """One attempt against the hostile peer, on an event loop of its own thread (a loop
    that stalls for good cannot time itself out); (result, seconds, longest loop gap)."""
    box: dict[str, tuple[Result, float, float]] = {}

    async def main() -> tuple[Result, float, float]:
        server = await asyncio.start_server(
            lambda r, w: _hostile_peer(behaviour, r, w), "127.0.0.1", 0
        )
        port = server.sockets[0].getsockname()[1]
        settings = Settings(delivery=DeliverySettings(adapter_timeout_seconds=deadline))
        a = RabbitMQAdapter(AdapterContext(settings=settings, egress=LOOPBACK_ALLOWED))
        gaps = [0.0]
        ticking = True

        async def ticker() -> None:
            last = time.monotonic()
            while ticking:
                await asyncio.sleep(0.01)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        tick = asyncio.create_task(ticker())
        started = time.monotonic()
        try:
            raw = {"server_url": f"127.0.0.1:{port}", "exchange": "x", **GUEST}
            result, _, _ = await send(a, raw)
            took = time.monotonic() - started
        finally:
            ticking = False
            await tick
            await a.close()
            server.close()
        return result, took, max(gaps)

    def run() -> None:
        box["value"] = asyncio.run(main())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(deadline + 10)
    assert not thread.is_alive(), f"{behaviour}: the attempt's event loop stalled"
    return box["value"]


@pytest.mark.parametrize(
    "behaviour",
    [
        "closes at once",
        "answers HTTP and closes",
        "answers an undecodable frame",
        "streams an endless frame",
        "says nothing",
    ],
)
def test_a_peer_that_is_no_broker_fails_the_attempt_retryably_within_its_deadline(
    behaviour: str,
) -> None:
    deadline = 1.5
    result, took, longest_gap = _attempt_in_own_loop(behaviour, deadline)
    assert result.outcome is Outcome.FAILURE_RETRYABLE, result
    assert took < deadline + 0.5, (took, result)
    assert longest_gap < 0.5, f"the event loop stalled for {longest_gap:.2f} s"
    if behaviour == "streams an endless frame":  # refused at its header, not buffered
        assert result.error is not None
        assert "announced a frame of over 8388608 bytes" in result.error, result.error
