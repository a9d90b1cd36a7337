"""``herald run`` delivering 100 outbox events to Google Pub/Sub and Azure Service Bus.

Destinations are created with ``herald destinations create --data`` under the
spec's aliases, with ``endpoint_url``/connection strings pointing at local
protocol peers: the Pub/Sub emulator where installed (else the in-process gRPC
Publisher), and the AMQP 1.0 test
broker driven by the daemon's azure-servicebus SDK, read back with the SDK.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from google.pubsub_v1.types import PubsubMessage

from tests.e2e.conftest import HeraldFactory
from tests.e2e.test_delivery import rows, wait_active, wait_deliveries
from tests.integration.azure.broker import Broker
from tests.integration.azure.conftest import receive
from tests.integration.gcp.peers import (
    Emulator,
    EmulatorPeer,
    FakePublisher,
    Peer,
    ServiceAccount,
    find_emulator,
    shared_emulator,
    stop_shared_emulator,
    wait_for,
)
from tests.support.api import Api, error_of
from tests.support.daemon import Herald

pytestmark = [pytest.mark.e2e, pytest.mark.backend_neutral]

N = 100
PROJECT = "herald-e2e"
EMULATOR = find_emulator()


@pytest.fixture(scope="session")
def pubsub_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    if EMULATOR is None:
        pytest.skip("the Pub/Sub emulator is not installed here")
    try:
        yield shared_emulator(EMULATOR, tmp_path_factory.mktemp("pubsub-emulator"))
    finally:
        stop_shared_emulator()


@pytest.fixture
async def pubsub_peer(request: pytest.FixtureRequest) -> AsyncIterator[Peer]:
    """The emulator where installed, else the in-process server (the integration tests
    run both everywhere the emulator exists)."""
    if EMULATOR is not None:
        peer = EmulatorPeer(request.getfixturevalue("pubsub_emulator"))
        try:
            yield peer
        finally:
            await peer.close()
    else:
        fake = await FakePublisher().start()
        try:
            yield fake
        finally:
            await fake.stop()


async def start(herald_factory: HeraldFactory) -> Herald:
    # Started off the event loop: the in-process peers must keep answering meanwhile.
    h = herald_factory(start=False)
    return await h.astart()


def secret_not_logged(h: Herald, secret: str) -> None:
    assert secret not in h.log(), "a credential reached the daemon's log"


async def test_hundred_events_to_pubsub(herald_factory: HeraldFactory, pubsub_peer: Peer) -> None:
    topic = f"herald-events-{uuid.uuid4().hex[:8]}"  # the emulator outlives the test
    await pubsub_peer.create_topic(PROJECT, topic)
    h = await start(herald_factory)
    key = ServiceAccount.generate()
    body = {
        "name": "pubsub",
        "type": "cloudB_pubsub",
        "cloudB_pubsub": {
            "project_id": PROJECT,
            "topic": topic,
            "endpoint_url": pubsub_peer.endpoint,
            # Validated at create time and stored encrypted; a plain-text emulator
            # endpoint is spoken to anonymously, so it is not used on the wire.
            "service_account_json": key.json,
        },
        "events": ["task_run.*"],
    }
    dest = await h.acli_json("destinations", "create", "--data", json.dumps(body))
    assert dest["type"] == "gcp_pubsub"
    assert dest["gcp_pubsub"]["service_account_json"] == "********"
    assert dest["gcp_pubsub"]["topic"] == topic
    await wait_active(h, dest["id"])

    h.insert_events(rows(N, prefix="evt_ps"))
    await wait_deliveries(h, "status = 'success' AND kind = 'event'", N)

    async def everything() -> list[PubsubMessage] | None:
        got = await pubsub_peer.messages(PROJECT, topic)
        return got if len(got) >= N + 1 else None

    messages: list[PubsubMessage] = await wait_for(
        everything, timeout=20, what=f"{N} messages on {pubsub_peer.name}"
    )
    by_id = {m.attributes["event-id"]: m for m in messages}
    assert len(messages) == N + 1  # the verification ping, then each event once
    assert h.query("SELECT COUNT(*) FROM herald_attempts WHERE outcome != 'success'") == [(0,)]
    events = {i: m for i, m in by_id.items() if i.startswith("evt_ps")}
    assert len(events) == N
    for i in range(N):
        message = events[f"evt_ps{i:05d}"]
        envelope = json.loads(message.data)
        assert envelope["data"] == {"task_run_id": f"trun_{i}", "n": i}
        assert envelope["type"] == "task_run.completed"
        assert dict(message.attributes) == {
            "event-id": f"evt_ps{i:05d}",
            "event-type": "task_run.completed",
            "event-created-at": envelope["created_at"],
            "tenant-id": "default",
        }
    assert await h.astop() == 0
    secret_not_logged(h, key.info["private_key"].splitlines()[1])


@pytest.fixture
def broker() -> Iterator[Broker]:
    b = Broker(entities=["herald-events"]).start()
    try:
        yield b
    finally:
        b.stop()


async def test_hundred_events_to_service_bus(herald_factory: HeraldFactory, broker: Broker) -> None:
    h = await start(herald_factory)
    conn = broker.connection_string()
    body = {
        "name": "service bus",
        "type": "cloudC_servicebus",
        "cloudC_servicebus": {"name": "herald-events", "connection_string": conn},
        "events": ["*"],
    }
    dest = await h.acli_json("destinations", "create", "--data", json.dumps(body))
    assert dest["type"] == "azure_servicebus"
    assert dest["azure_servicebus"] == {"name": "herald-events", "connection_string": "********"}
    await wait_active(h, dest["id"])

    h.insert_events(rows(N, prefix="evt_sb"))
    await wait_deliveries(h, "status = 'success' AND kind = 'event'", N)
    received = await receive(conn, "herald-events", N + 1, timeout=30)
    assert received[0].subject == "destination.verification"
    events = {m.message_id: m for m in received[1:]}
    assert len(events) == N
    # Every attempt succeeded first time: nothing was sent twice.
    assert h.query("SELECT COUNT(*) FROM herald_attempts WHERE outcome != 'success'") == [(0,)]
    for i in range(N):
        message = events[f"evt_sb{i:05d}"]
        envelope = json.loads(message.body)
        assert envelope["id"] == f"evt_sb{i:05d}"
        assert envelope["data"] == {"task_run_id": f"trun_{i}", "n": i}
        assert message.subject == "task_run.completed"
        assert message.content_type == "application/json"
        assert message.application_properties == {
            "event-id": f"evt_sb{i:05d}",
            "event-type": "task_run.completed",
            "event-created-at": envelope["created_at"],
            "tenant-id": "default",
        }
    assert broker.stored("herald-events") == []
    assert await h.astop() == 0
    secret_not_logged(h, broker.keys["herald"])


async def test_malformed_credentials_are_422_over_the_api_without_echoing_them(
    api: Api,
) -> None:
    """A Pub/Sub key that is not a service-account key, and a Service Bus connection
    string without ``Endpoint``: refused at create time, naming the field, never
    repeating the secret."""
    refresh_token = "1//leak-" + uuid.uuid4().hex  # a user's ADC file, not a key
    user_adc = {"type": "authorized_user", "client_id": "c", "refresh_token": refresh_token}
    not_a_key = json.dumps(user_adc)
    shared_key = "bGVhay1" + uuid.uuid4().hex
    cases = [
        (
            "cloudB_pubsub",
            {"project_id": PROJECT, "topic": "events", "service_account_json": not_a_key},
            "cloudB_pubsub.service_account_json",
            "must be a service account key",
            refresh_token,
        ),
        (
            "azure_servicebus",
            {
                "name": "herald-events",
                "connection_string": f"SharedAccessKeyName=herald;SharedAccessKey={shared_key}",
            },
            "azure_servicebus.connection_string",
            "must contain Endpoint=sb://",
            shared_key,
        ),
    ]
    for type_, config, field, message, secret in cases:
        body = {"name": type_, "type": type_, type_: config, "events": ["*"]}
        status, _, reply = await api.post("/v2/event-destinations", json=body)
        assert status == 422, reply
        error = error_of(reply)
        assert (error["code"], error["field"]) == ("invalid_value", field), reply
        assert message in error["message"], reply
        assert secret not in json.dumps(reply)
    assert (await api.get("/v2/event-destinations"))[2]["data"] == []
