"""An AMQP 1.0 test broker that the real azure-servicebus SDK accepts, on python-qpid-proton.

Just enough of Service Bus, in a thread on 127.0.0.1: anonymous SASL;
claims-based auth on ``$cbs`` (put-token answered by correlation id, 200 for a
SAS token signed by a known key, 401 otherwise); one FIFO per entity; an
attach to an unknown entity refused with ``amqp:not-found``; the SDK's batch
format split into its messages; 16-byte delivery tags towards receivers (the
SDK reads lock tokens as UUIDs); and unsettled dispositions settled with the
outcome echoed (the SDK waits up to 60 s for that otherwise).

Topics as Service Bus addresses them: a sender attaches to the topic's path,
exactly as to a queue's (the SDK's queue and topic senders make the same link);
every message sent to the topic is copied into each of its subscriptions, and a
receiver attaches to ``{topic}/Subscriptions/{subscription}``. Receiving from the
topic itself, or sending to a subscription, is refused with ``amqp:not-allowed``.

``stall_auth`` makes it swallow put-token requests: the handshake never
finishes, which is how a broker that rejects claims-based auth looks to the SDK.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import parse_qsl, quote_plus, urlencode, urlsplit

from proton import (
    Condition,
    Connection,
    Data,
    Delivery,
    Endpoint,
    Event,
    Handler,
    Link,
    Message,
    Receiver,
    Sender,
    Terminus,
    symbol,
    ulong,
)
from proton.reactor import ApplicationEvent, Container, EventInjector

CBS = "$cbs"
BATCH_SECTION = 0x75  # an AMQP data section; the batch format carries one message in each


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def entity_of(address: str | None) -> str:
    """``amqp://host:port/queue`` (or just ``queue``) → ``queue``."""
    if not address:
        return ""
    if "://" in address:
        return urlsplit(address).path.lstrip("/")
    return address


def _signature(uri: str, expiry: str, key: str) -> str:
    signed = f"{quote_plus(uri)}\n{expiry}".encode()
    return base64.b64encode(hmac.new(key.encode(), signed, hashlib.sha256).digest()).decode()


def sas_token(uri: str, key_name: str, key: str, *, ttl: int = 3600) -> str:
    """A SAS token as Service Bus issues them (and as the SDK makes from a key)."""
    expiry = str(int(time.time()) + ttl)
    sig = _signature(uri, expiry, key)
    return "SharedAccessSignature " + urlencode(
        {"sr": uri, "sig": sig, "se": expiry, "skn": key_name}
    )


def sas_ok(token: str, keys: Mapping[str, str]) -> bool:
    """Check a ``SharedAccessSignature sr=…&sig=…&se=…&skn=…`` token against ``keys``."""
    if not token.startswith("SharedAccessSignature "):
        return False
    fields = dict(parse_qsl(token.removeprefix("SharedAccessSignature ")))
    key = keys.get(fields.get("skn", ""))
    if key is None or not {"sr", "sig", "se"} <= fields.keys():
        return False
    expected = _signature(fields["sr"], fields["se"], key)
    return hmac.compare_digest(expected.encode(), fields["sig"].encode())


def split_batch(payload: bytes) -> list[bytes]:
    """The messages inside one transfer: each data section of a batch is an encoded message."""
    data = Data()
    parts: list[bytes] = []
    rest = memoryview(payload)
    while len(rest):
        used = data.decode(bytes(rest))
        data.rewind()
        data.next()
        if data.type() == Data.DESCRIBED:
            data.enter()
            data.next()
            descriptor = data.get_object()
            data.next()
            if descriptor == BATCH_SECTION and data.type() == Data.BINARY:
                parts.append(bytes(data.get_binary()))
            data.exit()
        data.clear()
        rest = rest[used:]
    # A plain message's body is one data section too (the envelope, JSON): a batch is
    # a transfer whose every data section is itself an encoded AMQP message.
    if parts and all(_is_message(p) for p in parts):
        return parts
    return [payload]


def _group_id(raw: bytes) -> str | None:
    msg = Message()
    msg.decode(raw)
    group = msg.group_id
    return group.decode() if isinstance(group, bytes) else group


def _is_message(raw: bytes) -> bool:
    try:
        Message().decode(raw)
    except Exception:
        return False
    return raw[:2] == b"\x00\x53"


@dataclass
class _Lent:
    entity: str
    raw: bytes


class Broker(Handler):
    """Start with ``Broker(entities=["orders"]).start()``; stop with ``stop()``."""

    def __init__(
        self,
        *,
        entities: Iterable[str] = (),
        topics: Mapping[str, Iterable[str]] | None = None,
        keys: Mapping[str, str] | None = None,
        stall_auth: bool = False,
        max_message_size: int = 0,
    ) -> None:
        super().__init__()
        self.port = _free_port()
        self.keys = dict(keys if keys is not None else {"herald": "c2VjcmV0LWtleQ=="})
        self.stall_auth = stall_auth
        self.max_message_size = max_message_size
        """Announced on entity links (0: no limit); the SDK sizes its batches by it."""
        self.transfers = 0
        """Message transfers received on entity links (a batch counts once)."""
        self.transfer_sessions: list[list[str | None]] = []
        """The session id (AMQP ``group-id``) of each message, per transfer received."""
        self._lock = threading.Lock()
        self._queues: dict[str, deque[bytes]] = {name: deque() for name in entities}
        self._topics: dict[str, list[str]] = {}
        """Topic name → the entity paths of its subscriptions (each a FIFO in ``_queues``)."""
        for topic, subscriptions in (topics or {}).items():
            self._topics[topic] = [subscription_path(topic, sub) for sub in subscriptions]
            for path in self._topics[topic]:
                self._queues[path] = deque()
        self._consumers: dict[str, list[Sender]] = {}
        self._lent: dict[Delivery, _Lent] = {}
        self._connections: set[Connection] = set()
        self.auth_requests = 0
        self.refused: list[str] = []
        self.errors: list[str] = []
        """Protocol errors that made the broker drop a connection (e.g. out-of-order transfers)."""
        self._injector = EventInjector()
        self._container = Container(self)
        self._container.selectable(self._injector)
        self._thread = threading.Thread(target=self._container.run, name="sb-broker", daemon=True)
        self._ready = threading.Event()

    # --- test-side API (any thread) ----------------------------------------
    def start(self) -> Broker:
        self._thread.start()
        if not self._ready.wait(5):
            raise RuntimeError("test broker did not start")
        return self

    def stop(self) -> None:
        self._injector.trigger(ApplicationEvent("broker_stop"))
        self._thread.join(10)
        if self._thread.is_alive():
            raise RuntimeError("test broker did not stop")

    @property
    def namespace(self) -> str:
        return f"127.0.0.1:{self.port}"

    def connection_string(self, *, key_name: str = "herald", key: str | None = None) -> str:
        key = key if key is not None else self.keys.get(key_name, "bm8ta2V5")
        return (
            f"Endpoint=sb://{self.namespace};SharedAccessKeyName={key_name};"
            f"SharedAccessKey={key};UseDevelopmentEmulator=true"
        )

    def add_entity(self, name: str) -> None:
        with self._lock:
            self._queues.setdefault(name, deque())

    def stored(self, entity: str) -> list[Message]:
        """What waits in ``entity``'s FIFO, decoded (not consumed)."""
        with self._lock:
            raws = list(self._queues.get(entity, ()))
        out = []
        for raw in raws:
            msg = Message()
            msg.decode(raw)
            out.append(msg)
        return out

    # --- proton events (the container thread) ---------------------------------
    def on_reactor_init(self, event: Event) -> None:
        self._acceptor = self._container.listen(f"127.0.0.1:{self.port}")
        self._ready.set()

    def on_broker_stop(self, event: Event) -> None:
        # Close everything, so the reactor runs out of work and every socket is released.
        self._acceptor.close()
        for conn in self._connections:
            if not conn.state & Endpoint.LOCAL_CLOSED:
                conn.close()
        self._injector.close()
        # A client that never answers our close (it is not reading) would keep its
        # socket open forever: cut the transports shortly after.
        self._container.schedule(0.3, _Reaper(self._connections))

    def on_transport_error(self, event: Event) -> None:
        condition = event.transport.condition if event.transport is not None else None
        self.errors.append(f"{condition.name}: {condition.description}" if condition else "?")

    def on_connection_bound(self, event: Event) -> None:
        assert event.transport is not None
        event.transport.sasl().allowed_mechs("ANONYMOUS")

    def on_connection_remote_open(self, event: Event) -> None:
        conn = event.connection
        if conn is not None and conn.state & Endpoint.LOCAL_UNINIT:
            self._connections.add(conn)
            conn.open()

    def on_session_remote_open(self, event: Event) -> None:
        session = event.session
        if session is not None and session.state & Endpoint.LOCAL_UNINIT:
            session.open()

    def on_link_remote_open(self, event: Event) -> None:
        link = event.link
        if link is None or not link.state & Endpoint.LOCAL_UNINIT:
            return
        name = _entity(link)
        with self._lock:
            known = (
                name == CBS
                or name in self._queues
                or name in self._topics
                or name.endswith("$management")
            )
            subscription = any(name in subs for subs in self._topics.values())
        wrong_way = (
            "a topic is read through one of its subscriptions, not directly"
            if name in self._topics and isinstance(link, Sender)
            else "a subscription only receives what is sent to its topic"
            if subscription and isinstance(link, Receiver)
            else None
        )
        if known and wrong_way is not None:
            self.refused.append(name)
            link.source.type = Terminus.UNSPECIFIED
            link.target.type = Terminus.UNSPECIFIED
            link.open()
            link.condition = Condition("amqp:not-allowed", f"'{name}': {wrong_way}.")
            link.close()
            return
        if not known:
            # Refuse as Service Bus does: answer the attach with null termini, then
            # detach with the error (the SDK raises MessagingEntityNotFoundError).
            self.refused.append(name)
            link.source.type = Terminus.UNSPECIFIED
            link.target.type = Terminus.UNSPECIFIED
            link.open()
            link.condition = Condition(
                "amqp:not-found", f"The messaging entity '{name}' could not be found."
            )
            link.close()
            return
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        link.snd_settle_mode = link.remote_snd_settle_mode
        link.rcv_settle_mode = link.remote_rcv_settle_mode
        if name != CBS and self.max_message_size:
            # As Service Bus does: the message limit, and the batch limit the SDK reads.
            link.max_message_size = self.max_message_size
            link.properties = {
                symbol("com.microsoft:max-message-batch-size"): ulong(self.max_message_size)
            }
        link.open()
        if isinstance(link, Receiver):
            link.flow(100)
        elif name != CBS and isinstance(link, Sender):
            self._consumers.setdefault(name, []).append(link)

    def on_link_remote_close(self, event: Event) -> None:
        link = event.link
        if link is None:
            return
        for consumers in self._consumers.values():
            if isinstance(link, Sender) and link in consumers:
                consumers.remove(link)
        if not link.state & Endpoint.LOCAL_CLOSED:
            link.close()

    def on_session_remote_close(self, event: Event) -> None:
        session = event.session
        if session is not None and not session.state & Endpoint.LOCAL_CLOSED:
            session.close()

    def on_connection_remote_close(self, event: Event) -> None:
        conn = event.connection
        if conn is None:
            return
        for consumers in self._consumers.values():
            consumers[:] = [c for c in consumers if c.connection != conn]
        self._connections.discard(conn)
        if not conn.state & Endpoint.LOCAL_CLOSED:
            conn.close()

    def on_link_flow(self, event: Event) -> None:
        if isinstance(event.link, Sender):
            self._pump(_entity(event.link))

    def on_delivery(self, event: Event) -> None:
        dlv = event.delivery
        if dlv is None:
            return
        link = dlv.link
        if isinstance(link, Receiver):
            self._incoming(link, dlv)
        elif dlv.updated:
            # A receiver settled (or, in rcv-settle-mode second, only decided) a
            # message we lent it: echo the outcome and settle — the SDK waits for that.
            lent = self._lent.pop(dlv, None)
            outcome = dlv.remote_state
            if lent is not None and outcome in (Delivery.RELEASED, Delivery.MODIFIED):
                with self._lock:
                    self._queues[lent.entity].appendleft(lent.raw)
            if not dlv.settled:
                dlv.update(outcome)
                dlv.settle()
            if lent is not None:
                self._pump(lent.entity)

    # --- helpers --------------------------------------------------------------
    def _incoming(self, link: Receiver, dlv: Delivery) -> None:
        if dlv.partial or not dlv.readable:
            return
        payload = link.recv(dlv.pending) or b""
        link.advance()
        if link.state & Endpoint.LOCAL_CLOSED:
            dlv.settle()  # sent on a refused link before our detach arrived
            return
        name = _entity(link)
        if name == CBS:
            self._put_token(link, payload)
        elif self.max_message_size and len(payload) > self.max_message_size:
            dlv.local.condition = Condition(
                "amqp:link:message-size-exceeded",
                f"The message of {len(payload)} bytes exceeds {self.max_message_size} bytes.",
                # Service Bus always sends info; the SDK indexes into it.
                {symbol("com.microsoft:tracking-id"): str(uuid.uuid4())},
            )
            dlv.update(Delivery.REJECTED)
            dlv.settle()
            link.flow(1)
            return
        elif not name.endswith("$management"):  # management is not served
            self.transfers += 1
            messages = split_batch(payload)
            self.transfer_sessions.append([_group_id(raw) for raw in messages])
            with self._lock:
                # A topic copies each message into every subscription (none: dropped).
                targets = self._topics.get(name, [name])
                for target in targets:
                    self._queues[target].extend(messages)
            for target in targets:
                self._pump(target)
        dlv.update(Delivery.ACCEPTED)
        dlv.settle()
        link.flow(1)

    def _put_token(self, link: Link, payload: bytes) -> None:
        request = Message()
        request.decode(payload)
        self.auth_requests += 1
        if self.stall_auth:
            return
        ok = sas_ok(str(request.body), self.keys)
        reply = Message(
            correlation_id=request.id,
            properties={
                "status-code": 200 if ok else 401,
                "status-description": "OK" if ok else "InvalidSignature: the token is not valid",
            },
        )
        for out in _senders(link):
            if _entity(out) == CBS:
                dlv = reply.send(out, tag=uuid.uuid4().bytes)  # type: ignore[arg-type]
                dlv.settle()
                return

    def _pump(self, entity: str) -> None:
        for link in list(self._consumers.get(entity, ())):
            while link.credit > 0:
                with self._lock:
                    queue = self._queues.get(entity)
                    if not queue:
                        return
                    raw = queue.popleft()
                dlv = link.delivery(uuid.uuid4().bytes)  # type: ignore[arg-type]
                link.stream(raw)
                link.advance()
                if link.snd_settle_mode == Link.SND_SETTLED:
                    dlv.settle()
                else:
                    self._lent[dlv] = _Lent(entity, raw)


class _Reaper(Handler):
    def __init__(self, connections: set[Connection]) -> None:
        super().__init__()
        self._connections = connections

    def on_timer_task(self, event: Event) -> None:
        for conn in list(self._connections):
            transport = conn.transport
            if transport is not None:
                transport.close_tail()
                transport.close_head()


def subscription_path(topic: str, subscription: str) -> str:
    """The entity path Service Bus (and the SDK's subscription receiver) uses."""
    return f"{topic}/Subscriptions/{subscription}"


def _entity(link: Link) -> str:
    """The entity a link is attached to (its target if it receives from the peer)."""
    terminus = link.remote_target if isinstance(link, Receiver) else link.remote_source
    return entity_of(terminus.address)


def _senders(link: Link) -> list[Sender]:
    out = []
    peer = link.connection.link_head(Endpoint.LOCAL_ACTIVE)
    while peer is not None:
        if isinstance(peer, Sender):
            out.append(peer)
        peer = peer.next(Endpoint.LOCAL_ACTIVE)
    return out


__all__ = ["Broker", "sas_ok", "sas_token", "split_batch", "subscription_path"]
