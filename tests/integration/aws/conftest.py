"""Fixtures for the AWS adapters: moto's server for the session, wiped per test.

Every AWS API call in these tests goes over HTTP to moto on 127.0.0.1; the only
stand-in is :class:`FakeAWS`, a tiny server that answers what moto cannot be made
to answer (throttling, a PutEvents entry that failed).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from herald.adapters.base import Adapter, AdapterContext
from herald.config import Settings
from herald.egress import EgressPolicy
from tests.integration.aws.support import MotoServer, isolate_aws_environment


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoServer]:
    server = MotoServer().start()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def _aws_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    isolate_aws_environment(monkeypatch)


@pytest.fixture
def moto(moto_server: MotoServer) -> MotoServer:
    """The moto server, emptied for this test."""
    moto_server.reset()
    return moto_server


@pytest.fixture
def iam(moto: MotoServer) -> Iterator[MotoServer]:
    """The moto server with signatures and IAM policies checked for this test."""
    with moto.iam_enforced():
        yield moto


AdapterFactory = Callable[..., Adapter]


@pytest.fixture
async def make_adapter() -> AsyncIterator[AdapterFactory]:
    """Build adapters with settings overrides; all are closed at teardown."""
    made: list[Adapter] = []

    def make(cls: type[Adapter], **settings: Any) -> Adapter:
        ctx = AdapterContext(settings=Settings(**settings), egress=EgressPolicy(allow_private=True))
        adapter = cls(ctx)
        made.append(adapter)
        return adapter

    yield make
    for adapter in made:
        await adapter.close()


# --- a server that answers like AWS does when it will not take the request ----------------
@dataclass
class FakeAWS:
    """Answers every request with ``status`` and an error body in the caller's protocol.

    JSON-protocol APIs (SQS, Kinesis, EventBridge: they send ``X-Amz-Target``) get
    ``{"__type": code, …}``, S3 gets its XML ``<Error>``. With ``entry_error`` set it
    answers 200 with a PutEvents response whose one entry failed with that code.
    """

    status: int = 503
    code: str = "ServiceUnavailable"
    message: str = "Please reduce your request rate."
    entry_error: str | None = None
    requests: list[str] = field(default_factory=list)
    url: str = ""
    _runner: web.AppRunner | None = None

    async def _handle(self, request: web.Request) -> web.Response:
        await request.read()
        target = request.headers.get("X-Amz-Target")
        self.requests.append(target or f"{request.method} {request.path}")
        if self.entry_error is not None:
            body = {
                "FailedEntryCount": 1,
                "Entries": [{"ErrorCode": self.entry_error, "ErrorMessage": self.message}],
            }
            return web.json_response(body, content_type="application/x-amz-json-1.1")
        if target is not None:
            return web.Response(
                status=self.status,
                text=json.dumps({"__type": self.code, "message": self.message}),
                content_type="application/x-amz-json-1.0",
            )
        xml = f"<Error><Code>{self.code}</Code><Message>{self.message}</Message></Error>"
        return web.Response(status=self.status, text=xml, content_type="application/xml")

    async def start(self) -> FakeAWS:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


FakeFactory = Callable[..., Awaitable[FakeAWS]]


@pytest.fixture
async def fake_aws() -> AsyncIterator[FakeFactory]:
    """Start :class:`FakeAWS` servers: ``await fake_aws(status=503, code="SlowDown")``."""
    started: list[FakeAWS] = []

    async def start(**kwargs: Any) -> FakeAWS:
        fake = await FakeAWS(**kwargs).start()
        started.append(fake)
        return fake

    yield start
    for fake in started:
        await fake.stop()
