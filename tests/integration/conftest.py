"""In-process integration fixtures: a real database, real components, real receivers.

Nothing here is mocked: every test that uses the harness runs twice, once on
:class:`~herald.store.sqlite.SQLiteStore` over a file in ``tmp_path`` and once on
:class:`~herald.store.postgres.PostgresStore` over a fresh PostgreSQL database
(dropped afterwards), unless it is marked ``sqlite_only``. The components are
wired the way ``herald.wiring`` wires them, and webhook receivers are aiohttp
servers on 127.0.0.1 that verify signatures with the independent
``standardwebhooks`` library.
"""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, closing, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from herald.adapters.base import AdapterContext
from herald.adapters.registry import Registry
from herald.catalog import Catalog
from herald.config import Settings
from herald.crypto import SecretBox, generate_key, parse_key
from herald.dispatch import Dispatcher, Limits
from herald.egress import EgressPolicy
from herald.ids import new_id
from herald.match import validate_event_type
from herald.model import Delivery, DeliveryFilter, Destination, DestinationStatus
from herald.outbox import Relay, publish
from herald.retry import RetryPolicy
from herald.service import Operations
from herald.store import Store, make_store
from herald.store import postgres as postgres_store
from herald.store import sqlite as sqlite_store
from herald.timeutil import format_epoch
from herald.wiring import delivery_limits
from tests.support.databases import BACKENDS
from tests.support.pg_template import MigratedDatabases
from tests.support.receiver import Behaviour, Received, Receiver
from tests.support.sql import Backend, Db, backend_of

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
OTHER_SECRET = "whsec_" + base64.b64encode(b"another-secret-of-32-bytes-long!").decode()

# Fast defaults for tests; each test overrides what it exercises.
FAST_DELIVERY: dict[str, Any] = {
    "backoff_base_seconds": 60.0,
    "max_retries": 3,
    "webhook_timeout_seconds": 2.0,
    "idle_poll_seconds": 0.05,
    "shutdown_grace_seconds": 5.0,
}


@pytest.fixture(autouse=True)
def _no_herald_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.upper().startswith("HERALD_"):
            monkeypatch.delenv(key)


@pytest.fixture(scope="session")
def pg_databases() -> Iterator[MigratedDatabases]:
    """Fresh migrated PostgreSQL databases for this session (cloned from one template)."""
    databases = MigratedDatabases()
    yield databases
    databases.close()


@pytest.fixture(params=BACKENDS)
async def database_url(
    request: pytest.FixtureRequest, tmp_path: Path, pg_databases: MigratedDatabases
) -> AsyncIterator[str]:
    """A SQLite file in ``tmp_path``, then a fresh PostgreSQL database (dropped afterwards);
    tests marked ``sqlite_only`` (they test something SQLite-specific) skip the latter."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'h.db'}"
        return
    if request.node.get_closest_marker("sqlite_only"):
        pytest.skip("tests SQLite-specific behaviour")
    url = await pg_databases.take()
    try:
        yield url
    finally:
        pg_databases.give_back(url)


def make_settings(
    database_url: str,
    *,
    delivery: Mapping[str, Any] | None = None,
    relay: Mapping[str, Any] | None = None,
    security: Mapping[str, Any] | None = None,
    signals: Mapping[str, Any] | None = None,
) -> Settings:
    data: dict[str, Any] = {
        "database": {"url": database_url, "busy_timeout_seconds": 5.0, "pool_size": 4},
        "security": {
            "allow_private_networks": True,
            "encryption_key": generate_key(),
            # The default lists no tenant; "default" is listed here on purpose.
            "ambient_credentials_tenants": ["default"],
            **(security or {}),
        },
        "delivery": {**FAST_DELIVERY, **(delivery or {})},
        "relay": {"poll_interval_seconds": 0.01, **(relay or {})},
        "signals": dict(signals or {}),
    }
    return Settings(**data)


def closed_port() -> int:
    """A port on 127.0.0.1 where nothing listens (connection refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def eventually(
    check: Callable[[], Awaitable[bool]],
    *,
    timeout: float = 10.0,
    interval: float = 0.02,
    what: str = "condition",
) -> None:
    """Poll ``check`` until it is true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(interval)


def insert_outbox_row(
    db: Db,
    type_: str,
    data: Mapping[str, Any],
    *,
    tenant_id: str = "default",
    id: str | None = None,
    created_at: str | None = None,
    traceparent: str | None = None,
) -> str:
    """One outbox row through plain SQL, the producer's contract on either backend."""
    validate_event_type(type_)
    event_id = id or new_id("evt_")
    db.execute(
        "INSERT INTO herald_outbox (id, tenant_id, type, data, created_at, traceparent)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (
            event_id,
            tenant_id,
            type_,
            orjson.dumps(dict(data)).decode(),
            created_at or format_epoch(time.time()),
            traceparent,
        ),
    )
    return event_id


@dataclass
class Harness:
    """The components of one Herald process over one database, built like ``herald.wiring``."""

    settings: Settings
    box: SecretBox
    store: Store
    registry: Registry
    catalog: Catalog
    policy: RetryPolicy
    service: Operations
    relay: Relay
    dispatchers: list[Dispatcher] = field(default_factory=list)
    _db: Db | None = field(default=None, repr=False)

    @property
    def database_url(self) -> str:
        return self.settings.database.url

    @property
    def backend(self) -> Backend:
        return backend_of(self.database_url)

    @property
    def db_path(self) -> Path:
        """The SQLite file (SQLite only)."""
        path = self.settings.database.sqlite_path
        assert path is not None, "db_path is SQLite-only"
        return path

    def migrations(self) -> list[tuple[int, str, str]]:
        """The migration scripts this backend ships."""
        if self.backend == "sqlite":
            return sqlite_store.migrations()
        return postgres_store.migrations()

    def new_store(self, *, box: SecretBox | None = None) -> Store:
        """Another (unopened) store on the same database, as a second process would open it."""
        return make_store(self.settings, box or self.box)

    # --- raw access, as a producer or an operator would have it ---------------
    @property
    def db(self) -> Db:
        """A plain connection to the same database (autocommit, ``?`` placeholders)."""
        if self._db is None:
            self._db = Db(self.database_url, timeout=5.0)
        return self._db

    def close_db(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    @contextmanager
    def sql(self) -> Iterator[Db]:
        """:attr:`db` inside one transaction: committed on exit, rolled back on an error."""
        with self.db.transaction() as db:
            yield db

    @contextmanager
    def sqlite(self) -> Iterator[sqlite3.Connection]:
        """A plain sqlite3 connection to the same file (autocommit off; commits on exit)."""
        with closing(sqlite3.connect(self.db_path, timeout=5.0)) as conn, conn:
            yield conn

    def scalar(self, query: str, params: Sequence[Any] = ()) -> Any:
        return self.db.scalar(query, params)

    def rows(self, query: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self.db.execute(query, params)

    def produce(
        self, type_: str, data: Mapping[str, Any], *, db: Db | None = None, **kw: Any
    ) -> str:
        """Write one outbox row the producer's way: ``herald.outbox.publish`` on SQLite,
        the plain ``INSERT`` of the producer's contract on PostgreSQL."""
        db = db or self.db
        if db.backend == "sqlite":
            return publish(db.sqlite, type_, dict(data), **kw)
        return insert_outbox_row(db, type_, data, **kw)

    def produce_many(self, type_: str, items: Sequence[Mapping[str, Any]]) -> list[str]:
        """Several outbox rows in one producer transaction."""
        with self.sql() as db:
            return [self.produce(type_, data, db=db) for data in items]

    async def emit(self, type_: str, data: dict[str, Any] | None = None, **kw: Any) -> str:
        """Produce one event and relay it into deliveries."""
        event_id = self.produce(type_, data if data is not None else {"n": 1}, **kw)
        assert await self.relay.run_once() >= 1
        return event_id

    # --- destinations ---------------------------------------------------------
    async def add_webhook(
        self,
        url: str,
        *,
        events: Sequence[str] = ("*",),
        tenant: str = "default",
        status: DestinationStatus = DestinationStatus.ACTIVE,
        secret: str | None = SECRET,
        custom_headers: str | None = None,
        name: str = "hook",
    ) -> Destination:
        """Store a destination directly in the given status (no verification ping)."""
        now = time.time()
        config: dict[str, Any] = {"url": url}
        if custom_headers is not None:
            config["custom_headers"] = custom_headers
        dest = Destination(
            id=new_id("evtd_"),
            tenant_id=tenant,
            name=name,
            type="webhook",
            config=config,
            secrets={"secret": secret} if secret else {},
            events=tuple(events),
            status=status,
            created_at=now,
            updated_at=now,
        )
        await self.store.create_destination(dest, verification=None)
        await self.catalog.refresh()
        return dest

    async def deliveries(self, **flt: Any) -> list[Delivery]:
        return await self.store.list_deliveries(DeliveryFilter(**flt), before_id=None, limit=10_000)

    async def delivery(self, delivery_id: str) -> Delivery:
        d = await self.store.get_delivery(None, delivery_id, with_attempts=True)
        assert d is not None
        return d

    # --- workers --------------------------------------------------------------
    def limits(self, **overrides: Any) -> Limits:
        return replace(delivery_limits(self.settings.delivery), **overrides)

    def dispatcher(self, *, owner: str = "it-worker", **limits: Any) -> Dispatcher:
        d = Dispatcher(self.store, self.catalog, self.policy, self.limits(**limits), owner=owner)
        self.dispatchers.append(d)
        return d


HarnessFactory = Callable[..., Awaitable[Harness]]


@asynccontextmanager
async def open_harness(
    settings: Settings, *, egress: EgressPolicy | None = None
) -> AsyncIterator[Harness]:
    assert settings.security.encryption_key is not None
    box = SecretBox(parse_key(settings.security.encryption_key.get_secret_value()))
    store = make_store(settings, box)
    await store.open()
    registry = Registry(
        AdapterContext(
            settings=settings,
            egress=egress or EgressPolicy(allow_private=settings.security.allow_private_networks),
        )
    )
    catalog = Catalog(store, registry)
    d = settings.delivery
    policy = RetryPolicy(
        base_seconds=d.backoff_base_seconds,
        max_retries=d.max_retries,
        retry_after_max_seconds=d.retry_after_max_seconds,
    )
    service = Operations(store, registry, policy, catalog=catalog)
    relay = Relay(
        store,
        catalog,
        policy,
        batch_size=settings.relay.batch_size,
        poll_interval=settings.relay.poll_interval_seconds,
        idle_poll=settings.relay.idle_poll_seconds,
        max_payload_bytes=settings.relay.max_payload_bytes,
    )
    harness = Harness(settings, box, store, registry, catalog, policy, service, relay)
    try:
        yield harness
    finally:
        harness.close_db()
        await registry.close()
        await store.close()


@pytest.fixture
async def harness_factory(database_url: str) -> AsyncIterator[HarnessFactory]:
    """Build a harness with overridden settings: ``await make(delivery={...})``.

    Parametrised over the backends through ``database_url``; harnesses made in one
    test share its database."""
    stack: list[Any] = []

    async def make(**kw: Any) -> Harness:
        cm = open_harness(make_settings(database_url, **kw))
        h = await cm.__aenter__()
        stack.append(cm)
        return h

    yield make
    for cm in reversed(stack):
        await cm.__aexit__(None, None, None)


@pytest.fixture
async def harness(harness_factory: HarnessFactory) -> Harness:
    return await harness_factory()


@asynccontextmanager
async def running(
    dispatcher: Dispatcher, *, stop_timeout: float = 15.0
) -> AsyncIterator[asyncio.Event]:
    """Run ``dispatcher`` in the background; stop it (bounded) on exit."""
    stop = asyncio.Event()
    task = asyncio.create_task(dispatcher.run(stop), name="it-dispatcher")
    try:
        yield stop
    finally:
        stop.set()
        await asyncio.wait_for(task, stop_timeout)


# --- receivers ---------------------------------------------------------------
class Gate:
    """Lets slow receiver handlers sleep, but releases them all at teardown."""

    def __init__(self) -> None:
        self._open = asyncio.Event()

    async def sleep(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._open.wait(), timeout=seconds)
        except TimeoutError:
            return

    def release(self) -> None:
        self._open.set()


ReceiverFactory = Callable[..., Awaitable[Receiver]]


@pytest.fixture
def gate() -> Gate:
    return Gate()


@pytest.fixture
async def receivers(gate: Gate) -> AsyncIterator[ReceiverFactory]:
    """Start real webhook receivers: ``await start(behaviour=..., secrets=[...])``."""
    started: list[Receiver] = []

    async def start(
        behaviour: Behaviour | None = None, *, secrets: Sequence[str] = (SECRET,)
    ) -> Receiver:
        r = Receiver(secrets=list(secrets))
        if behaviour is not None:
            r.behaviour = behaviour
        await r.start()
        started.append(r)
        return r

    yield start
    gate.release()
    for r in started:
        await asyncio.wait_for(r.stop(), 15)


def status(code: int, body: str = "", headers: Mapping[str, str] | None = None) -> Behaviour:
    def answer(_: Received) -> web.StreamResponse:
        return web.Response(status=code, text=body, headers=dict(headers or {}))

    return answer
