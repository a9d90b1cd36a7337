"""``azure_servicebus`` (alias ``cloudC_servicebus``): one message per event to a queue or topic.

Message body = the envelope, ``application_properties`` = the event metadata,
``message_id`` = the event id (so Service Bus duplicate detection, where
enabled, drops resends), ``content_type`` = ``application/json``, ``subject``
= the event type, and for an ordered destination (``ordering = "key"``)
``session_id`` = the event's ordering key when it has one (docs/destinations.md,
"Ordering per destination type"). Success is the broker accepting the transfer.

Senders: the SDK's asyncio sender (pure-Python AMQP), one per (connection
string, entity, endpoint) and shared by every attempt and destination using
them. It must not send concurrently, so one send is in flight at a time and
the attempts that queued meanwhile go out together as one batch (see
:class:`_Sender`). Opening a sender — TCP, TLS, claims-based auth on
``$cbs``, link attach — and every send are bounded by timeouts here, because
the SDK can wait forever on a handshake a peer never completes. A sender that
failed, timed out or was cancelled is retired so the next attempt reconnects;
senders idle for four minutes are closed before Service Bus detaches idle
links (ten minutes). The SDK's own retries are reduced to one quick reconnect
inside an attempt: the engine owns retries.

``connection_string`` is required here (the spec lists it as optional): it is
the only way Herald can authenticate to Service Bus, and it also names the
namespace. Its ``Endpoint`` is the target — a new key for the same namespace
does not send the destination back to verification, a new namespace does.
``UseDevelopmentEmulator=true`` makes the SDK speak plain AMQP to the
endpoint's host and port (the Service Bus emulator, or a test broker).

``endpoint_url`` (``sb://host[:port]``, ``amqps://host[:port]`` or
``host:port``; default port 5671) routes the AMQP connection through another
address — a gateway or a private endpoint — while tokens are still issued for
the namespace (the SDK's ``custom_endpoint_address``, kept on AMQP over TCP;
WebSockets are not offered). Through a custom endpoint the SDK reports refused
credentials as a connection error, so they are retryable there.

Egress: the dialled host (``endpoint_url`` when set, else the connection
string's ``Endpoint``) is resolved and checked before each attempt, and the SDK
connects to exactly the address that check pinned: it is handed as the SDK's
``custom_endpoint_address`` (AMQP over TCP), while the AMQP ``hostname``, the
token audiences and the namespace stay the connection string's, and TLS checks
the certificate against the dialled host name (an ``ssl.SSLContext`` that
ignores the address it is asked to verify and uses the name). The SDK never
resolves the name itself. The pinned address is part of the sender's key.
The SDK takes one address, so there is no fallback to a name's other addresses
within an attempt.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import re
import ssl
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import certifi
from pydantic import ConfigDict, Field, ValidationInfo, field_validator

from herald.adapters.base import (
    TARGET,
    DestinationConfig,
    Dial,
    Result,
    checked,
    classify,
    describe,
    dial,
    host_and_port,
    matching,
    sensitive,
)
from herald.adapters.pool import PooledAdapter
from herald.model import Destination, Event, Outcome

# azure-servicebus takes about 0.2 s to import: it is imported where it is used, so a
# process with no Service Bus destination (and every CLI command) never pays.
if TYPE_CHECKING:
    from azure.servicebus import ServiceBusMessage, ServiceBusMessageBatch
    from azure.servicebus.aio import ServiceBusClient, ServiceBusSender

OPEN_TIMEOUT_SECONDS = 10.0
"""Upper bound for connect + auth + attach (further capped by the attempt deadline)."""
CLOSE_TIMEOUT_SECONDS = 5.0
IDLE_CLOSE_SECONDS = 240.0
MESSAGE_ID_MAX = 128
SESSION_ID_MAX = 128
AMQPS_PORT = 5671
AMQP_PORT = 5672

# https://learn.microsoft.com/azure/azure-resource-manager/management/resource-name-rules#microsoftservicebus
_ENTITY = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._/-]{0,258}[A-Za-z0-9])?$")


@dataclass(frozen=True, slots=True)
class ConnectionString:
    """The parts of a Service Bus connection string that Herald looks at."""

    namespace: str
    """``host[:port]`` of the ``Endpoint``."""
    entity_path: str | None
    emulator: bool
    host: str
    port: int | None


def parse_connection_string(value: str) -> ConnectionString:
    """Check a connection string as the SDK reads it; messages name keys, never values.

    ``Endpoint=sb://…;SharedAccessKeyName=…;SharedAccessKey=…`` or
    ``Endpoint=sb://…;SharedAccessSignature=…``, keys case-insensitive,
    optionally ``EntityPath`` and ``UseDevelopmentEmulator``.
    """
    pairs = [part.split("=", 1) for part in value.strip().rstrip(";").split(";")]
    if not value.strip() or any(len(p) != 2 or not p[0].strip() for p in pairs):
        raise ValueError("must be Key=Value pairs separated by ';', as the Azure portal shows it")
    fields: dict[str, str] = {}
    for key, val in pairs:
        name = key.strip().lower()
        if name in fields:
            raise ValueError(f"has {key.strip()} twice")
        fields[name] = val.strip()
    endpoint = fields.get("endpoint", "")
    if not endpoint:
        raise ValueError("must contain Endpoint=sb://<namespace>.servicebus.windows.net/")
    try:
        _, host, port = host_and_port(endpoint, ("sb",), expected="is not an sb://host/ address")
    except ValueError as exc:
        raise ValueError(f"has an Endpoint that {exc}") from None
    key_name = fields.get("sharedaccesskeyname")
    shared_key = fields.get("sharedaccesskey")
    signature = fields.get("sharedaccesssignature")
    if signature is not None and shared_key is not None:
        raise ValueError("must contain a SharedAccessKey or a SharedAccessSignature, not both")
    if signature is None:
        if not key_name or not shared_key:
            raise ValueError(
                "must contain SharedAccessKeyName and SharedAccessKey (or SharedAccessSignature)"
            )
    elif not signature.startswith("SharedAccessSignature "):
        raise ValueError("has a SharedAccessSignature that is not a SAS token")
    emulator = fields.get("usedevelopmentemulator", "false").lower()
    if emulator not in ("true", "false"):
        raise ValueError("has UseDevelopmentEmulator other than true or false")
    namespace = host if port is None else f"{host}:{port}"
    entity = fields.get("entitypath") or None
    return ConnectionString(namespace, entity, emulator == "true", host, port)


def normalize_endpoint(value: str) -> str:
    """``sb://host[:port]``, ``amqps://host[:port]`` or ``host[:port]`` → ``sb://host[:port]``."""
    if "://" not in value:
        value = f"sb://{value}"
    _, host, port = host_and_port(
        value,
        ("sb", "amqps", "amqp"),
        expected="must be sb://host[:port], amqps://host[:port] or host:port",
    )
    return f"sb://{host}" + (f":{port}" if port is not None else "")


class ServiceBusConfig(DestinationConfig):
    # Never echo a submitted connection string back in a validation error.
    model_config = ConfigDict(hide_input_in_errors=True)

    name: str = Field(json_schema_extra=TARGET)
    connection_string: str = Field(
        json_schema_extra=sensitive("connection string of a policy with Send rights")
    )

    _name = checked(
        "name",
        matching(
            _ENTITY,
            "must be a queue or topic name: 1 to 260 letters, digits, periods, hyphens,"
            " underscores and slashes, starting and ending with a letter or digit",
        ),
    )

    @field_validator("connection_string")
    @classmethod
    def _connection_string(cls, value: str, info: ValidationInfo) -> str:
        parsed = parse_connection_string(value)
        name = info.data.get("name")
        if parsed.entity_path is not None and name is not None and parsed.entity_path != name:
            raise ValueError("has an EntityPath that differs from name; they must match")
        return value

    _endpoint = checked("endpoint_url", normalize_endpoint)

    @property
    def namespace(self) -> str:
        return parse_connection_string(self.connection_string).namespace

    def target(self) -> tuple[Any, ...]:
        """The marked fields and the connection string's namespace: a rotated key is not
        a new target, a key of another namespace is."""
        return (self.namespace, *super().target())


def session_id(dest: Destination, event: Event) -> str | None:
    """The message's ``session_id``: the event's ordering key when ``dest`` is ordered
    and the event has one, else none. Service Bus takes at most 128 characters; a longer
    key goes as its SHA-256 (64 hex digits), still one session per key."""
    key = event.ordering_key
    if dest.ordering != "key" or not key:
        return None
    return key if len(key) <= SESSION_ID_MAX else hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class _SenderKey:
    credentials: str
    """SHA-256 fingerprint of the connection string (never the string)."""
    entity: str
    endpoint: str | None
    address: str
    """Where the connection goes: the pinned address, or the dialled host name."""


class _Sender:
    """One open SDK sender and the attempts waiting to go out on it.

    The SDK's sender is not safe for concurrent sends: interleaved, transfers
    reach the wire out of delivery-id order and the service drops the
    connection (``amqp:session:invalid-field``). So one send is in flight at a
    time, and the attempts that queued up meanwhile go out together as one
    batch (one transfer, one outcome for all of them): a busy destination is
    not held to one message per round trip. A batch holds messages of one
    session only (a partitioned entity refuses a batch that spans sessions): it
    takes every waiting message of the first one's session, and the others wait
    for the next batch, each session's messages in the order they queued.
    """

    def __init__(self, client: ServiceBusClient, sender: ServiceBusSender, timeout: float) -> None:
        self.client = client
        self.sender = sender
        self._timeout = timeout
        self._waiting: list[tuple[ServiceBusMessage, asyncio.Future[None]]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def send(self, message: ServiceBusMessage) -> None:
        """Send ``message`` with whatever else is waiting; raise the send's error."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((message, done))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush(), name="azure_servicebus-send")
        # Cancelling this wait (the attempt's deadline) cancels ``done``: a message not
        # yet taken into a batch is then dropped, one already sent stays sent.
        await done

    async def _flush(self) -> None:
        from azure.servicebus.exceptions import MessageSizeExceededError

        taken: list[asyncio.Future[None]] = []
        try:
            while self._waiting:
                async with asyncio.timeout(self._timeout):
                    batch = await self.sender.create_message_batch()
                payload: ServiceBusMessage | ServiceBusMessageBatch = batch
                taken = []
                session: str | None = None
                kept: list[tuple[ServiceBusMessage, asyncio.Future[None]]] = []
                # No await in this loop: nothing joins ``_waiting`` while it is rebuilt.
                for index, (message, done) in enumerate(self._waiting):
                    if done.done():  # its attempt gave up before it was taken
                        continue
                    if taken and message.session_id != session:
                        kept.append((message, done))  # another session: a later batch
                        continue
                    try:
                        batch.add_message(message)
                    except MessageSizeExceededError:
                        if not taken:
                            # Larger than a batch may be: alone, the link's own limit decides.
                            payload, taken = message, [done]
                        else:
                            kept.append((message, done))
                        kept.extend(self._waiting[index + 1 :])
                        break
                    session = message.session_id
                    taken.append(done)
                self._waiting[:] = kept
                if not taken:
                    continue
                try:
                    async with asyncio.timeout(self._timeout):
                        await self.sender.send_messages(payload, timeout=self._timeout)
                except MessageSizeExceededError as exc:
                    _settle(taken, exc)  # only this payload is too big; the link is fine
                else:
                    _settle(taken, None)
                taken = []
        except Exception as exc:
            # The sender is in doubt: fail all it holds (each attempt then retires it).
            _settle([*taken, *(done for _, done in self._waiting)], exc)
            self._waiting.clear()
        except BaseException:
            for done in [*taken, *(done for _, done in self._waiting)]:
                done.cancel()
            self._waiting.clear()
            raise

    async def close(self) -> None:
        """Stop sending (waiting attempts are cancelled) and close the connection."""
        if self._flusher is not None and not self._flusher.done():
            self._flusher.cancel()
            await asyncio.wait({self._flusher})
        await self.client.close()


def _settle(waiting: list[asyncio.Future[None]], error: Exception | None) -> None:
    for done in waiting:
        if done.done():
            continue
        if error is None:
            done.set_result(None)
        else:
            done.set_exception(error)


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """What the SDK builds for every connection (certifi's roots), built once per
    process instead: loading the roots takes ~50 ms of CPU, so the first call runs
    in a worker thread, off the event loop."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(certifi.where())
    return context


class _NamedTLS(ssl.SSLContext):
    """A client TLS context that verifies the peer as ``name`` (and sends it as SNI),
    whatever host the connection was opened to: the SDK opens it to the pinned
    address and would otherwise check the certificate against that."""

    name: str

    def wrap_bio(
        self,
        incoming: ssl.MemoryBIO,
        outgoing: ssl.MemoryBIO,
        server_side: bool = False,
        server_hostname: str | bytes | None = None,
        session: ssl.SSLSession | None = None,
    ) -> ssl.SSLObject:
        return super().wrap_bio(incoming, outgoing, server_side, self.name, session)


def named_tls_context(name: str, *, cafile: str | None = None) -> ssl.SSLContext:
    """A client TLS context that sends ``name`` as SNI and verifies the certificate
    against it, whatever host the connection is opened to; trusting ``cafile``
    (certifi's roots, as the SDK does, by default). Loading roots takes CPU: build
    it off the event loop."""
    context = _NamedTLS(ssl.PROTOCOL_TLS_CLIENT)
    context.name = name
    context.load_verify_locations(cafile or certifi.where())
    return context


@functools.lru_cache(maxsize=64)
def _named_tls(name: str) -> ssl.SSLContext:
    """:func:`named_tls_context` for ``name``, built once per name."""
    return named_tls_context(name)


class ServiceBusAdapter(PooledAdapter[_SenderKey, _Sender]):
    type_id = "azure_servicebus"
    aliases = ("cloudC_servicebus",)
    config_model = ServiceBusConfig
    idle_seconds = IDLE_CLOSE_SECONDS
    close_timeout = CLOSE_TIMEOUT_SECONDS

    async def close_client(self, client: _Sender) -> None:
        await client.close()

    def dialled(self, config: DestinationConfig) -> list[Dial]:
        """The ``endpoint_url`` when set (the connection goes there), else the connection
        string's ``Endpoint`` (AMQPS 5671; the emulator's plain AMQP 5672)."""
        assert isinstance(config, ServiceBusConfig)
        if config.endpoint_url is not None:
            return [dial("endpoint_url", normalize_endpoint(config.endpoint_url), AMQPS_PORT)]
        parsed = parse_connection_string(config.connection_string)
        port = parsed.port or (AMQP_PORT if parsed.emulator else AMQPS_PORT)
        return [Dial("connection_string", parsed.host, port)]

    @property
    def open_timeout(self) -> float:
        return min(OPEN_TIMEOUT_SECONDS, self.timeout)

    async def _open(self, config: ServiceBusConfig, address: str) -> _Sender:
        from azure.servicebus import TransportType
        from azure.servicebus.aio import ServiceBusClient

        kwargs: dict[str, Any] = {
            # One quick reconnect inside an attempt (a link the service detached
            # while idle); anything longer is the engine's retry schedule.
            "retry_total": 1,
            "retry_backoff_factor": 0.2,
            "retry_backoff_max": 1.0,
            "retry_mode": "fixed",
        }
        target = self.dialled(config)[0]
        if address != target.host:  # pinned: connect there, verify TLS against the name
            host = f"[{address}]" if ":" in address else address
            kwargs["custom_endpoint_address"] = f"sb://{host}:{target.port}"
            kwargs["ssl_context"] = await asyncio.to_thread(_named_tls, target.host)
        else:
            kwargs["ssl_context"] = await asyncio.to_thread(_tls_context)
            if config.endpoint_url is not None:
                kwargs["custom_endpoint_address"] = normalize_endpoint(config.endpoint_url)
        if "custom_endpoint_address" in kwargs:
            # The SDK would switch to AMQP over WebSockets for a custom endpoint.
            kwargs["transport_type"] = TransportType.Amqp
        client = ServiceBusClient.from_connection_string(config.connection_string, **kwargs)
        sender = client.get_queue_sender(queue_name=config.name)
        await _open_bounded(client, sender, self.open_timeout)
        return _Sender(client, sender, self.timeout)

    async def publish(self, dest: Destination, config: DestinationConfig, event: Event) -> Result:
        assert isinstance(config, ServiceBusConfig)
        from azure.servicebus import ServiceBusMessage
        from azure.servicebus.exceptions import (
            MessageSizeExceededError,
            MessagingEntityDisabledError,
            MessagingEntityNotFoundError,
            OperationTimeoutError,
            ServiceBusAuthenticationError,
            ServiceBusAuthorizationError,
            ServiceBusError,
        )

        if len(event.id) > MESSAGE_ID_MAX:
            return Result.permanent(
                f"event id longer than {MESSAGE_ID_MAX} characters cannot be a message id"
            )
        try:
            message = ServiceBusMessage(
                event.envelope(),
                application_properties=event.metadata(),  # type: ignore[arg-type]
                message_id=event.id,
                content_type="application/json",
                subject=event.type,
                session_id=session_id(dest, event),
            )
        except ValueError as exc:
            return Result.permanent(f"cannot be a Service Bus message: {exc}")
        # Checked and pinned by deliver(): the SDK connects to that address.
        address = self.address(self.dialled(config)[0])
        key = _SenderKey(
            hashlib.sha256(config.connection_string.encode()).hexdigest(),
            config.name,
            config.endpoint_url,
            address,
        )
        stage = "connect"
        try:
            async with self.clients.use(key, lambda: self._open(config, address)) as handle:
                stage = "send"
                try:
                    async with asyncio.timeout(self.timeout):
                        await handle.send(message)
                except MessageSizeExceededError:
                    raise  # the link is fine; only this message is too big
                except BaseException:
                    # Timed out, cancelled or failed: the link's state is unknown, so
                    # the next attempt reconnects rather than reusing it.
                    self.clients.retire(key, handle)
                    raise
        except TimeoutError:
            bound = self.open_timeout if stage == "connect" else self.timeout
            what = "connecting and authenticating" if stage == "connect" else "sending"
            return Result(Outcome.TIMEOUT, error=f"{what} did not finish within {bound:g} s")
        except OperationTimeoutError as exc:
            return Result(Outcome.TIMEOUT, error=describe(exc))
        except Exception as exc:  # the SDK's messages name the entity, never the key
            return classify(
                exc,
                permanent=(
                    MessagingEntityNotFoundError,
                    MessagingEntityDisabledError,
                    ServiceBusAuthenticationError,
                    ServiceBusAuthorizationError,
                    MessageSizeExceededError,
                    # The SDK's argument checks: no retry changes the input.
                    ValueError,
                ),
                retryable=(ServiceBusError,),
            )
        return Result.success()


async def _open_bounded(client: ServiceBusClient, sender: ServiceBusSender, timeout: float) -> None:
    """Connect, authenticate and attach ``sender`` within ``timeout``; on any failure
    close everything the attempt opened, bounded and quietly.

    The SDK's close skips a connection whose AMQP session never began (a peer that
    accepted TCP but never answered the protocol header), leaking its socket, and
    forgets that connection once the open is cancelled; so it is picked up — from
    private attributes, looked up defensively — before the open is cancelled.
    """
    opening = asyncio.ensure_future(sender.__aenter__())
    try:
        done, _ = await asyncio.wait({opening}, timeout=timeout)
        if not done:
            raise TimeoutError
        opening.result()  # the SDK's own error, if any
    except BaseException:
        orphan = getattr(getattr(sender, "_handler", None), "_connection", None)
        opening.cancel()
        await asyncio.wait({opening}, timeout=CLOSE_TIMEOUT_SECONDS)
        if opening.done() and not opening.cancelled():
            opening.exception()  # retrieved: it is the error being raised, or moot
        for close in (client.close, getattr(orphan, "close", None)):
            if close is None:
                continue
            try:
                async with asyncio.timeout(CLOSE_TIMEOUT_SECONDS):
                    await close()
            except (TimeoutError, Exception):
                pass
        raise
