"""Fixtures for the AWS adapters: moto's server for the session, wiped per test.

Every AWS API call in these tests goes over HTTP to moto on 127.0.0.1; the only
stand-in is :class:`FakeAWS`, a tiny server that answers what moto cannot be made
to answer (throttling, a PutEvents entry that failed). The helpers every type's
tests share (:func:`creds`, :func:`deliver`, :class:`AWSContract`) are here too.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from herald.adapters.aws import AWSConfig
from herald.adapters.base import Adapter, AdapterContext, Result
from herald.config import Settings
from herald.egress import EgressPolicy
from herald.model import Event, Outcome
from tests.contract.adapter_contract import (
    AMBIENT,
    AdapterContract,
    make_destination,
    make_event,
)
from tests.integration.aws.support import (
    ACCESS_KEY,
    SECRET_KEY,
    MotoServer,
    closed_port,
    envelope_of,
    isolate_aws_environment,
)


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
        ctx = AdapterContext(
            settings=Settings(**{**AMBIENT, **settings}), egress=EgressPolicy(allow_private=True)
        )
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


# --- what every type's tests share ----------------------------------------------------
def creds(
    adapter: type[Adapter], key: str = ACCESS_KEY, secret: str = SECRET_KEY
) -> dict[str, str]:
    """Explicit credentials in the fields ``adapter``'s config names them with."""
    model = adapter.config_model
    assert issubclass(model, AWSConfig)
    key_field, secret_field = model.credential_fields
    return {key_field: key, secret_field: secret}


async def deliver(adapter: Adapter, raw: dict[str, str], event: Event | None = None) -> Result:
    """Deliver ``event`` (a fresh one by default) to a new destination configured by ``raw``."""
    config = adapter.config_model.model_validate(raw)
    dest = make_destination(adapter.type_id, config)
    return await adapter.deliver(dest, config, event or make_event())


class AWSContract(AdapterContract):
    """The adapter contract against moto; a type's suite names a target and reads back."""

    def target(self, endpoint: str) -> dict[str, str]:
        """Target fields naming something at ``endpoint`` that does not exist."""
        raise NotImplementedError

    def config(self, endpoint: str, **target: str) -> dict[str, str]:
        """``target`` at ``endpoint``, with the test credentials."""
        return {**target, "endpoint_url": endpoint, **creds(self.adapter_class)}

    @pytest.fixture(autouse=True)
    def _keep_moto(self, moto: MotoServer) -> None:
        self._moto = moto

    @pytest.fixture
    def missing_target_config(self, moto: MotoServer) -> dict[str, str]:
        return self.config(moto.endpoint, **self.target(moto.endpoint))

    @pytest.fixture
    def bad_credentials_config(
        self, moto: MotoServer, good_config: dict[str, str]
    ) -> Iterator[dict[str, str]]:
        with moto.iam_enforced():  # after the target exists
            yield {**good_config, **creds(self.adapter_class, "AKIAUNKNOWN000000000", "wrong")}

    @pytest.fixture
    def unreachable_config(self) -> dict[str, str]:
        closed = f"http://127.0.0.1:{closed_port()}"
        return self.config(closed, **self.target(closed))


class EnvelopeOnlyContract(AWSContract):
    """For a type whose message has no attributes (a Kinesis record, a PutEvents entry)."""

    async def test_success_arrives_with_envelope_and_metadata(
        self, adapter: Adapter, good_config: dict[str, str]
    ) -> None:
        """The contract's check, less ``tenant-id``: the design fixes the message body as
        the envelope, which has no tenant field. The tenant is implied by the target (a
        destination belongs to one tenant)."""
        event = make_event(tenant="acme")
        result = await self.publish(adapter, good_config, event)
        assert result.outcome is Outcome.SUCCESS, result
        got = await self.read_back(good_config, event)
        assert json.loads(got["body"]) == envelope_of(event)
        assert got["metadata"] == {
            "event-id": event.id,
            "event-type": event.type,
            "event-created-at": event.created_at,
        }
