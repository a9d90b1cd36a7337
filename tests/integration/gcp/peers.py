"""Pub/Sub protocol peers on 127.0.0.1, both spoken to by the real client over real gRPC.

- :class:`Emulator` — Google's Pub/Sub emulator (Debian's
  ``google-cloud-cli-pubsub-emulator``, Java), where the machine has it; read
  back through a subscription created before publishing.
- :class:`FakePublisher` — an in-process ``grpc.aio`` server for
  ``google.pubsub.v1.Publisher`` built from the library's proto-plus types
  (google-cloud-pubsub ships no ``pubsub_pb2_grpc``); it stores what it gets.
  Optionally over TLS, checking the bearer JWT each service-account key signs,
  so refused credentials are testable (the emulator authenticates nobody).
"""

from __future__ import annotations

import asyncio
import ctypes
import datetime as dt
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import grpc
import orjson
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from google.api_core.exceptions import DeadlineExceeded
from google.auth import jwt
from google.pubsub_v1.services.publisher import PublisherAsyncClient
from google.pubsub_v1.services.publisher.transports import PublisherGrpcAsyncIOTransport
from google.pubsub_v1.services.subscriber import SubscriberAsyncClient
from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcAsyncIOTransport
from google.pubsub_v1.types import (
    PublishRequest,
    PublishResponse,
    PubsubMessage,
    Topic,
)

LAUNCHER_NAME = "cloud-pubsub-emulator"
PR_SET_PDEATHSIG = 1
_SDK_ROOTS = ("/usr/lib/google-cloud-sdk", "/usr/share/google-cloud-sdk", "~/google-cloud-sdk")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def find_emulator() -> str | None:
    """The emulator's launcher, if this machine has it (and Java to run it)."""
    if shutil.which("java") is None:
        return None
    found = shutil.which(LAUNCHER_NAME)
    if found:
        return found
    for root in _SDK_ROOTS:
        path = Path(root).expanduser() / "platform/pubsub-emulator/bin" / LAUNCHER_NAME
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    return None


# Looked up here, not in the forked child: no dynamic loading between fork and exec.
_PRCTL = ctypes.CDLL(None).prctl if sys.platform.startswith("linux") else None


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the parent exits (Linux prctl)."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGTERM)


class Peer(Protocol):
    """What a test needs from a Pub/Sub peer."""

    name: str

    @property
    def endpoint(self) -> str:
        """The destination's ``endpoint_url``."""
        ...

    async def create_topic(self, project: str, topic: str) -> None: ...

    async def messages(self, project: str, topic: str) -> list[PubsubMessage]:
        """Everything published to the topic since it was created (so far)."""
        ...


# --- the emulator ------------------------------------------------------------------------
class Emulator:
    """The Java emulator as a child process, stopped by its PID."""

    def __init__(self, launcher: str, workdir: Path) -> None:
        self.launcher = launcher
        self.port = free_port()
        self.log_path = workdir / "pubsub-emulator.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, *, timeout: float = 30.0) -> Emulator:
        with self.log_path.open("wb") as log:
            # The launcher execs java, so the PID is the JVM's. It stays in pytest's
            # process group (a `timeout` or Ctrl-C that ends pytest ends it too) and,
            # on Linux, is told to die with its parent: a pytest killed before its
            # teardown must not leave a JVM behind.
            self.proc = subprocess.Popen(
                [self.launcher, "--host=127.0.0.1", f"--port={self.port}"],
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the Pub/Sub emulator exited:\n{self.log_path.read_text()}")
            if b"Server started" in self.log_path.read_bytes():
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"the Pub/Sub emulator did not start within {timeout} s")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


_shared: Emulator | None = None


def shared_emulator(launcher: str, workdir: Path) -> Emulator:
    """One emulator per test session, whichever fixture asks first (JVM start-up is slow)."""
    global _shared
    if _shared is None or _shared.proc is None or _shared.proc.poll() is not None:
        _shared = Emulator(launcher, workdir).start()
    return _shared


def stop_shared_emulator() -> None:
    global _shared
    if _shared is not None:
        _shared.stop()
        _shared = None


class EmulatorPeer:
    """Topics and read-back subscriptions on a running emulator (clients on the test's loop)."""

    name = "emulator"

    def __init__(self, emulator: Emulator) -> None:
        self.endpoint = target = emulator.endpoint
        self._pub = PublisherAsyncClient(
            transport=PublisherGrpcAsyncIOTransport(
                host=target, channel=grpc.aio.insecure_channel(target)
            )
        )
        self._sub = SubscriberAsyncClient(
            transport=SubscriberGrpcAsyncIOTransport(
                host=target, channel=grpc.aio.insecure_channel(target)
            )
        )
        self._received: dict[str, list[PubsubMessage]] = {}

    async def create_topic(self, project: str, topic: str) -> None:
        path = f"projects/{project}/topics/{topic}"
        await self._pub.create_topic(name=path, timeout=10)
        # Messages are kept only for subscriptions that exist when they are published.
        await self._sub.create_subscription(
            name=f"projects/{project}/subscriptions/{topic}-readback", topic=path, timeout=10
        )
        self._received[path] = []

    async def messages(self, project: str, topic: str) -> list[PubsubMessage]:
        path = f"projects/{project}/topics/{topic}"
        sub = f"projects/{project}/subscriptions/{topic}-readback"
        try:
            # Waits until something is there (or the deadline: then nothing new is).
            response = await self._sub.pull(subscription=sub, max_messages=1000, timeout=2)
        except DeadlineExceeded:
            return list(self._received[path])
        if response.received_messages:
            await self._sub.acknowledge(
                subscription=sub,
                ack_ids=[m.ack_id for m in response.received_messages],
                timeout=10,
            )
        self._received[path].extend(m.message for m in response.received_messages)
        return list(self._received[path])

    async def close(self) -> None:
        await self._pub.transport.close()  # type: ignore[no-untyped-call]
        await self._sub.transport.close()  # type: ignore[no-untyped-call]


# --- the in-process server ------------------------------------------------------------
TLS_NAME = "pubsub.pinned.test"
"""A name the certificate also covers (no resolver knows it; tests pin it to 127.0.0.1)."""


@dataclass
class Tls:
    """A throwaway CA-less certificate for 127.0.0.1 (and TLS_NAME), trusted through a
    roots file."""

    cert_pem: bytes
    key_pem: bytes

    @classmethod
    def generate(cls) -> Tls:
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
        now = dt.datetime.now(dt.UTC)
        import ipaddress

        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(
                x509.SubjectAlternativeName(
                    [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName(TLS_NAME)]
                ),
                critical=False,
            )
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256())
        )
        return cls(
            cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ),
        )


@dataclass
class ServiceAccount:
    """A generated service-account key and the public half a server trusts."""

    email: str
    key_id: str
    info: dict[str, Any]
    public_pem: bytes

    @classmethod
    def generate(cls, email: str = "herald@herald-test.iam.gserviceaccount.com") -> ServiceAccount:
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        key_id = os.urandom(20).hex()
        private = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode()
        info = {
            "type": "service_account",
            "project_id": "herald-test",
            "private_key_id": key_id,
            "private_key": private,
            "client_email": email,
            "client_id": "1234567890",
            "auth_uri": "https://accounts.google.com/o/oauth2/auth",
            # Never contacted: keys sign their own JWTs. Pointing it at a closed local
            # port makes any attempt to use it fail loudly instead of leaving the machine.
            "token_uri": "https://127.0.0.1:9/token",
        }
        public = key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        return cls(email, key_id, info, public)

    @property
    def json(self) -> str:
        return orjson.dumps(self.info).decode()


@dataclass
class FakePublisher:
    """``google.pubsub.v1.Publisher/Publish`` on 127.0.0.1, storing every message."""

    topics: set[str] = field(default_factory=set)
    tls: Tls | None = None
    trusted: Mapping[str, bytes] = field(default_factory=dict)
    """key id → public key PEM; with ``tls``, only JWTs signed by these are accepted."""
    fail_next: list[grpc.StatusCode] = field(default_factory=list)
    """Status codes to answer the next Publish calls with, in order."""
    hold: asyncio.Event | None = None
    """While set to an unset event, Publish calls wait for it (a slow server)."""
    name: str = "grpc"
    port: int = 0
    published: dict[str, list[PubsubMessage]] = field(default_factory=dict)
    calls: int = 0
    _server: grpc.aio.Server | None = None
    _next_id: int = 0

    @property
    def endpoint(self) -> str:
        scheme = "https://" if self.tls else ""
        return f"{scheme}127.0.0.1:{self.port}"

    async def start(self) -> FakePublisher:
        server = grpc.aio.server()
        handler = grpc.method_handlers_generic_handler(
            "google.pubsub.v1.Publisher",
            {
                "Publish": grpc.unary_unary_rpc_method_handler(
                    self._publish,
                    request_deserializer=PublishRequest.deserialize,
                    response_serializer=PublishResponse.serialize,
                ),
                "CreateTopic": grpc.unary_unary_rpc_method_handler(
                    self._create_topic,
                    request_deserializer=Topic.deserialize,
                    response_serializer=Topic.serialize,
                ),
            },
        )
        server.add_generic_rpc_handlers((handler,))
        if self.tls is not None:
            creds = grpc.ssl_server_credentials([(self.tls.key_pem, self.tls.cert_pem)])
            self.port = server.add_secure_port("127.0.0.1:0", creds)
        else:
            self.port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        self._server = server
        return self

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=None)
            self._server = None

    async def create_topic(self, project: str, topic: str) -> None:
        path = f"projects/{project}/topics/{topic}"
        self.topics.add(path)
        self.published.setdefault(path, [])

    async def messages(self, project: str, topic: str) -> list[PubsubMessage]:
        return list(self.published.get(f"projects/{project}/topics/{topic}", []))

    async def close(self) -> None:
        return

    # --- RPCs ---------------------------------------------------------------------
    async def _create_topic(
        self, request: Topic, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Topic:
        self.topics.add(request.name)
        self.published.setdefault(request.name, [])
        return request

    async def _publish(
        self, request: PublishRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> PublishResponse:
        self.calls += 1
        if self.hold is not None:
            await self.hold.wait()
        if self.tls is not None:
            await self._authenticate(context)
        if self.fail_next:
            code = self.fail_next.pop(0)
            await context.abort(code, f"injected {code.name}")
        if request.topic not in self.topics:
            await context.abort(grpc.StatusCode.NOT_FOUND, "Resource not found (resource=topic).")
        ids = []
        for message in request.messages:
            self._next_id += 1
            ids.append(str(self._next_id))
            self.published[request.topic].append(message)
        return PublishResponse(message_ids=ids)

    async def _authenticate(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        metadata = dict(context.invocation_metadata() or ())
        header = metadata.get("authorization", "")
        if not isinstance(header, str) or not header.startswith("Bearer "):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing bearer token")
        try:
            jwt.decode(header.removeprefix("Bearer "), certs=dict(self.trusted))  # type: ignore[no-untyped-call]
        except Exception:
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "Request had invalid authentication credentials.",
            )


async def wait_for(
    check: Callable[[], Any], *, timeout: float = 10.0, what: str = "condition"
) -> Any:
    """Await ``check()`` (a coroutine function) until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.05)


def find(messages: Iterable[PubsubMessage], event_id: str) -> PubsubMessage | None:
    for message in messages:
        if message.attributes.get("event-id") == event_id:
            return message
    return None
