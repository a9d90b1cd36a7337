"""RabbitMQ on 127.0.0.1 as the tests use it: control, a private node, inspection.

Most tests use the broker running on the machine (``scripts/test-services.sh``
starts it when it is down); they add users and vhosts to it and remove them, never
stop it. The tests that stop the broker or need a TLS listener get
:class:`PrivateBroker`, a node of the run's own with its own ports and files, so the
machine's broker, and every test using it, never sees a restart. Control goes through
``rabbitmqctl`` with a bound on every call.

These helpers are shared by ``tests/integration/amqp`` and
``tests/e2e/test_amqp_hookdeck.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import ipaddress
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aio_pika
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.support.daemon import free_port

HOST = "127.0.0.1"
PORT = 5672
TLS_PORT = 5671
GUEST_URL = f"amqp://guest:guest@{HOST}:{PORT}/"
REPO = Path(__file__).resolve().parents[3]


def port_open(port: int, host: str = HOST) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
        return True
    return False


def wait_port(port: int, *, open_: bool = True, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if port_open(port) == open_:
            return True
        time.sleep(0.1)
    return False


def ensure_running() -> None:
    """Start the broker through the test-services script if its port is closed."""
    if port_open(PORT):
        return
    subprocess.run([str(REPO / "scripts" / "test-services.sh")], check=False, timeout=180)
    if not wait_port(PORT, timeout=10):
        raise RuntimeError(
            f"RabbitMQ is not listening on {HOST}:{PORT} and scripts/test-services.sh"
            " could not start it"
        )


def rabbitmqctl_path() -> str | None:
    return shutil.which("rabbitmqctl") or shutil.which("rabbitmqctl", path="/usr/sbin:/sbin")


def can_manage() -> str | None:
    """None if this process may run ``rabbitmqctl``; else why not."""
    if rabbitmqctl_path() is None:
        return "rabbitmqctl is not installed"
    try:
        rabbit_uid = pwd.getpwnam("rabbitmq").pw_uid
    except KeyError:
        return "there is no rabbitmq system user"
    if os.geteuid() not in (0, rabbit_uid):
        return "rabbitmqctl needs root or the rabbitmq user"
    return None


def rabbitmqctl(*args: str, timeout: float = 30.0) -> str:
    """Run one ``rabbitmqctl`` command; raise with its output if it fails."""
    path = rabbitmqctl_path()
    assert path is not None
    proc = subprocess.run(
        [path, "-q", *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"rabbitmqctl {' '.join(args)}: {proc.stdout}{proc.stderr}")
    return proc.stdout.strip()


# --- users and vhosts ---------------------------------------------------------------------
@dataclass(frozen=True)
class BrokerUser:
    name: str
    password: str
    vhost: str
    write: str
    """The user's ``write`` permission regex; it has no ``configure`` or ``read``."""

    @property
    def url(self) -> str:
        """``amqp://user:pass@host:port/vhost`` with every part percent-encoded."""
        return (
            f"amqp://{quote(self.name, safe='')}:{quote(self.password, safe='')}"
            f"@{HOST}:{PORT}/{quote(self.vhost, safe='')}"
        )

    @property
    def guest_url(self) -> str:
        """guest, with full permissions on the same vhost (to declare and read)."""
        return f"amqp://guest:guest@{HOST}:{PORT}/{quote(self.vhost, safe='')}"


@contextlib.contextmanager
def broker_user(name: str, password: str, vhost: str, *, write: str) -> Iterator[BrokerUser]:
    """A vhost and a user who may only publish to exchanges matching ``write``; removed after.

    One ``import_definitions`` call makes both (each rabbitmqctl call starts an Erlang VM,
    which takes seconds on a loaded machine).
    """
    definitions = {
        "users": [{"name": name, "password": password, "tags": ""}],
        "vhosts": [{"name": vhost}],
        "permissions": [
            {"user": name, "vhost": vhost, "configure": "^$", "write": write, "read": "^$"},
            {"user": "guest", "vhost": vhost, "configure": ".*", "write": ".*", "read": ".*"},
        ],
    }
    # rabbitmqctl reads the file as the rabbitmq user: pytest's tmp_path is not readable.
    fd, path = tempfile.mkstemp(prefix="herald-amqp-defs-", suffix=".json")
    try:
        os.write(fd, json.dumps(definitions).encode())
        os.close(fd)
        os.chmod(path, 0o644)
        rabbitmqctl("import_definitions", path)
    finally:
        os.unlink(path)
    try:
        yield BrokerUser(name, password, vhost, write)
    finally:
        _delete_user_and_vhost(name, vhost)


def _delete_user_and_vhost(name: str, vhost: str) -> None:
    try:
        rabbitmqctl(
            "eval",
            f'rabbit_auth_backend_internal:delete_user({_binary(name)}, <<"herald-tests">>),'
            f' rabbit_vhost:delete({_binary(vhost)}, <<"herald-tests">>).',
        )
    except RuntimeError:  # another broker version: the slower, stable commands
        with contextlib.suppress(RuntimeError):
            rabbitmqctl("delete_user", name)
        with contextlib.suppress(RuntimeError):
            rabbitmqctl("delete_vhost", vhost)


def _binary(text: str) -> str:
    """An Erlang binary literal for ``text`` (UTF-8 bytes, so no quoting issues)."""
    return "<<" + ",".join(str(b) for b in text.encode()) + ">>"


# --- TLS ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class TLSFiles:
    ca: Path
    cert: Path
    key: Path
    other_ca: Path
    """A CA that did not sign the broker's certificate (for the verification-fails case)."""


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _ca(name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def make_tls_files(directory: Path) -> TLSFiles:
    """A throwaway CA and a server certificate for 127.0.0.1/localhost, readable by rabbitmq."""
    ca_key, ca_cert = _ca("Herald test CA")
    _, other_cert = _ca("Herald unrelated CA")
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address(HOST))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    files = TLSFiles(
        ca=directory / "ca.pem",
        cert=directory / "server.pem",
        key=directory / "server.key",
        other_ca=directory / "other-ca.pem",
    )
    files.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    files.other_ca.write_bytes(other_cert.public_bytes(serialization.Encoding.PEM))
    files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files.key.write_bytes(_pem_key(key))
    for path in (files.ca, files.cert, files.key, files.other_ca):
        path.chmod(0o644 if path != files.key else 0o600)
        _give_to_rabbitmq(path)
    return files


def _give_to_rabbitmq(path: Path) -> None:
    if os.geteuid() == 0:
        rabbit = pwd.getpwnam("rabbitmq")
        os.chown(path, rabbit.pw_uid, rabbit.pw_gid)


# --- a broker node of the test run's own ----------------------------------------------------
class PrivateBroker:
    """A RabbitMQ node of this test run's own, for the tests that stop the broker or need
    a TLS listener: they must not pull the machine's broker from under the other tests.

    It is a second node of the installed RabbitMQ (``rabbitmq-server -detached`` with its
    own node name, data directory, config and ports, all on 127.0.0.1), with a plain AMQP
    listener and a TLS listener whose certificate a CA made here signed. ``stop`` stops
    the whole node, as an operator's restart does; ``start`` brings it back on the same
    ports with its durable exchanges and queues. ``close`` stops it and removes its files.
    """

    def __init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="herald-rabbitmq-"))
        self.directory.chmod(0o755)
        _give_to_rabbitmq(self.directory)
        self.node = f"herald-test-{os.getpid()}-{secrets.token_hex(3)}@localhost"
        self.port = free_port()
        self.tls_port = free_port()
        self.dist_port = free_port()
        self.tls = make_tls_files(self.directory)
        config = self.directory / "rabbitmq.conf"
        config.write_text(
            f"listeners.tcp.local = {HOST}:{self.port}\n"
            f"listeners.ssl.local = {HOST}:{self.tls_port}\n"
            f"ssl_options.cacertfile = {self.tls.ca}\n"
            f"ssl_options.certfile = {self.tls.cert}\n"
            f"ssl_options.keyfile = {self.tls.key}\n"
            "ssl_options.verify = verify_none\n"
            "ssl_options.fail_if_no_peer_cert = false\n"
        )
        plugins = self.directory / "enabled_plugins"
        plugins.write_text("[].\n")
        for path in (config, plugins):
            path.chmod(0o644)
            _give_to_rabbitmq(path)

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{HOST}:{self.port}/"

    def _env(self) -> dict[str, str]:
        d = self.directory
        return {
            **os.environ,
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_IP_ADDRESS": HOST,
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_CONFIG_FILE": str(d / "rabbitmq.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(d / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(d / "mnesia"),
            "RABBITMQ_LOG_BASE": str(d / "log"),
            "RABBITMQ_PID_FILE": str(d / "pid"),
        }

    def start(self, *, timeout: float = 90.0) -> None:
        """Start the node; return once it accepts logins on both listeners."""
        server = shutil.which("rabbitmq-server") or shutil.which(
            "rabbitmq-server", path="/usr/sbin:/sbin"
        )
        assert server is not None
        subprocess.run(
            [server, "-detached"],
            env=self._env(),
            cwd=self.directory,
            check=True,
            timeout=30,
            capture_output=True,
        )
        # The listeners open at the end of the boot, once the node is known to epmd
        # (before that, rabbitmqctl cannot reach it); logins work from "startup complete".
        for port in (self.port, self.tls_port):
            if not wait_port(port, timeout=timeout):
                raise RuntimeError(f"{self.node} did not listen on {port}: {self.log()}")
        rabbitmqctl("-n", self.node, "await_startup", timeout=timeout)

    def stop(self, *, timeout: float = 60.0) -> None:
        """Stop the whole node (the Erlang VM exits); the listeners refuse from then on."""
        rabbitmqctl("-n", self.node, "stop", timeout=timeout)
        for port in (self.port, self.tls_port):
            if not wait_port(port, open_=False, timeout=timeout):
                raise RuntimeError(f"{self.node} still listens on {port} after stop")

    async def bounce(self, *, down_seconds: float) -> float:
        """Stop the node, keep it down ``down_seconds``, start it again; return the outage."""
        t0 = time.monotonic()
        try:
            await asyncio.to_thread(self.stop)
            await asyncio.sleep(down_seconds)
        finally:
            await asyncio.to_thread(self.start)
        return time.monotonic() - t0

    def log(self) -> str:
        logs = sorted((self.directory / "log").glob("*.log"))
        return "\n".join(path.read_text(errors="replace")[-2000:] for path in logs)

    def close(self) -> None:
        try:
            rabbitmqctl("-n", self.node, "stop", timeout=60)
        except (RuntimeError, subprocess.TimeoutExpired):
            # Not reachable (say, it was still booting): end its processes directly.
            self._kill()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _kill(self) -> None:
        mark = f"RABBITMQ_NODENAME={self.node}".encode()
        for environ in Path("/proc").glob("[0-9]*/environ"):
            with contextlib.suppress(OSError):
                if mark in environ.read_bytes().split(b"\0"):
                    os.kill(int(environ.parent.name), signal.SIGKILL)


# --- reading what arrived -------------------------------------------------------------------
class Inspector:
    """A test's own AMQP connection: declares exchanges and queues, reads messages back."""

    def __init__(self, connection: AbstractRobustConnection) -> None:
        self.connection = connection

    @classmethod
    async def open(cls, url: str = GUEST_URL) -> Inspector:
        return cls(await aio_pika.connect_robust(url, timeout=10))

    async def close(self) -> None:
        await self.connection.close()

    async def topic(self, exchange: str, *, binding: str = "#", durable: bool = False) -> str:
        """Declare a topic exchange and a queue bound with ``binding``; return the queue name."""
        async with self.connection.channel() as channel:
            ex = await channel.declare_exchange(
                exchange, aio_pika.ExchangeType.TOPIC, durable=durable, robust=False
            )
            queue = await channel.declare_queue(queue_for(exchange), durable=durable, robust=False)
            await queue.bind(ex, binding, robust=False)
        return queue_for(exchange)

    async def delete(self, exchange: str) -> None:
        async with self.connection.channel() as channel:
            await channel.queue_delete(queue_for(exchange))
            await channel.exchange_delete(exchange)

    async def drain(self, queue: str) -> list[AbstractIncomingMessage]:
        """Every message waiting in ``queue`` now, acknowledged."""
        out: list[AbstractIncomingMessage] = []
        async with self.connection.channel() as channel:
            q = await channel.declare_queue(queue, passive=True, robust=False)
            while (message := await q.get(no_ack=True, fail=False)) is not None:
                out.append(message)
        return out

    async def collect(
        self,
        queue: str,
        *,
        until: Any,
        timeout: float = 30.0,
        into: list[AbstractIncomingMessage] | None = None,
    ) -> list[AbstractIncomingMessage]:
        """Drain ``queue`` repeatedly until ``until(messages)`` holds; bounded by ``timeout``."""
        got = into if into is not None else []
        deadline = time.monotonic() + timeout
        while True:
            got.extend(await self.drain(queue))
            if until(got):
                return got
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s; {len(got)} messages read")
            await asyncio.sleep(0.05)


def queue_for(exchange: str) -> str:
    return f"{exchange}.all"
