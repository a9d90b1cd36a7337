"""Fixtures for the rabbitmq and hookdeck adapters: the real broker and a gateway stand-in.

RabbitMQ is the broker running on 127.0.0.1:5672 (started by
``scripts/test-services.sh`` when it is down); each test gets its own topic
exchange and bound queue, deleted afterwards. The TLS and outage tests use the
run's private node (``private_broker``), which they may stop. The gateway is
a :class:`~tests.support.receiver.Receiver` made for the gateway, on an ephemeral port.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator, Iterator

import pytest

from tests.integration.amqp import broker
from tests.integration.amqp.broker import BrokerUser, Inspector, PrivateBroker
from tests.support.receiver import Receiver
from tests.support.required import unavailable


@pytest.fixture(scope="session")
def rabbitmq() -> None:
    """The broker is up (started if it was not)."""
    broker.ensure_running()


@pytest.fixture
async def inspector(rabbitmq: None) -> AsyncIterator[Inspector]:
    ins = await Inspector.open()
    yield ins
    await ins.close()


@pytest.fixture
async def exchange(inspector: Inspector) -> AsyncIterator[str]:
    """A fresh topic exchange with one queue bound to ``#``; deleted afterwards."""
    name = f"herald.test.{secrets.token_hex(4)}"
    await inspector.topic(name)
    yield name
    await inspector.delete(name)


@pytest.fixture(scope="session")
def managed_broker(rabbitmq: None) -> None:
    """Skip unless this process may run rabbitmqctl (users, vhosts, listeners, restarts)."""
    reason = broker.can_manage()
    if reason is not None:
        unavailable(f"cannot manage the local RabbitMQ: {reason}")


@pytest.fixture(scope="session")
def broker_user(managed_broker: None) -> Iterator[BrokerUser]:
    """A non-guest user on its own vhost (with a slash in its name), whose password needs
    percent-encoding in a URL, and who may only write to exchanges named ``herald.test.*``."""
    run = secrets.token_hex(3)  # test runs sharing the broker must not share a user
    password = "p@ss:w/rd%Ω-" + secrets.token_hex(4)
    with broker.broker_user(
        f"herald-it-{run}", password, f"herald/it-{run}", write=r"^herald\.test\."
    ) as user:
        yield user


@pytest.fixture
def tls_broker(private_broker: PrivateBroker) -> PrivateBroker:
    """The private node, whose TLS listener's certificate a CA made by this run signed."""
    return private_broker


@pytest.fixture
async def private_exchange(private_broker: PrivateBroker) -> AsyncIterator[str]:
    """A fresh durable topic exchange on the private node (durable: it outlives a restart)."""
    name = f"herald.test.durable.{secrets.token_hex(4)}"
    ins = await Inspector.open(private_broker.url)
    try:
        await ins.topic(name, durable=True)
    finally:
        await ins.close()
    yield name
    with contextlib.suppress(Exception):  # the node may be down if the test failed
        ins = await Inspector.open(private_broker.url)
        try:
            await ins.delete(name)
        finally:
            await ins.close()


@pytest.fixture
async def gateway() -> AsyncIterator[Receiver]:
    gw = await Receiver.for_gateway().start()
    yield gw
    await gw.stop()
