"""A skip that ``make test`` turns into a failure.

Some tests need a tool or a privilege that ``make test`` promises to provide
(promtool, a RabbitMQ node the tests may stop). Run by hand on a machine
without them, those tests skip; under ``make test`` (which exports
``HERALD_REQUIRE_SERVICES=1``) a missing one fails the run instead, so a green CI
never hides a protection that was not checked.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

ENV = "HERALD_REQUIRE_SERVICES"


def unavailable(reason: str) -> NoReturn:
    """Skip with ``reason``, or fail when the run requires every service."""
    if os.environ.get(ENV, "") not in ("", "0"):
        pytest.fail(f"{reason} ({ENV} is set: make test provides this)", pytrace=False)
    pytest.skip(reason)
