"""A receiver behind an OAuth2 token server and a client certificate, through `herald
run`: deliveries carry the bearer token over mutual TLS, one token request serves a
backlog, a revoked token is replaced within the attempt, a wrong secret is recorded as
the token server's refusal, and no secret or token reaches the database, the log, the
API or the console's pages."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import HeraldFactory
from tests.e2e.test_console_http import Client
from tests.e2e.test_security import raw_database
from tests.support.api import Api, eventually, open_api, wait_status
from tests.support.receiverauth import OAuthClient, Protected, TestCA, TokenServer

pytestmark = [pytest.mark.e2e, pytest.mark.backend_neutral]

DESTS = "/v2/event-destinations"
CLIENT_SECRET = "oauth2-e2e-client-s3cret-4471"
WORKERS = 2


async def until(check: Callable[[], bool], *, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


@pytest.fixture
async def token_server() -> AsyncIterator[TokenServer]:
    server = await TokenServer().start()
    server.add(OAuthClient("herald", secret=CLIENT_SECRET))
    yield server
    await server.stop()


@pytest.fixture
def ca() -> TestCA:
    return TestCA()


@pytest.fixture
async def partner(
    token_server: TokenServer, ca: TestCA, tmp_path: Path
) -> AsyncIterator[Protected]:
    """A partner API: only the token server's tokens, only with a client certificate."""
    (tmp_path / "tls").mkdir()
    receiver = await Protected(server=token_server, tls=ca.server_context(tmp_path / "tls")).start()
    yield receiver
    await receiver.stop()


async def delivered(api: Api, dest_id: str) -> list[dict[str, Any]]:
    status, _, body = await api.get(f"{DESTS}/{dest_id}/event-deliveries")
    assert status == 200, body
    return list(body["data"])


async def test_oauth2_and_mtls_through_the_daemon(
    herald_factory: HeraldFactory,
    token_server: TokenServer,
    partner: Protected,
    ca: TestCA,
) -> None:
    h = herald_factory(
        {"log": {"level": "debug"}, "delivery": {"worker_processes": WORKERS, "max_retries": 1}},
        start=False,
    )
    await h.astart()
    client_cert = ca.issue("herald-e2e")
    config = {
        "url": partner.url,
        "oauth2_token_url": token_server.token_url,
        "oauth2_client_id": "herald",
        "oauth2_client_secret": CLIENT_SECRET,
        "oauth2_scope": "events:write",
        "tls_client_certificate": client_cert.certificate,
        "tls_client_key": client_cert.key,
        "tls_ca_certificate": ca.pem,
    }
    answers: list[str] = []
    async with open_api(h, "acme") as api:
        status, _, created = await api.post(
            DESTS,
            json={"name": "partner", "type": "webhook", "events": ["order.*"], "webhook": config},
        )
        assert status == 201, created
        dest_id = created["id"]
        await wait_status(api, dest_id, "active", timeout=60)

        # A backlog of 100 events: one token per attempting process at most.
        for i in range(100):
            status, _, _ = await api.post(
                "/v2/events", json={"type": "order.created", "data": {"i": i}}
            )
            assert status in (200, 201, 202)
        await until(lambda: partner.statuses[200] >= 101, what="100 deliveries and the ping")
        assert 1 <= len(token_server.requests) <= WORKERS + 1, token_server.requests
        assert partner.statuses[401] == 0
        assert set(partner.peers) == {"herald-e2e"}
        assert {r.form.get("scope") for r in token_server.requests} == {"events:write"}

        # A revoked token: one 401, a new token, success in the same attempt.
        token_server.revoke()
        fetched = len(token_server.requests)
        status, _, event = await api.post("/v2/events", json={"type": "order.revoked", "data": {}})
        assert status in (200, 201, 202), event
        await until(lambda: partner.statuses[200] >= 102, what="the delivery after the 401")
        assert partner.statuses[401] == 1
        assert len(token_server.requests) == fetched + 1
        recorded: list[dict[str, Any]] = []

        async def probe() -> bool:
            recorded[:] = [
                d
                for d in await delivered(api, dest_id)
                if d["event_id"] == event["id"] and d["status"] != "pending"
            ]
            return bool(recorded)

        await eventually(probe, timeout=30, what="the delivery after the 401 recorded")
        assert [(d["status"], d["attempt_count"]) for d in recorded] == [("success", 1)]

        # A wrong secret: the attempt fails with the token server's refusal.
        status, _, wrong = await api.post(
            DESTS,
            json={
                "name": "wrong",
                "type": "webhook",
                "events": ["order.*"],
                "webhook": {**config, "oauth2_client_secret": "not-the-secret-0042"},
            },
        )
        assert status == 201, wrong
        failed: dict[str, Any] = {}

        async def verification_failed() -> bool:
            code, _, body = await api.get(f"{DESTS}/{wrong['id']}")
            assert code == 200, body
            failed.update(body)
            return bool(body["verification"]["state"] == "failed")

        await eventually(verification_failed, timeout=30, what="the verification ping to fail")
        answers.append(str(failed))
        assert failed["verification"]["last_error"] == "oauth2_token: 401 invalid_client"

        # What the API shows: the credentials masked, never the values.
        for path in (f"{DESTS}/{dest_id}", DESTS, f"{DESTS}/{dest_id}/event-deliveries"):
            status, _, body = await api.get(path)
            assert status == 200
            answers.append(str(body))
        status, _, shown = await api.get(f"{DESTS}/{dest_id}")
        assert shown["webhook"]["oauth2_client_secret"] == "********"
        assert shown["webhook"]["tls_client_key"] == "********"
        assert shown["webhook"]["tls_client_certificate"] == client_cert.certificate

    console = Client(h)
    key = (await h.acli("keys", "create", "--operator")).stdout.strip()
    assert console.sign_in(key) == 303
    for page in (
        f"/console/destinations/{dest_id}",
        "/console/destinations",
        "/console/deliveries",
    ):
        code, text = await asyncio.to_thread(console.request, page)
        assert code == 200, page
        answers.append(text)
    assert await h.astop() == 0

    needles = {
        "the client secret": CLIENT_SECRET,
        "the wrong secret": "not-the-secret-0042",
        "the client key": client_cert.key.splitlines()[1],
    }
    needles.update({f"token {i}": t["access_token"] for i, t in enumerate(token_server.issued)})
    places = {
        "the log": h.log(),
        "the API and the pages": "\n".join(answers),
        **{
            f"the database ({name})": data.decode("latin-1")
            for name, data in raw_database(h).items()
        },
    }
    # The scan does see the stored rows: the plain fields are there in clear.
    assert any(partner.url in text for name, text in places.items() if "database" in name)
    leaks = [f"{n} in {p}" for n, v in needles.items() for p, text in places.items() if v in text]
    assert not leaks, leaks
