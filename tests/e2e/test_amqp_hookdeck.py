"""``herald run`` delivering through the outbox to rabbitmq and hookdeck destinations.

RabbitMQ: the real broker on 127.0.0.1:5672 (AMQP 0-9-1); what arrived is read
from a queue bound to the test's exchange. Hookdeck: the gateway stand-in
``Receiver.for_gateway()`` (``tests/support/receiver.py``, aiohttp on 127.0.0.1),
which verifies each request's signature and headers. Destinations are created with the
spec's aliases (``amqp_broker``, ``gateway``) through the CLI and the API.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from aio_pika.abc import AbstractIncomingMessage

from tests.e2e.conftest import HeraldFactory
from tests.integration.amqp import broker
from tests.integration.amqp.broker import BrokerUser, Inspector, PrivateBroker
from tests.support.daemon import Herald
from tests.support.receiver import Receiver

pytestmark = [pytest.mark.e2e, pytest.mark.backend_neutral]

N = 100


def rows(n: int, prefix: str, type_: str = "task_run.completed") -> list[tuple[str, str, str, str]]:
    return [
        (f"{prefix}{i:05d}", "default", type_, json.dumps({"task_run_id": f"trun_{i}", "n": i}))
        for i in range(n)
    ]


async def wait_active(h: Herald, dest_id: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = h.query("SELECT status FROM herald_destinations WHERE id = ?", (dest_id,))[0][0]
        if status == "active":
            return
        await asyncio.sleep(0.05)
    attempts = h.query("SELECT outcome, error FROM herald_attempts ORDER BY started_at")
    raise AssertionError(f"{dest_id} did not become active: {attempts[-3:]}\n{h.log()[-2000:]}")


async def wait_successes(h: Herald, count: int, timeout: float = 60) -> None:
    sql = "SELECT COUNT(*) FROM herald_deliveries WHERE status = 'success' AND kind = 'event'"
    deadline = time.monotonic() + timeout
    while (n := h.query(sql)[0][0]) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"{n} of {count} deliveries succeeded\n{h.log()[-3000:]}")
        await asyncio.sleep(0.05)


async def create(h: Herald, body: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = await h.acli_json("destinations", "create", "--data", json.dumps(body))
    return result


def unique(messages: list[AbstractIncomingMessage]) -> set[str]:
    return {m.message_id for m in messages if m.message_id}


# --- fixtures ----------------------------------------------------------------------------------
@pytest.fixture
def sqlite_herald(tmp_path: Path) -> Iterator[HeraldFactory]:
    """For tests where the database plays no part (a broker outage, input validation):
    one run on the default SQLite backend instead of one per backend."""
    made: list[Herald] = []

    def make(overrides: dict[str, dict[str, Any]] | None = None) -> Herald:
        h = Herald(tmp_path, overrides)
        made.append(h)
        return h

    yield make
    for h in made:
        if h.proc is not None and h.proc.poll() is None:
            h.kill()


@pytest.fixture(scope="module")
def mq_user() -> Iterator[BrokerUser]:
    """A dedicated broker user with a distinctive password (so a leak would be visible)."""
    broker.ensure_running()
    if broker.can_manage() is not None:
        yield BrokerUser("guest", "guest", "/", ".*")
        return
    run = secrets.token_hex(3)  # test runs sharing the broker must not share a user
    password = "e2e:P@ss/" + secrets.token_hex(6)
    with broker.broker_user(
        f"herald-e2e-{run}", password, f"herald-e2e-{run}", write=r"^herald\.e2e\."
    ) as user:
        yield user


@pytest.fixture
async def mq_exchange(mq_user: BrokerUser) -> AsyncIterator[tuple[Inspector, str]]:
    """A topic exchange whose queue takes ``task_run.*`` only (verification is unroutable)."""
    ins = await Inspector.open(mq_user.guest_url)
    name = f"herald.e2e.{secrets.token_hex(4)}"
    await ins.topic(name, binding="task_run.*")
    yield ins, name
    await ins.delete(name)
    await ins.close()


# --- rabbitmq -----------------------------------------------------------------------------------
async def test_hundred_events_reach_rabbitmq_with_routing_key_headers_and_id(
    herald_factory: HeraldFactory, mq_user: BrokerUser, mq_exchange: tuple[Inspector, str]
) -> None:
    ins, exchange = mq_exchange
    h = herald_factory(start=False)
    await h.astart()
    dest = await create(
        h,
        {
            "name": "broker",
            "type": "amqp_broker",
            "amqp_broker": {"server_url": mq_user.url, "exchange": exchange, "mandatory": "true"},
            "events": ["task_run.*"],
        },
    )
    assert dest["type"] == "rabbitmq"
    shown = dest["rabbitmq"]
    assert shown["password"] == "********"
    assert shown["username"] == mq_user.name
    assert mq_user.password not in json.dumps(dest)
    # mandatory, and nothing is bound for destination.verification: it verifies anyway.
    await wait_active(h, dest["id"])

    h.insert_events(rows(N, "evt_mq"))
    got = await ins.collect(
        broker.queue_for(exchange), until=lambda ms: len(unique(ms)) >= N, timeout=60
    )
    await wait_successes(h, N)
    assert unique(got) == {f"evt_mq{i:05d}" for i in range(N)}
    for m in got:
        envelope = json.loads(m.body)
        assert envelope["id"] == m.message_id
        assert envelope["type"] == "task_run.completed"
        assert envelope["data"]["task_run_id"] == f"trun_{int(envelope['id'][6:])}"
        assert m.routing_key == "task_run.completed"
        assert m.content_type == "application/json"
        assert m.delivery_mode == 2
        assert dict(m.headers) == {
            "event-id": m.message_id,
            "event-type": "task_run.completed",
            "event-created-at": envelope["created_at"],
            "tenant-id": "default",
        }
    shown_again = await h.acli_json("destinations", "show", dest["id"])
    assert mq_user.password not in json.dumps(shown_again)
    assert await h.astop() == 0
    if mq_user.name != "guest":  # "guest" also names the user, so it proves nothing
        # Never logged, never stored in clear (the password is encrypted at rest).
        assert mq_user.password not in h.log()
        assert mq_user.password not in repr(h.query("SELECT * FROM herald_destinations"))
        for file in h.workdir.glob("herald.db*"):  # SQLite: the file and its WAL
            assert mq_user.password.encode() not in file.read_bytes()


async def test_broker_restart_mid_run_delivers_everything_without_restarting_herald(
    sqlite_herald: HeraldFactory, private_broker: PrivateBroker
) -> None:
    exchange = f"herald.e2e.durable.{secrets.token_hex(4)}"
    ins = await Inspector.open(private_broker.url)
    try:
        await ins.topic(exchange, durable=True)  # survives the restart, as its messages do
    finally:
        await ins.close()
    h = sqlite_herald({"delivery": {"backoff_base_seconds": 0.05, "max_retries": 10}})
    await h.astart()
    assert h.proc is not None
    pid = h.proc.pid
    dest = await create(
        h,
        {
            "name": "broker",
            "type": "rabbitmq",
            "rabbitmq": {
                "server_url": f"{broker.HOST}:{private_broker.port}",
                "exchange": exchange,
                "username": "guest",
                "password": "guest",
            },
            "events": ["*"],
        },
    )
    await wait_active(h, dest["id"])

    produced = 0
    outage_over = asyncio.Event()

    async def produce() -> None:
        nonlocal produced
        # Keep events flowing before, during and just after the outage.
        while not outage_over.is_set():
            h.insert_events(rows(10, f"evt_b{produced // 10:04d}_"))
            produced += 10
            await asyncio.sleep(0.1)
        for _ in range(5):
            h.insert_events(rows(10, f"evt_b{produced // 10:04d}_"))
            produced += 10
            await asyncio.sleep(0.1)

    producer = asyncio.create_task(produce())
    try:
        await wait_successes(h, 30)
        outage = await private_broker.bounce(down_seconds=1.0)
    finally:
        outage_over.set()
        await producer
    await wait_successes(h, produced, timeout=90)

    def events(messages: list[AbstractIncomingMessage]) -> set[str]:
        return {i for i in unique(messages) if i.startswith("evt_b")}  # not verification

    ins = await Inspector.open(private_broker.url)  # opened after the restart
    try:
        got = await ins.collect(
            broker.queue_for(exchange), until=lambda ms: len(events(ms)) >= produced, timeout=30
        )
        await ins.delete(exchange)
    finally:
        await ins.close()
    assert len(events(got)) == produced
    assert h.proc.poll() is None
    assert h.proc.pid == pid  # the same process carried the events over the outage
    failed = h.query(
        "SELECT COUNT(*) FROM herald_attempts WHERE outcome IN ('failure_retryable', 'timeout')"
    )[0][0]
    assert failed > 0, f"the {outage:.1f} s outage was never observed"
    stuck = h.query("SELECT COUNT(*) FROM herald_deliveries WHERE status != 'success'")
    assert stuck == [(0,)]
    assert await h.astop() == 0


# --- hookdeck -------------------------------------------------------------------------------------
async def test_hundred_events_reach_the_gateway_signed(herald_factory: HeraldFactory) -> None:
    gateway = await Receiver.for_gateway().start()
    try:
        token = gateway.add_source("src_e2e", secret="e2e-" + secrets.token_hex(8))
        h = herald_factory(start=False)
        await h.astart()
        dest = await create(
            h,
            {
                "name": "gateway",
                "type": "gateway",
                "gateway": {"token": token, "endpoint_url": gateway.base_url},
                "events": ["*"],
            },
        )
        assert dest["type"] == "hookdeck"
        assert dest["hookdeck"] == {"token": "********", "endpoint_url": gateway.base_url}
        await wait_active(h, dest["id"])
        assert [r.type for r in gateway.received] == ["destination.verification"]

        h.insert_events(rows(N, "evt_gw"))
        await gateway.wait_for(
            lambda: len({r.event_id for r in gateway.events("task_run.completed")}) >= N,
            timeout=60,
            what="100 events at the gateway",
        )
        await wait_successes(h, N)
        assert gateway.rejected == []
        ids = [r.event_id for r in gateway.events("task_run.completed")]
        assert sorted(ids) == [f"evt_gw{i:05d}" for i in range(N)]
        assert all(r.source_id == "src_e2e" for r in gateway.received)
        assert await h.astop() == 0
        assert token not in h.log()
    finally:
        await gateway.stop()


def _post(h: Herald, key: str, body: dict[str, Any]) -> tuple[int, Any]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{h.port}/v2/event-destinations",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


async def test_malformed_config_is_422_over_the_api_without_echoing_secrets(
    sqlite_herald: HeraldFactory,
) -> None:
    h = sqlite_herald()
    await h.astart()
    key = (await h.acli("keys", "create", "--tenant", "default")).stdout.strip()
    bad_token = "bm90LWEtdG9rZW4"  # base64 of "not-a-token": no id:secret
    status, body = await asyncio.to_thread(
        _post,
        h,
        key,
        {"name": "gw", "type": "gateway", "gateway": {"token": bad_token}, "events": ["*"]},
    )
    assert status == 422, body
    [error] = body["errors"]
    assert error["field"] == "gateway.token"
    assert "id:secret" in error["message"]
    assert bad_token not in json.dumps(body)

    password = "Leak-" + secrets.token_hex(6)
    status, body = await asyncio.to_thread(
        _post,
        h,
        key,
        {
            "name": "mq",
            "type": "amqp_broker",
            "amqp_broker": {"server_url": f"amqp://u:{password}@mq:70000", "exchange": "e"},
            "events": ["*"],
        },
    )
    assert status == 422, body
    # Every bad field is reported (pydantic may name the URL more than once); none
    # of them echoes the password.
    errors = {e["field"]: e for e in body["errors"]}
    assert "invalid port" in errors["amqp_broker.server_url"]["message"], body
    assert password not in json.dumps(body)
    assert await h.astop() == 0
    assert password not in h.log()


async def test_a_server_url_that_is_no_broker_leaves_the_daemon_responsive(
    sqlite_herald: HeraldFactory,
) -> None:
    """A "broker" that accepts TCP and closes at once: every attempt fails retryably
    within its deadline, and the daemon keeps answering meanwhile (it used to spin on
    the error's self-referencing cause chain, for good, on its event loop)."""
    accepted = 0

    async def close_at_once(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        accepted += 1
        writer.close()

    server = await asyncio.start_server(close_at_once, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    h = sqlite_herald(
        {
            # The guard on, the peer's network allowed: the attempt is pinned as in production.
            "security": {"allow_private_networks": False, "allowed_networks": ["127.0.0.1/32"]},
            "delivery": {"adapter_timeout_seconds": 2, "max_retries": 30},
        }
    )
    try:
        await h.astart()
        await create(
            h,
            {
                "name": "not-a-broker",
                "type": "rabbitmq",
                "rabbitmq": {
                    "server_url": f"127.0.0.1:{port}",
                    "exchange": "x",
                    "username": "guest",
                    "password": "guest-password",
                },
                "events": ["*"],
            },
        )
        sql = "SELECT outcome, error, duration_ms FROM herald_attempts ORDER BY started_at"
        deadline = time.monotonic() + 30
        while len(attempts := h.query(sql)) < 3:
            assert time.monotonic() < deadline, f"{attempts}\n{h.log()[-2000:]}"
            started = time.monotonic()
            status, _ = await asyncio.to_thread(h.get, "/healthz")
            assert status == 200
            assert time.monotonic() - started < 1.0, "the daemon answered slowly"
            await asyncio.sleep(0.05)
        assert accepted >= 3
        for outcome, error, duration_ms in attempts:
            assert outcome == "failure_retryable", (outcome, error)
            assert "cannot connect to amqp://127.0.0.1" in error, error
            assert duration_ms < 2000, duration_ms
    finally:
        server.close()
        await h.astop()
