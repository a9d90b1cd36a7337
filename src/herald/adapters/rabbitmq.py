"""``rabbitmq`` (spec alias ``amqp_broker``): one message per event to an existing exchange.

The message is the envelope with routing key = event type, headers = the event
metadata (plus ``ordering-key`` when the event has an ordering key, ordered
destination or not: docs/destinations.md, "Ordering per destination type"),
``content_type`` ``application/json``, ``message_id`` = event id and
persistent delivery. The channel is in publisher-confirm mode, so an attempt
succeeds only once the broker has confirmed the message (and, when
``mandatory`` is ``true``, routed it to at least one queue). Herald never
declares anything: the exchange must exist, and publishing needs only the
``write`` permission on it (plus access to the virtual host).

Connections: one aio-pika robust connection per broker identity — host, port,
user, password, vhost, TLS — shared by every destination that uses it, opened
on first use (concurrent attempts share the opening), closed after five idle
minutes and on shutdown (``herald.adapters.pool``). Each exchange gets its own
channel on that connection, because the broker closes a channel on any error
(a missing exchange, a refused permission): one misconfigured destination must
not break the publishes of the others. When the broker goes away the robust
connection reconnects in the background; attempts meanwhile fail fast as
retryable, and the engine's retry schedule carries the events over the outage
without a Herald restart.

Egress: the broker's host is resolved and checked by the egress policy before
each attempt (a pass is remembered for seconds) and the connection goes to the
address that check pinned (if it refuses, the other addresses the same check
permitted, in turn) — aiormq's socket is opened to the IP, never the name, and
TLS still verifies the broker's certificate against the host name (SNI). So a
name that answers a permitted address for the check and a private one a moment
later cannot steer the connection. The pinned address is part of the
connection's key: when the name moves to another permitted address, new
attempts open a connection there, and the old one closes once idle. Its
background reconnects keep to the address it was opened for.

Credentials: ``server_url`` may be ``amqp://user:pass@host:port/vhost``. The
user and password are moved into ``username`` and ``password`` at validation
(an explicit field wins over its counterpart in the URL) and ``server_url`` is
kept without them, so the password lives only in the sensitive ``password``
field: encrypted at rest, masked on output, never logged.
"""

from __future__ import annotations

import asyncio
import hashlib
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import unquote, urlsplit

from pydantic import Field, ValidationInfo, field_validator, model_validator

from herald.adapters.amqp_transport import PinnedTransport, pinned_connection_class
from herald.adapters.base import (
    TARGET,
    AdapterContext,
    DestinationConfig,
    Dial,
    PerDestination,
    Result,
    ShuttingDown,
    checked,
    classify,
    masked,
    sensitive,
)
from herald.adapters.pool import ClientPool, PooledAdapter
from herald.model import VERIFICATION_EVENT_TYPE, Destination, Event

# aio-pika takes about 0.1 s to import: it is imported where it is used, so a process
# with no RabbitMQ destination (and every CLI command) never pays.
if TYPE_CHECKING:
    import aio_pika
    from aio_pika.abc import AbstractExchange, AbstractRobustChannel

__all__ = ["BrokerAddress", "RabbitMQAdapter", "RabbitMQConfig", "parse_server_url"]

CONNECT_TIMEOUT_SECONDS = 5.0
"""Bound on opening a connection (TCP, TLS and AMQP handshakes) and a channel."""
IDLE_CLOSE_SECONDS = 300.0
"""A connection (or channel) no attempt used for this long is closed."""
RECONNECT_INTERVAL_SECONDS = 2.0
"""Pause between the robust connection's reconnect attempts while the broker is away."""
AMQP_PORT = 5672
AMQPS_PORT = 5671
ORDERING_KEY_HEADER = "ordering-key"
"""The header carrying an event's ordering key (issue 25), when it has one."""
_TRUE = frozenset({"true", "on"})
_MAX_SHORTSTR = 255  # AMQP 0-9-1 names (exchange, routing key) are short strings


@dataclass(frozen=True, slots=True)
class BrokerAddress:
    """What ``server_url`` says, parsed."""

    host: str
    port: int | None
    vhost: str
    amqps: bool
    """The URL's scheme is ``amqps://``."""
    username: str | None
    password: str | None
    without_credentials: str
    """The same text with any ``user:pass@`` removed: the form Herald stores."""


def parse_server_url(text: str) -> BrokerAddress:
    """Parse ``host:port`` or ``amqp[s]://[user[:pass]@]host[:port][/vhost]``; ValueError if bad.

    Error messages never repeat the input: it may hold a password.
    """
    if not text or any(c.isspace() for c in text):
        raise ValueError("must be host:port or amqp://user:pass@host:port/vhost, without spaces")
    has_scheme = "://" in text
    parts = urlsplit(text if has_scheme else f"amqp://{text}")
    scheme = parts.scheme.lower()
    if scheme not in ("amqp", "amqps"):
        raise ValueError("must use the amqp:// or amqps:// scheme (or be plain host:port)")
    if parts.query or parts.fragment or "?" in text or "#" in text:
        raise ValueError("must not carry a query string or fragment")
    host = parts.hostname
    if not host:
        raise ValueError("has no host")
    try:
        port = parts.port
    except ValueError:
        raise ValueError("has an invalid port (expected 1-65535)") from None
    if port == 0:
        raise ValueError("has an invalid port (expected 1-65535)")
    path = parts.path
    if not has_scheme and path:
        raise ValueError("host:port form takes no path; use amqp://host:port/vhost for a vhost")
    vhost = unquote(path[1:]) if len(path) > 1 else "/"
    username = unquote(parts.username) if parts.username is not None else None
    password = unquote(parts.password) if parts.password is not None else None
    netloc = parts.netloc
    hostinfo = netloc.rpartition("@")[2]
    stored = text if netloc == hostinfo else text.replace(netloc, hostinfo, 1)
    return BrokerAddress(
        host=host,
        port=port,
        vhost=vhost,
        amqps=scheme == "amqps",
        username=username or None,
        password=password or None,
        without_credentials=stored,
    )


@dataclass(frozen=True, slots=True)
class BrokerKey:
    host: str
    port: int
    vhost: str
    tls: bool
    username: str
    password_sha256: str
    """A digest, so the key can be compared (and shown in a traceback) without the password."""


def _flag(value: str, allowed: frozenset[str]) -> bool:
    """``value`` (case-insensitive) as a boolean, if it is one of ``allowed``."""
    lowered = value.lower()
    if lowered not in allowed:
        raise ValueError(f"must be one of {', '.join(sorted(allowed))}")
    return lowered in _TRUE


def url_credentials(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` with user and password taken out of ``server_url`` into their own
    fields (those given there win)."""
    data = dict(data)
    if not isinstance(data.get("server_url"), str):
        return data
    try:
        address = parse_server_url(data["server_url"])
    except ValueError:
        return data  # the field validator reports it
    data["server_url"] = address.without_credentials
    if data.get("username") is None and address.username is not None:
        data["username"] = address.username
    if data.get("password") is None and address.password is not None:
        data["password"] = address.password
    return data


class RabbitMQConfig(DestinationConfig):
    endpoint_url: str | None = None
    """Refused (``_no_endpoint``): ``server_url`` is the broker, and the target."""
    unused_fields: ClassVar[frozenset[str]] = frozenset({"endpoint_url"})
    server_url: str = Field(json_schema_extra=TARGET)
    exchange: str = Field(json_schema_extra=TARGET)
    tls: str | None = Field(default=None, json_schema_extra=TARGET)
    username: str | None = Field(default=None, validate_default=True)
    password: str | None = Field(
        default=None,
        validate_default=True,
        json_schema_extra=sensitive("broker password (also taken from server_url)"),
    )
    mandatory: str | None = None
    """``true``: an unroutable message is a failed attempt (not in the spec)."""

    @model_validator(mode="before")
    @classmethod
    def _move_url_credentials(cls, data: Any) -> Any:
        return url_credentials(data) if isinstance(data, dict) else data

    @classmethod
    def as_given(cls, raw: Mapping[str, Any]) -> dict[str, Any]:
        # A login in a new server_url is given with it (and wins over the stored one).
        return url_credentials(raw)

    @field_validator("endpoint_url")
    @classmethod
    def _no_endpoint(cls, value: str | None) -> str | None:
        if value is not None:
            raise ValueError("is not used by rabbitmq destinations: server_url is the broker")
        return value

    @field_validator("server_url")
    @classmethod
    def _server_url(cls, value: str) -> str:
        return parse_server_url(value).without_credentials

    @field_validator("exchange")
    @classmethod
    def _exchange(cls, value: str) -> str:
        if not value:
            raise ValueError("must name an existing exchange (the default exchange is not used)")
        if len(value.encode()) > _MAX_SHORTSTR:
            raise ValueError(f"must be at most {_MAX_SHORTSTR} bytes")
        return value

    @field_validator("tls")
    @classmethod
    def _tls(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        on = _flag(value, frozenset({"true", "on", "false"}))
        url = info.data.get("server_url")
        if not on and isinstance(url, str) and parse_server_url(url).amqps:
            raise ValueError("is false but server_url uses amqps://")
        return value

    _mandatory = checked("mandatory", lambda value: _flag(value, frozenset({"true", "false"})))

    @field_validator("username", "password")
    @classmethod
    def _login(cls, value: str | None) -> str | None:
        if value is None:
            raise ValueError("required unless server_url carries it (amqp://user:pass@host:port)")
        if not value:
            raise ValueError("must not be empty")
        return value

    @property
    def use_tls(self) -> bool:
        return parse_server_url(self.server_url).amqps or (
            self.tls is not None and self.tls.lower() in _TRUE
        )

    @property
    def is_mandatory(self) -> bool:
        return self.mandatory is not None and self.mandatory.lower() in _TRUE

    def key(self) -> BrokerKey:
        """The broker identity that decides which shared connection this config uses."""
        address = parse_server_url(self.server_url)
        tls = self.use_tls
        assert self.username is not None
        assert self.password is not None
        return BrokerKey(
            host=address.host,
            port=address.port or (AMQPS_PORT if tls else AMQP_PORT),
            vhost=address.vhost,
            tls=tls,
            username=self.username,
            password_sha256=hashlib.sha256(self.password.encode()).hexdigest(),
        )

    def target(self) -> tuple[Any, ...]:
        """Where messages go: broker, vhost, TLS and exchange — not who sends them."""
        key = self.key()
        return (key.host.lower(), key.port, key.vhost, key.tls, self.exchange)


@dataclass(slots=True)
class _Broker:
    """One robust connection and its publish channels, one per exchange."""

    connection: aio_pika.RobustConnection
    channels: ClientPool[str, tuple[AbstractRobustChannel, AbstractExchange]]

    async def close(self) -> None:
        await self.channels.close()
        await self.connection.close()


@dataclass(frozen=True, slots=True)
class _Prepared:
    key: BrokerKey
    password: str
    exchange: str
    mandatory: bool


class _Refused(Exception):
    """A connection the broker refused, already classified as a Result."""

    def __init__(self, result: Result) -> None:
        super().__init__(result.error)
        self.result = result


def _prepare(dest: Destination, config: RabbitMQConfig) -> _Prepared:
    assert config.password is not None
    return _Prepared(
        key=config.key(),
        password=config.password,
        exchange=config.exchange,
        mandatory=config.is_mandatory,
    )


class RabbitMQAdapter(PooledAdapter[tuple[BrokerKey, str], _Broker]):
    type_id = "rabbitmq"
    aliases = ("amqp_broker",)
    config_model = RabbitMQConfig
    idle_seconds = IDLE_CLOSE_SECONDS

    def __init__(self, ctx: AdapterContext) -> None:
        super().__init__(ctx)
        self._prepared: PerDestination[_Prepared] = PerDestination(_prepare)

    @property
    def connection_count(self) -> int:
        """Open broker connections (for tests and introspection)."""
        return len(self.clients)

    async def close_client(self, client: _Broker) -> None:
        await client.close()

    def dialled(self, config: DestinationConfig) -> list[Dial]:
        """The broker of ``server_url`` (each attempt checks it and connects to the
        address the check pinned)."""
        assert isinstance(config, RabbitMQConfig)
        address = parse_server_url(config.server_url)
        port = address.port or (AMQPS_PORT if config.use_tls else AMQP_PORT)
        return [Dial("server_url", address.host, port)]

    async def publish(self, dest: Destination, config: DestinationConfig, event: Event) -> Result:
        assert isinstance(config, RabbitMQConfig)
        prep = self._prepared.get(dest, config)
        # Checked and pinned by deliver(): the pinned address first, then its fallbacks.
        addresses = self.addresses(self.dialled(config)[0])
        try:
            async with self.clients.use(
                (prep.key, addresses[0]), lambda: self._connect(prep, addresses)
            ) as broker:
                return await self._publish(broker, prep, event)
        except _Refused as exc:
            return exc.result
        except ShuttingDown as exc:
            return Result.retryable(str(exc))

    async def _connect(self, prep: _Prepared, addresses: list[str]) -> _Broker:
        """Open the robust connection for ``prep.key`` to the first of ``addresses`` that
        answers (checked addresses, the pinned one first; or the host name when nothing
        is pinned); _Refused if the broker says no."""
        import aio_pika

        key = prep.key
        context = await asyncio.to_thread(ssl.create_default_context) if key.tls else None
        # The socket goes to the address; TLS checks the broker's name.
        transport = PinnedTransport(addresses, context, key.host if key.tls else None)
        url = aio_pika.connection.make_url(
            host=addresses[0],
            port=key.port,
            login=key.username,
            password=prep.password,
            virtualhost=key.vhost,
            ssl=key.tls,
        )
        bound = min(CONNECT_TIMEOUT_SECONDS, self.timeout)
        connection = pinned_connection_class()(
            url,
            ssl_context=context,
            reconnect_interval=RECONNECT_INTERVAL_SECONDS,
            client_properties={"connection_name": "herald"},
            transport_factory=transport,
        )
        try:
            await connection.connect(timeout=bound)
        except BaseException as exc:
            await connection.close()
            if isinstance(exc, Exception):
                raise _Refused(_connect_failure(exc, key, prep.password, bound)) from exc
            raise
        return _Broker(
            connection,
            ClientPool(
                name="rabbitmq-channel",
                close=_close_channel,
                close_timeout=self.close_timeout,
                idle_seconds=self.idle_seconds,
            ),
        )

    async def _publish(self, broker: _Broker, prep: _Prepared, event: Event) -> Result:
        import aio_pika
        import aiormq

        key = prep.key
        if not broker.connection.connected.is_set():
            return Result.retryable(
                f"not connected to the broker at {key.host}:{key.port}; reconnecting"
            )
        # A verification ping proves the broker, credentials and exchange; whether a queue
        # is bound for its routing key says nothing about the destination.
        mandatory = prep.mandatory and event.type != VERIFICATION_EVENT_TYPE
        headers: dict[str, Any] = dict(event.metadata())
        if event.ordering_key is not None:
            headers[ORDERING_KEY_HEADER] = event.ordering_key
        message = aio_pika.Message(
            event.envelope(),
            headers=headers,
            content_type="application/json",
            message_id=event.id,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        )
        try:
            async with broker.channels.use(
                prep.exchange, lambda: _open_channel(broker.connection, prep.exchange)
            ) as (channel, exchange):
                if channel.is_closed:
                    return Result.retryable("the channel is being reopened; not published")
                await exchange.publish(message, event.type, mandatory=mandatory)
        except aiormq.exceptions.PublishError as exc:
            return Result.permanent(
                f"unroutable: no queue is bound to exchange {prep.exchange!r} for routing key "
                f"{event.type!r} (mandatory is true; broker said {exc.args[0]})"
            )
        except aiormq.exceptions.DeliveryError as exc:
            return Result.retryable(f"the broker refused the message ({exc})")
        except aiormq.exceptions.ChannelNotFoundEntity:
            return Result.permanent(
                f"exchange {prep.exchange!r} does not exist in vhost {key.vhost!r};"
                " Herald never declares it"
            )
        except aiormq.exceptions.ChannelAccessRefused as exc:
            return Result.permanent(
                masked(
                    f"access refused: user {key.username!r} may not publish to exchange"
                    f" {prep.exchange!r} ({exc.args[0] if exc.args else exc})",
                    prep.password,
                )
            )
        except TimeoutError:
            return Result.retryable(f"no channel within {CONNECT_TIMEOUT_SECONDS:g} s")
        except Exception as exc:
            return classify(
                exc,
                retryable=(aiormq.exceptions.AMQPError, aiormq.exceptions.ChannelInvalidStateError),
                secret=prep.password,
            )
        return Result.success()

    async def forget(self, dest_id: str) -> None:
        # The shared connection stays for other destinations; an unused one is closed
        # by the pool once idle.
        self._prepared.forget(dest_id)

    async def close(self) -> None:
        await super().close()
        self._prepared.clear()


async def _open_channel(
    connection: aio_pika.RobustConnection, exchange: str
) -> tuple[AbstractRobustChannel, AbstractExchange]:
    """A publisher-confirm channel for ``exchange``, checked to exist (never declared)."""
    channel: AbstractRobustChannel = await connection.channel(
        publisher_confirms=True, on_return_raises=True
    )
    try:
        # Passive: only checks that it exists. robust=False: a reconnect must not re-check
        # it, or one deleted exchange would stall the connection every destination shares.
        found = await channel.declare_exchange(
            exchange, passive=True, robust=False, timeout=CONNECT_TIMEOUT_SECONDS
        )
    except BaseException:
        await channel.close()
        raise
    return channel, found


async def _close_channel(item: tuple[AbstractRobustChannel, AbstractExchange]) -> None:
    await item[0].close()


def _connect_failure(exc: Exception, key: BrokerKey, password: str, bound: float) -> Result:
    import aiormq

    where = f"{'amqps' if key.tls else 'amqp'}://{key.host}:{key.port}"
    if isinstance(exc, TimeoutError):
        return Result.retryable(f"no AMQP connection to {where} within {bound:g} s")
    if isinstance(
        exc, aiormq.exceptions.ProbableAuthenticationError | aiormq.exceptions.AuthenticationError
    ):
        return Result.permanent(
            masked(f"authentication failed for user {key.username!r} at {where}: {exc}", password)
        )
    closed_530 = isinstance(exc, aiormq.exceptions.ConnectionClosed) and exc.args[:1] == (530,)
    refused_open = isinstance(exc, aiormq.exceptions.InvalidFrameError) and (
        "Connection.OpenOk" in str(exc)
    )
    if refused_open or closed_530:
        # RabbitMQ answers connection.open with a close (530 NOT_ALLOWED) when the vhost
        # is missing or the user has no permission on it; aiormq reports that as an
        # unexpected frame.
        return Result.permanent(
            f"the broker at {where} refused virtual host {key.vhost!r} for user"
            f" {key.username!r} (it does not exist or the user has no access to it)"
        )
    text = masked(str(exc), password)
    if _cert_failure(exc):
        return Result.permanent(f"TLS certificate verification failed for {where}: {text}")
    return Result.retryable(f"cannot connect to {where}: {text or type(exc).__name__}")


def _cert_failure(exc: BaseException) -> bool:
    """Whether ``exc`` or an error it was raised from is a failed certificate check.

    The chain is walked once per exception: aiormq's errors can chain back to
    themselves (a peer that closes before the protocol header is answered), and
    following such a cycle would spin on the event loop for good.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ssl.SSLCertVerificationError) or (
            "CERTIFICATE_VERIFY_FAILED" in str(current)
        ):
            return True
        current = current.__cause__ or current.__context__
    return False
