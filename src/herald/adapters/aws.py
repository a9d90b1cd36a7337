"""What the four AWS destination types share: config, clients, credentials, errors.

Each type (``aws_sqs``, ``aws_kinesis``, ``aws_s3``, ``aws_eventbridge``) is one
:class:`AWSAdapter` subclass that names its API call and turns an event into that
call's parameters. This module owns the rest:

- **Clients.** One aiobotocore client per (service, region, credentials,
  endpoint), shared by every destination with that key, created on first use and
  closed on shutdown — or earlier, once no destination uses it any more (so
  rotating credentials does not leak a connection pool per old key). The pool is
  the one every SDK family uses (``herald.adapters.pool``).
- **Credentials.** Explicit ones when the config has them; otherwise the standard
  AWS chain (environment, shared config and credentials files, container or
  instance role), resolved by one shared session.
- **Errors.** Every botocore error becomes a :class:`~herald.adapters.base.Result`:
  throttling, 5xx and transport failures are retryable; access denied, missing
  targets and validation errors are permanent. The provider's error code leads
  the error text (``AWS.SimpleQueueService.NonExistentQueue: …``).

Retries and the attempt deadline belong to the engine, so botocore's own retries
are off and its timeouts only bound a connection that hangs.
"""

from __future__ import annotations

import base64
import functools
import os
import re
from abc import abstractmethod
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Self

import aiohttp
import structlog
from botocore.exceptions import (
    BotoCoreError,
    CapacityNotAvailableError,
    ChecksumError,
    ClientError,
    CredentialRetrievalError,
    HTTPClientError,
    IncompleteReadError,
    MetadataRetrievalError,
    ResponseStreamingError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError
from pydantic import AfterValidator, Field, model_validator

from herald import __version__
from herald.adapters.base import (
    AdapterContext,
    DestinationConfig,
    Result,
    ShuttingDown,
    check_http_url,
    checked,
    classify,
    describe,
    egress_denial,
    sensitive,
)
from herald.adapters.pool import PooledAdapter
from herald.egress import GuardedResolver
from herald.model import Destination, Event

if TYPE_CHECKING:
    from aiobotocore.session import AioSession
    from botocore.loaders import Loader

log = structlog.get_logger("herald.adapters.aws")

DEFAULT_REGION = "us-east-1"
CONNECT_TIMEOUT_SECONDS = 5.0
MAX_ERROR_MESSAGE = 500

# Error codes a later attempt can succeed with unchanged config: throttling and
# transient service faults (the codes the AWS SDKs' standard retry mode retries,
# plus the per-service throttling codes of SQS, Kinesis, S3 and EventBridge).
RETRYABLE_CODES = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottledException",
        "RequestThrottled",
        "AWS.SimpleQueueService.RequestThrottled",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "LimitExceededException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "SlowDown",
        "TransactionInProgressException",
        "PriorRequestNotComplete",
        "KMSThrottlingException",
        "KMS.ThrottlingException",
        "KmsThrottled",
        "RequestTimeout",
        "RequestTimeoutException",
        "InternalError",
        "InternalFailure",
        "InternalException",
        "InternalServerError",
        "InternalServiceError",
        "ServiceUnavailable",
        "ServiceUnavailableException",
        "IDPCommunicationError",
    }
)
# Transport and credential-fetch failures: the network or the metadata service,
# not the destination's config. Other botocore errors (no credentials, no region,
# bad parameters) need a config change.
_RETRYABLE_BOTOCORE = (
    BotoConnectionError,
    HTTPClientError,
    IncompleteReadError,
    ResponseStreamingError,
    ChecksumError,
    CredentialRetrievalError,
    MetadataRetrievalError,
    CapacityNotAvailableError,
)
_RETRYABLE_TRANSPORT = (*_RETRYABLE_BOTOCORE, OSError, aiohttp.ClientError)
_REGION = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?", re.ASCII)
_XML_CODE = re.compile(r"<Code>([^<]{1,200})</Code>")
_XML_MESSAGE = re.compile(r"<Message>([^<]{0,2000})</Message>")


# --- config --------------------------------------------------------------------------
def check_region(value: str) -> str:
    """Validate a region identifier (e.g. ``eu-west-1``)."""
    if not _REGION.fullmatch(value):
        raise ValueError(f"{value!r} is not a region identifier such as us-east-1")
    return value


Region = Annotated[str, AfterValidator(check_region)]
"""A config field holding a region identifier."""


class AWSConfig(DestinationConfig):
    """Base of the AWS types' configs: endpoint check, credentials."""

    credential_fields: ClassVar[tuple[str, str]] = ("key", "secret")
    """The type's names for the access key id and the secret access key."""

    _endpoint = checked("endpoint_url", check_http_url)

    @model_validator(mode="after")
    def _key_with_secret(self) -> Self:
        key, secret = (getattr(self, name) for name in self.credential_fields)
        if (key is None) != (secret is None):
            raise ValueError(
                f"{' and '.join(self.credential_fields)} go together: give both, or neither"
                " to use the standard AWS credential chain"
            )
        return self

    def credentials(self) -> Credentials | None:
        """Explicit credentials, or None for the standard AWS credential chain."""
        key, secret = (getattr(self, name) for name in self.credential_fields)
        if key is None or secret is None:
            return None
        return Credentials(key, secret, getattr(self, "session", None))

    def missing_credentials(self) -> str | None:
        """The key field, when no credentials are given (the standard chain would be asked)."""
        return self.credential_fields[0] if self.credentials() is None else None

    def region_name(self) -> str | None:
        """The region requests are signed for (the ``region`` field of the types that have
        one), or None for the environment's default."""
        region = getattr(self, "region", None)
        return region if isinstance(region, str) else None


class KeySecretConfig(AWSConfig):
    """The ``key`` / ``secret`` / ``session`` credentials of SQS, Kinesis and S3."""

    key: str | None = Field(default=None, json_schema_extra=sensitive("access key id"))
    secret: str | None = Field(default=None, json_schema_extra=sensitive("secret access key"))
    session: str | None = Field(
        default=None, json_schema_extra=sensitive("session token for temporary credentials")
    )

    @model_validator(mode="after")
    def _session_with_key(self) -> KeySecretConfig:
        if self.session is not None and self.key is None:
            raise ValueError("session needs key and secret")
        return self


@dataclass(frozen=True, slots=True)
class Credentials:
    access_key_id: str
    secret_access_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class ClientKey:
    """What makes two destinations share one client."""

    service: str
    region: str
    credentials: Credentials | None
    endpoint_url: str | None


@functools.cache
def shared_loader() -> Loader:
    """One botocore data loader per process: it parses each service model (megabytes
    of JSON for S3) once, however many sessions and config checks ask for it."""
    from botocore.loaders import create_loader

    return create_loader(os.environ.get("AWS_DATA_PATH"))


# --- errors ------------------------------------------------------------------------------
def _shorten(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_ERROR_MESSAGE else text[: MAX_ERROR_MESSAGE - 1] + "…"


def is_retryable_code(code: str, status: int | None = None) -> bool:
    """Whether an AWS error code (and HTTP status) is worth another attempt as is."""
    return code in RETRYABLE_CODES or (status is not None and (status >= 500 or status == 429))


def failure(code: str, message: str, *, status: int | None) -> Result:
    """The result for a provider error ``code`` (``"Code: message"`` as its text)."""
    text = f"{code}: {_shorten(message)}" if message else code
    if is_retryable_code(code, status):
        return Result.retryable(text, status=status)
    return Result.permanent(text, status=status)


def client_error_result(exc: ClientError) -> Result:
    """Classify an error response of an AWS API."""
    response: dict[str, Any] = exc.response
    error = response.get("Error") or {}
    status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
    code = str(error.get("Code") or "")
    message = str(error.get("Message") or "")
    if not code or code.isdigit():
        # botocore falls back to the HTTP status as the code when the body is not in
        # the protocol's format (an XML error from a JSON API, a proxy's page); the
        # real code is often still in there.
        if found := _XML_CODE.search(message):
            code = found.group(1)
            shown = _XML_MESSAGE.search(message)
            message = shown.group(1) if shown else ""
        else:
            code = f"HTTP {status}" if status else "UnknownError"
    return failure(code, message, status=status if isinstance(status, int) else None)


def error_result(exc: Exception) -> Result:
    """Classify anything a publish call raised; never raises itself."""
    if (denied := egress_denial(exc)) is not None:
        return Result.permanent(denied.message)
    if isinstance(exc, ClientError):
        return client_error_result(exc)
    if isinstance(exc, BotoCoreError | OSError | aiohttp.ClientError | ShuttingDown):
        # TimeoutError is an OSError.
        result = classify(exc, permanent=(BotoCoreError,), retryable=_RETRYABLE_TRANSPORT)
        return replace(result, error=_shorten(result.error or ""))
    text = _shorten(describe(exc))
    log.warning("aws_unexpected_error", error=text)
    return Result.retryable(f"unexpected error: {text}")


# --- wire details -----------------------------------------------------------------------
def header_safe(value: str) -> str:
    """A metadata value that travels in an HTTP header: RFC 2047 when not plain ASCII."""
    if value.isascii() and value.isprintable():
        return value
    return "=?UTF-8?B?" + base64.b64encode(value.encode()).decode() + "?="


# --- adapters ---------------------------------------------------------------------------
class AWSAdapter(PooledAdapter[ClientKey, Any]):
    """One AWS destination type: a client key from the config and one API call.

    Clients are shared by every destination with the same key and closed once no
    destination uses them any more (so rotating credentials does not leak a
    connection pool per old key) or on shutdown; never merely for being idle.
    """

    service: ClassVar[str]
    """The botocore service name (``sqs``, ``kinesis``, ``s3``, ``events``)."""
    operation: ClassVar[str]
    """The client method that publishes one event (``send_message`` …)."""
    idle_seconds = None
    # A client for an endpoint_url resolves through the guarded resolver (open_client);
    # AWS's own endpoints are not a tenant's choice and are not guarded.
    resolves_through_guard = True

    def __init_subclass__(cls, *, service: str, operation: str, **kwargs: Any) -> None:
        """``class X(AWSAdapter, service=…, operation=…)``: the one call a type makes.

        The spec's alias of every AWS type is its id with ``cloudA_`` for ``aws_``."""
        super().__init_subclass__(**kwargs)
        cls.service, cls.operation = service, operation
        cls.aliases = ("cloudA_" + cls.type_id.removeprefix("aws_"),)

    def __init__(self, ctx: AdapterContext) -> None:
        super().__init__(ctx)
        self._session: AioSession | None = None
        self._default_region: str | None = None

    @property
    def session(self) -> AioSession:
        """One session for every client, so the credential chain resolves once."""
        if self._session is None:
            # Imported on first use: every CLI command loads the registry, few need a client.
            from aiobotocore.session import AioSession

            self._session = AioSession()
            self._session.register_component("data_loader", shared_loader())
            self._session.user_agent_extra = f"Herald/{__version__}"
        return self._session

    def default_region(self) -> str:
        """The region of the environment or shared config, else us-east-1."""
        if self._default_region is None:
            region = self.session.get_config_variable("region")
            self._default_region = region if isinstance(region, str) and region else DEFAULT_REGION
        return self._default_region

    def ambient_credentials(self, config: DestinationConfig) -> str | None:
        assert isinstance(config, AWSConfig)
        return config.missing_credentials()

    def client_key(self, config: AWSConfig) -> ClientKey:
        """Which shared client serves ``config``."""
        return ClientKey(
            self.service,
            config.region_name() or self.default_region(),
            config.credentials(),
            config.endpoint_url,
        )

    async def open_client(self, key: ClientKey) -> Any:
        from aiobotocore.config import AioConfig

        creds = key.credentials
        kwargs: dict[str, Any] = {}
        if creds is not None:
            kwargs = {
                "aws_access_key_id": creds.access_key_id,
                "aws_secret_access_key": creds.secret_access_key,
                "aws_session_token": creds.session_token,
            }
        config = AioConfig(
            connect_timeout=min(CONNECT_TIMEOUT_SECONDS, self.timeout),
            read_timeout=self.timeout,
            # The engine owns retries and their schedule; one attempt is one request.
            retries={"total_max_attempts": 1, "mode": "standard"},
            max_pool_connections=self.ctx.settings.delivery.max_concurrency,
            tcp_keepalive=True,
            # Loading a service model reads megabytes of JSON: do it off the event loop.
            warm_up_loader_caches=True,
            # Checksums only where the API requires them: S3-compatible services
            # reached through endpoint_url often reject the newer default ones.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            # Compatible services and emulators rarely serve bucket subdomains.
            s3={"addressing_style": "path"} if key.endpoint_url else None,
            # A tenant's endpoint is connected to only at addresses the egress policy
            # permits, checked as resolved (IP literals: checked before each attempt).
            connector_args=(
                {"resolver": GuardedResolver(self.ctx.egress)} if key.endpoint_url else None
            ),
        )
        cm = self.session.create_client(
            key.service,
            region_name=key.region,
            endpoint_url=key.endpoint_url,
            config=config,
            **kwargs,
        )
        return await cm.__aenter__()

    async def close_client(self, client: Any) -> None:
        await client.__aexit__(None, None, None)

    @abstractmethod
    def params(self, dest: Destination, config: Any, event: Event) -> dict[str, Any]:
        """The parameters of :attr:`operation` that publish ``event`` to ``dest``."""

    def outcome(self, response: dict[str, Any]) -> Result:
        """The result of a call that returned: a success, unless the type knows better."""
        return Result.success(status=http_status(response))

    async def publish(self, dest: Destination, config: DestinationConfig, event: Event) -> Result:
        assert isinstance(config, AWSConfig)
        key = self.client_key(config)
        try:
            params = self.params(dest, config, event)
            async with self.clients.use(key, lambda: self.open_client(key), user=dest.id) as client:
                response = await getattr(client, self.operation)(**params)
        except Exception as exc:  # a failed publish is a result, never an exception
            return error_result(exc)
        return self.outcome(response)

    async def forget(self, dest_id: str) -> None:
        self.clients.release(dest_id)


def http_status(response: dict[str, Any]) -> int | None:
    """The HTTP status of a successful botocore response."""
    status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
    return status if isinstance(status, int) else None
