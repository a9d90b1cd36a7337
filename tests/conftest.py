"""Suite-wide test configuration."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

# The RabbitMQ tests run on one xdist worker, one after another: they share one
# private broker node (below) and the machine's broker's users and vhosts.
_RABBITMQ_PATHS = (
    "tests/integration/amqp/",
    "tests/e2e/test_amqp_hookdeck.py",
    "tests/e2e/test_security.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = item.nodeid.replace("\\", "/")
        if path.startswith(_RABBITMQ_PATHS):
            item.add_marker(pytest.mark.xdist_group("rabbitmq"))


@pytest.fixture(scope="session")
def private_broker() -> Iterator[object]:
    """A RabbitMQ node of this run's own (plain and TLS listeners), for tests that stop it.

    Typed ``object`` here so that this file does not import aio-pika for every test;
    the tests that use it annotate it as ``tests.integration.amqp.broker.PrivateBroker``.
    """
    from tests.integration.amqp import broker
    from tests.support.required import unavailable

    if (reason := broker.can_manage()) is not None:
        unavailable(f"cannot start a private RabbitMQ node: {reason}")
    node = broker.PrivateBroker()
    try:
        node.start()
        yield node
    finally:
        node.close()
