"""``gcp_pubsub`` (spec alias ``cloudB_pubsub``): one message per event on a Pub/Sub topic.

The message data is the envelope; the event metadata travels as message
attributes. Success is the Publish RPC answering with a message id. For an
ordered destination (``ordering = "key"``) a message carries the event's
ordering key as its ``ordering_key`` (docs/destinations.md, "Ordering per
destination type").

Ordering keys need no "message ordering" switch here: that switch
(``PublisherOptions(enable_message_ordering=True)``) belongs to the library's
high-level batching ``PublisherClient``, which refuses keys without it and, after
a failed publish of a key, pauses that key until ``resume_publish`` is called.
Herald publishes through the GAPIC client's unary Publish RPC, which takes the
key as a plain message field and keeps no per-key state: a failed attempt is
just a failed RPC, and the engine's retry (after every earlier message of the key
ended, by the ordering rule) publishes again with nothing to resume.

Clients: the library's asyncio GAPIC client (``PublisherAsyncClient`` over a
``grpc.aio`` channel), one per (endpoint, credentials) and shared by every
attempt and every destination using them — the project is part of the topic
path, not of the client. Each attempt is one unary Publish RPC with the
library's own retries off (the engine owns retries) and a deadline equal to the
attempt's; concurrent attempts are multiplexed over the channel's HTTP/2
connection, so there is no client-side batching to wait for.

Credentials: ``service_account_json`` (a service-account key, validated when
the destination is created), otherwise Application Default Credentials,
resolved in a worker thread because discovery can probe the metadata server.
Service-account keys sign their own short-lived JWTs, so no token endpoint is
called at publish time.

``endpoint_url``:

- ``host:port`` or ``http://host:port`` — a Pub/Sub emulator or compatible
  server over plain-text gRPC, anonymously (what ``PUBSUB_EMULATOR_HOST``
  does, but per destination: that process-wide variable is ignored);
- ``https://host[:port]`` — a locational or Private Service Connect endpoint,
  over TLS with the destination's credentials.

Egress: a dialled host (the ``endpoint_url``, or ``pubsub.<universe>`` of a key
naming its own universe) is resolved and checked before each attempt and the
channel goes to exactly the address that check pinned: an ``ipv4:``/``ipv6:``
target, with ``grpc.default_authority`` and ``grpc.ssl_target_name_override``
set to the host name so HTTP/2 ``:authority``, JWT audiences and the TLS
certificate check still use the name. gRPC never resolves the name itself. The
pinned address is part of the client's key, so a name that moves to another
permitted address gets a new channel (the old one closes once idle). Google's
own ``pubsub.googleapis.com`` is not a dialled host and is not pinned. The
other addresses the same check permitted (of the pinned one's IP family) follow
in the target's address list, so gRPC falls back to them, never to a lookup.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import orjson
from pydantic import ConfigDict, Field, field_validator

from herald.adapters.base import (
    TARGET,
    DestinationConfig,
    Dial,
    Result,
    ShuttingDown,
    checked,
    dial,
    host_and_port,
    matching,
    sensitive,
)
from herald.adapters.pool import PooledAdapter
from herald.model import Destination, Event, Outcome

# The Google libraries take about 0.3 s to import: they are imported where they are
# used, so a process with no Pub/Sub destination (and every CLI command) never pays.
if TYPE_CHECKING:
    from google.api_core import exceptions as api_exceptions
    from google.pubsub_v1.services.publisher import PublisherAsyncClient

DEFAULT_UNIVERSE = "googleapis.com"
PUBSUB_SCOPES = ("https://www.googleapis.com/auth/pubsub",)
IDLE_CLOSE_SECONDS = 600.0
ADC_TIMEOUT_SECONDS = 15.0
CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
    ("grpc.keepalive_time_ms", 30_000),
)

# Failures no retry fixes by itself: a missing topic, refused credentials or a
# request the service will never accept. They still follow the retry schedule.
PERMANENT_CODES = frozenset(
    {
        "NOT_FOUND",
        "PERMISSION_DENIED",
        "UNAUTHENTICATED",
        "INVALID_ARGUMENT",
        "FAILED_PRECONDITION",
        "UNIMPLEMENTED",
    }
)
"""Names of ``grpc.StatusCode`` members."""

# https://cloud.google.com/resource-manager/docs/creating-managing-projects: 6–30
# characters; legacy domain-scoped projects carry a "domain:" prefix.
_PROJECT = re.compile(r"^(?:[a-z0-9][a-z0-9.-]{0,61}[a-z0-9]:)?[a-z][a-z0-9-]{4,28}[a-z0-9]$")
# https://cloud.google.com/pubsub/docs/create-topic#resource_names
_TOPIC = re.compile(r"^[A-Za-z][A-Za-z0-9\-_.~+%]{2,254}$")
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_DOMAIN = re.compile(rf"(?=.{{1,240}}$){_LABEL}(?:\.{_LABEL})*", re.ASCII)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where the gRPC channel goes: ``target`` is ``host:port``."""

    target: str
    tls: bool


def parse_endpoint(value: str) -> Endpoint:
    """``host:port`` / ``http://host:port`` (plain text) or ``https://host[:port]`` (TLS)."""
    if "://" not in value:
        value = f"http://{value}"
    scheme, host, port = host_and_port(
        value,
        ("http", "https"),
        expected="must be host:port, http://host:port or https://host[:port]",
    )
    tls = scheme == "https"
    if port is None:
        if not tls:
            raise ValueError("needs a port for a plain-text emulator, e.g. 127.0.0.1:8085")
        port = 443
    host = host if ":" not in host else f"[{host}]"
    return Endpoint(f"{host}:{port}", tls)


def load_service_account(value: str) -> dict[str, Any]:
    """Parse and check a service-account key as google-auth loads it.

    google-auth's ``service_account.Credentials.from_service_account_info``
    needs ``client_email``, ``token_uri`` and a PEM RSA ``private_key``;
    ``google.auth.load_credentials_from_dict`` also dispatches on
    ``type == "service_account"``. Messages name fields, never echo values.
    """
    try:
        info = orjson.loads(value)
    except orjson.JSONDecodeError:
        raise ValueError(
            "must be a service account key in JSON (the downloaded key file)"
        ) from None
    if not isinstance(info, dict):
        raise ValueError("must be a JSON object (the downloaded key file)")
    if info.get("type") != "service_account":
        raise ValueError('must be a service account key ("type": "service_account")')
    for name in ("client_email", "private_key", "token_uri"):
        if not isinstance(info.get(name), str) or not info[name]:
            raise ValueError(f"is missing {name}")
    for name in ("project_id", "private_key_id", "universe_domain"):
        if name in info and not isinstance(info[name], str):
            raise ValueError(f"has a {name} that is not a string")
    if "universe_domain" in info and not _DOMAIN.fullmatch(info["universe_domain"]):
        raise ValueError("has a universe_domain that is not a domain name")
    token_uri = urlsplit(info["token_uri"])
    if token_uri.scheme != "https" or not token_uri.hostname:
        raise ValueError("has a token_uri that is not an https:// URL")
    from google.oauth2 import service_account

    try:
        service_account.Credentials.from_service_account_info(info)  # type: ignore[no-untyped-call]
    except Exception:
        raise ValueError("has a private_key that is not a PEM-encoded RSA private key") from None
    return info


class PubSubConfig(DestinationConfig):
    # Never echo a submitted key back in a validation error.
    model_config = ConfigDict(hide_input_in_errors=True)

    project_id: str = Field(json_schema_extra=TARGET)
    topic: str = Field(json_schema_extra=TARGET)
    service_account_json: str | None = Field(
        default=None, json_schema_extra=sensitive("service account key (JSON) with publish rights")
    )

    _project = checked(
        "project_id",
        matching(
            _PROJECT,
            "must be a project id: 6 to 30 lowercase letters, digits and hyphens,"
            " starting with a letter",
        ),
    )

    @field_validator("topic")
    @classmethod
    def _topic(cls, value: str) -> str:
        if value.startswith("projects/"):
            raise ValueError("must be the topic name alone; the project goes in project_id")
        if not _TOPIC.match(value) or value.lower().startswith("goog"):
            raise ValueError(
                "must be a topic name: 3 to 255 of letters, digits and - _ . ~ + %,"
                " starting with a letter and not with goog"
            )
        return value

    _key = checked("service_account_json", load_service_account)
    _endpoint = checked("endpoint_url", parse_endpoint)

    @property
    def topic_path(self) -> str:
        return f"projects/{self.project_id}/topics/{self.topic}"


@dataclass(frozen=True, slots=True)
class _ClientKey:
    endpoint: Endpoint | None
    credentials: str
    """``anonymous``, ``adc`` or a SHA-256 fingerprint of the key (never the key)."""
    address: str | None = None
    """The checked address the channel is pinned to (None: gRPC resolves the host)."""


def pinned_target(
    host_port: str, addresses: Sequence[str] = ()
) -> tuple[str, tuple[tuple[str, Any], ...]]:
    """The gRPC target for ``host_port`` (``host:port``) and the channel options that pin
    it to the checked ``addresses`` (the pinned one first; gRPC tries a list in order,
    so the others of its family follow as fallbacks) while the name stays the
    authority and the TLS name. Unpinned (no addresses, or the host is itself the
    address): the target as it is."""
    host, _, port = host_port.rpartition(":")
    name = host.strip("[]")
    if not addresses or addresses[0] == name:
        return host_port, ()
    v6 = ":" in addresses[0]
    same = [a for a in addresses if (":" in a) == v6]
    if v6:
        target = "ipv6:" + ",".join(f"[{a}]:{port}" for a in same)
    else:
        target = "ipv4:" + ",".join(f"{a}:{port}" for a in same)
    return target, (
        ("grpc.default_authority", host_port),
        ("grpc.ssl_target_name_override", name),
    )


def universe_of(service_account_json: str) -> str:
    """The universe domain a (validated) key publishes in; Google's unless it names one."""
    universe = orjson.loads(service_account_json).get("universe_domain")
    return universe if isinstance(universe, str) and universe else DEFAULT_UNIVERSE


def _client_key(config: PubSubConfig) -> _ClientKey:
    endpoint = parse_endpoint(config.endpoint_url) if config.endpoint_url else None
    if endpoint is not None and not endpoint.tls:
        return _ClientKey(endpoint, "anonymous")
    if config.service_account_json is None:
        return _ClientKey(endpoint, "adc")
    digest = hashlib.sha256(config.service_account_json.encode()).hexdigest()
    return _ClientKey(endpoint, f"sa:{digest}")


async def _open_client(
    key: _ClientKey, service_account_json: str | None, addresses: Sequence[str] = ()
) -> PublisherAsyncClient:
    """A client for ``key``, its channel pinned to the checked ``addresses`` when there
    are any; always with an explicit transport, so no process-wide setting
    (``PUBSUB_EMULATOR_HOST``) can redirect it."""
    import grpc
    from google.auth.credentials import Credentials
    from google.oauth2 import service_account
    from google.pubsub_v1.services.publisher import PublisherAsyncClient
    from google.pubsub_v1.services.publisher.transports import PublisherGrpcAsyncIOTransport

    if key.endpoint is not None and not key.endpoint.tls:
        target, pin = pinned_target(key.endpoint.target, addresses)
        channel = grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS + pin)
        transport = PublisherGrpcAsyncIOTransport(host=key.endpoint.target, channel=channel)
        return PublisherAsyncClient(transport=transport)
    credentials: Credentials
    if service_account_json is not None:
        info = load_service_account(service_account_json)
        credentials = service_account.Credentials.from_service_account_info(  # type: ignore[no-untyped-call]
            info, scopes=PUBSUB_SCOPES
        )
        universe = universe_of(service_account_json)
    else:
        import google.auth

        # Discovery may probe the metadata server: off the loop, and bounded (the
        # thread itself cannot be stopped, but nobody waits for it any longer).
        async with asyncio.timeout(ADC_TIMEOUT_SECONDS):
            credentials, _ = await asyncio.to_thread(google.auth.default, scopes=PUBSUB_SCOPES)
        universe = getattr(credentials, "universe_domain", DEFAULT_UNIVERSE)
    host = key.endpoint.target if key.endpoint is not None else f"pubsub.{universe}:443"
    target, pin = pinned_target(host, addresses)

    def open_channel(_host: str, **kwargs: Any) -> grpc.aio.Channel:
        # The transport's own channel (credentials, scopes, options), to the pinned target.
        kwargs["options"] = [*kwargs.get("options", ()), *pin]
        return PublisherGrpcAsyncIOTransport.create_channel(target, **kwargs)

    transport = PublisherGrpcAsyncIOTransport(
        host=host, credentials=credentials, always_use_jwt_access=True, channel=open_channel
    )
    return PublisherAsyncClient(transport=transport)


def _classify(exc: api_exceptions.GoogleAPICallError) -> Result:
    code = exc.grpc_status_code
    name = code.name if code is not None else type(exc).__name__
    error = f"{name}: {exc.message}"
    if code is not None and code.name in PERMANENT_CODES:
        return Result.permanent(error)
    return Result.retryable(error)


def ordering_key(dest: Destination, event: Event) -> str:
    """The message's ``ordering_key``: the event's key when ``dest`` is ordered, else
    empty (no key). An unordered destination does not send it: Herald gives that
    destination no order to keep, and a key would hold a subscription with message
    ordering to one outstanding batch per key for nothing."""
    if dest.ordering == "key" and event.ordering_key:
        return event.ordering_key
    return ""


class PubSubAdapter(PooledAdapter[_ClientKey, "PublisherAsyncClient"]):
    type_id = "gcp_pubsub"
    aliases = ("cloudB_pubsub",)
    config_model = PubSubConfig
    idle_seconds = IDLE_CLOSE_SECONDS

    async def close_client(self, client: PublisherAsyncClient) -> None:
        await client.transport.close()  # type: ignore[no-untyped-call]

    def dialled(self, config: DestinationConfig) -> list[Dial]:
        """The ``endpoint_url``, else the Pub/Sub host of a key's own universe domain."""
        assert isinstance(config, PubSubConfig)
        if config.endpoint_url is not None:
            return [dial("endpoint_url", parse_endpoint(config.endpoint_url).target)]
        if config.service_account_json is not None:
            universe = universe_of(config.service_account_json)
            if universe != DEFAULT_UNIVERSE:
                return [Dial("service_account_json", f"pubsub.{universe}", 443)]
        return []

    def ambient_credentials(self, config: DestinationConfig) -> str | None:
        assert isinstance(config, PubSubConfig)
        return "service_account_json" if _client_key(config).credentials == "adc" else None

    async def publish(self, dest: Destination, config: DestinationConfig, event: Event) -> Result:
        assert isinstance(config, PubSubConfig)
        from google.api_core import exceptions as api_exceptions
        from google.auth import exceptions as auth_exceptions
        from google.pubsub_v1.types import PubsubMessage

        key = _client_key(config)
        dialled = self.dialled(config)
        # Checked and pinned by deliver(); gRPC connects to that address (the others the
        # same check permitted as fallbacks). The key names the pinned one only, so a
        # round-robin answer does not open a channel per order.
        addresses = self.addresses(dialled[0]) if dialled else []
        if addresses:
            key = dataclasses.replace(key, address=addresses[0])
        message = PubsubMessage(
            data=event.envelope(),
            attributes=event.metadata(),
            ordering_key=ordering_key(dest, event),
        )
        try:
            async with self.clients.use(
                key, lambda: _open_client(key, config.service_account_json, addresses)
            ) as client:
                response = await client.publish(
                    topic=config.topic_path, messages=[message], retry=None, timeout=self.timeout
                )
        except api_exceptions.GoogleAPICallError as exc:
            return _classify(exc)
        except auth_exceptions.DefaultCredentialsError as exc:
            return Result.permanent(f"no Application Default Credentials: {exc}")
        except auth_exceptions.RefreshError as exc:
            # The credentials were refused when exchanged for a token.
            if getattr(exc, "retryable", False):
                return Result.retryable(f"credential refresh failed: {exc}")
            return Result.permanent(f"credentials refused: {exc}")
        except auth_exceptions.TransportError as exc:
            return Result.retryable(f"credential refresh failed: {exc}")
        except ShuttingDown as exc:
            return Result.retryable(str(exc))
        except TimeoutError:
            return Result(
                Outcome.TIMEOUT,
                error="looking up Application Default Credentials did not finish"
                f" within {ADC_TIMEOUT_SECONDS:g} s",
            )
        if not response.message_ids:
            return Result.retryable("publish answered without a message id")
        return Result.success()
