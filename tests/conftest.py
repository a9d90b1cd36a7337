"""Suite-wide test configuration."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import settings

from tests.support.examples import FAST

# Property tests without their own count try 100 examples, 25 in the fast lane; none
# has a deadline (see tests/support/examples.py).
settings.register_profile("herald", deadline=None, max_examples=25 if FAST else 100)
settings.load_profile("herald")

# The RabbitMQ tests run on one xdist worker, one after another: they share one
# private broker node (below) and the machine's broker's users and vhosts.
_RABBITMQ_PATHS = (
    "tests/integration/amqp/",
    "tests/e2e/test_amqp_hookdeck.py",
    "tests/e2e/test_security.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks what a lane selects by: where a test lives and which database it runs on.

    ``e2e`` is every test under ``tests/e2e/``; ``postgres`` is every test that runs
    on PostgreSQL (a ``postgres`` parameter of any fixture or argument), so that
    ``make test-fast`` can take the integration tests on SQLite alone. The PostgreSQL
    run of a ``backend_neutral`` test is deselected (see :func:`_neutral`).
    """
    deselected: list[pytest.Item] = []
    for item in items:
        path = item.nodeid.replace("\\", "/")
        if path.startswith(_RABBITMQ_PATHS):
            item.add_marker(pytest.mark.xdist_group("rabbitmq"))
        if path.startswith("tests/e2e/"):
            item.add_marker(pytest.mark.e2e)
        callspec = getattr(item, "callspec", None)
        if callspec is not None and "postgres" in callspec.params.values():
            if _neutral(item):
                deselected.append(item)
                continue
            item.add_marker(pytest.mark.postgres)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if item not in deselected]


def _neutral(item: pytest.Item) -> bool:
    """A ``backend_neutral`` test tests what lies above the store (HTTP, the CLI, the
    adapters, the daemon's loops): its PostgreSQL run would prove nothing the SQLite run
    does not, the store's SQL being run on both databases by tests/integration. A
    ``database_specific`` test in such a module runs on both all the same."""
    return (
        item.get_closest_marker("backend_neutral") is not None
        and item.get_closest_marker("database_specific") is None
    )


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
