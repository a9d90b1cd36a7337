"""Pub/Sub peers for the integration tests: the emulator where installed, the in-process
gRPC Publisher always (so both code paths stay tested), and a TLS variant of the
latter that checks credentials."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.integration.gcp.peers import (
    Emulator,
    EmulatorPeer,
    FakePublisher,
    Peer,
    ServiceAccount,
    Tls,
    find_emulator,
    shared_emulator,
    stop_shared_emulator,
)

EMULATOR = find_emulator()
PEERS = ("emulator", "grpc") if EMULATOR else ("grpc",)
PROJECT = "herald-test"


@pytest.fixture(scope="session")
def pubsub_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    """The session's emulator (shared with the e2e tests), stopped by PID at the end."""
    if EMULATOR is None:
        pytest.skip("the Pub/Sub emulator is not installed here")
    try:
        yield shared_emulator(EMULATOR, tmp_path_factory.mktemp("pubsub-emulator"))
    finally:
        stop_shared_emulator()


@pytest.fixture(params=PEERS)
async def pubsub_peer(request: pytest.FixtureRequest) -> AsyncIterator[Peer]:
    """Each test that uses it runs once per available peer."""
    if request.param == "emulator":
        peer = EmulatorPeer(request.getfixturevalue("pubsub_emulator"))
        try:
            yield peer
        finally:
            await peer.close()
    else:
        fake = await FakePublisher().start()
        try:
            yield fake
        finally:
            await fake.stop()


@pytest.fixture
async def fake_publisher() -> AsyncIterator[FakePublisher]:
    fake = await FakePublisher().start()
    try:
        yield fake
    finally:
        await fake.stop()


# grpc.aio's Server.stop, for a TLS server that JWT-authenticated calls reached, now and
# then blocks in the C core for good (seen in about one run of the gcp tests in ten, with
# grpcio 1.85, and on the test's own event loop, so the whole run froze). These servers
# are left running instead, for the process's life; their loops are gone, they accept
# nothing more, and the port is never reused.
_LEFT_RUNNING: list[FakePublisher] = []


@pytest.fixture(scope="session")
def tls_roots(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tls]:
    """A certificate for 127.0.0.1 that gRPC's TLS trusts in this process.

    ``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH`` is gRPC's documented way to replace its
    root store; it must be set before the first TLS channel of the process.
    """
    tls = Tls.generate()
    path: Path = tmp_path_factory.mktemp("tls") / "roots.pem"
    path.write_bytes(tls.cert_pem)
    old = os.environ.get("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH")
    os.environ["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"] = str(path)
    try:
        yield tls
    finally:
        if old is None:
            os.environ.pop("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH", None)
        else:
            os.environ["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"] = old


@pytest.fixture(scope="session")
def trusted_account() -> ServiceAccount:
    return ServiceAccount.generate()


@pytest.fixture(scope="session")
def untrusted_account() -> ServiceAccount:
    return ServiceAccount.generate(email="intruder@herald-test.iam.gserviceaccount.com")


@pytest.fixture
async def secure_publisher(
    tls_roots: Tls, trusted_account: ServiceAccount
) -> AsyncIterator[FakePublisher]:
    """The in-process Publisher over TLS, accepting only JWTs of ``trusted_account``."""
    fake = await FakePublisher(
        tls=tls_roots, trusted={trusted_account.key_id: trusted_account.public_pem}
    ).start()
    yield fake
    _LEFT_RUNNING.append(fake)
