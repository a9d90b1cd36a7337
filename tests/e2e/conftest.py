from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import Herald
from tests.support.databases import BACKENDS, create_postgres_database, drop_postgres_database
from tests.support.receiver import Receiver

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

HeraldFactory = Callable[..., Herald]


@pytest.fixture(autouse=True)
def _no_herald_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.upper().startswith("HERALD_"):
            monkeypatch.delenv(key)


@pytest.fixture(params=BACKENDS)
async def database_url(request: pytest.FixtureRequest) -> AsyncIterator[str | None]:
    """Every e2e test runs on SQLite (None: the default file) and on a fresh PostgreSQL
    database, unless it is marked ``sqlite_only`` (it tests something SQLite-specific)."""
    if request.param == "sqlite":
        yield None
        return
    if request.node.get_closest_marker("sqlite_only"):
        pytest.skip("tests SQLite-specific behaviour")
    url = await create_postgres_database()
    try:
        yield url
    finally:
        await drop_postgres_database(url)


@pytest.fixture
def herald_factory(tmp_path: Path, database_url: str | None) -> Iterator[HeraldFactory]:
    started: list[Herald] = []

    def make(overrides: dict[str, dict[str, Any]] | None = None, *, start: bool = True) -> Herald:
        h = Herald(tmp_path, overrides, database_url=database_url)
        if start:
            h.start()
        started.append(h)
        return h

    yield make
    for h in started:
        h.discard()


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    r = await Receiver(secrets=[SECRET]).start()
    yield r
    await r.stop()


# --- the /v2 API (tests/e2e/test_api.py, test_tenancy.py) ------------------------------

from tests.support.api import Api, open_api  # noqa: E402


@pytest.fixture
async def herald(herald_factory: HeraldFactory) -> Herald:
    """A daemon with the default config, started without blocking the test's event loop."""
    h = herald_factory(start=False)
    await h.astart()
    return h


@pytest.fixture
async def api(herald: Herald) -> AsyncIterator[Api]:
    """An API client for tenant ``acme`` of the ``herald`` daemon."""
    async with open_api(herald, "acme") as client:
        yield client


# --- the console's browser (tests/e2e/test_console*.py) ----------------------------------

from tests.support.browser import browser, context, operator_key, page  # noqa: E402, F401 - fixtures
