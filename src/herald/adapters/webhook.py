"""``webhook``: a JSON POST of the envelope, signed per Standard Webhooks.

2xx within the deadline is success; redirects are never followed; a
``Retry-After`` on 429/503 is passed to the engine; the response body is read
up to 1 KiB and the connection is dropped rather than drained past that.

A receiver may also ask for a bearer token from its OAuth2 token server
(``oauth2_*``, :mod:`herald.adapters.oauth2`: a 401 fetches a new token and
repeats the POST once, in the same attempt) and for a client certificate
(``tls_*``, :mod:`herald.adapters.tlsidentity`).
"""

from __future__ import annotations

import asyncio
import functools
import re
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Self

import aiohttp
import orjson
from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic import ValidationError as PydanticError
from pydantic_core import InitErrorDetails, PydanticCustomError

from herald.adapters.base import (
    TARGET,
    AdapterContext,
    DestinationConfig,
    Dial,
    Result,
    check_http_url,
    checked,
    dial,
    masked,
    sensitive,
    submitted,
)
from herald.adapters.httpdelivery import (
    HTTPAdapter,
    Proxy,
    failure,
    json_headers,
    read_body,
    request,
)
from herald.adapters.oauth2 import (
    AUTH_METHODS,
    MAX_TOKEN_RESPONSE,
    Client,
    TokenError,
    Tokens,
    read_token,
    signing_algorithm,
    token_request,
)
from herald.adapters.tlsidentity import (
    MAX_PEM_LENGTH,
    Contexts,
    Identity,
    check_ca,
    check_certificate,
    check_key,
    key_matches,
)
from herald.errors import EgressDenied, ValidationError
from herald.model import Destination, Event, Outcome
from herald.signing import generate_secret, parse_secret, signature_header

# Headers Herald owns: a custom header may not replace them.
RESERVED_HEADERS = frozenset(
    {
        "webhook-id",
        "webhook-timestamp",
        "webhook-signature",
        "content-type",
        "content-length",
        "host",
        "transfer-encoding",
        "connection",
    }
)
# Headers that would change how the request travels or how its body reads, not what it
# says: refused in a change (a stored one is still sent as before).
TRANSPORT_HEADERS = frozenset({"expect", "te", "content-encoding", "keep-alive", "upgrade"})
TRANSPORT_PREFIXES = ("proxy-",)
# RFC 9110 5.5 field-value: visible characters, with spaces and tabs only between them.
# Beyond ASCII a character goes out as UTF-8 (octets of obs-text); a control never does.
_FIELD_VALUE = re.compile(
    r"(?:[^\x00-\x20\x7f-\x9f](?:[^\x00-\x08\x0a-\x1f\x7f-\x9f]*[^\x00-\x20\x7f-\x9f])?)?"
)
_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")

MAX_URL_LENGTH = 2048
MAX_CUSTOM_HEADERS = 32
MAX_CUSTOM_HEADERS_LENGTH = 8192
"""Characters of the ``custom_headers`` JSON text, every name and value in it."""


def parse_custom_headers(value: str) -> dict[str, str]:
    """Decode ``custom_headers``: a JSON object of header names to string values."""
    if len(value) > MAX_CUSTOM_HEADERS_LENGTH:
        raise ValueError(f"must be at most {MAX_CUSTOM_HEADERS_LENGTH} characters")
    try:
        obj = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"must be a JSON-encoded object ({exc})") from exc
    if not isinstance(obj, dict):
        raise ValueError("must be a JSON-encoded object of header names to strings")
    if len(obj) > MAX_CUSTOM_HEADERS:
        raise ValueError(f"holds at most {MAX_CUSTOM_HEADERS} headers")
    headers: dict[str, str] = {}
    for name, val in obj.items():
        if not isinstance(val, str):
            raise ValueError(f"header {name!r} must have a string value")
        if not _TOKEN.match(name):
            raise ValueError(f"{name[:64]!r} is not a valid header name")
        if name.lower() in RESERVED_HEADERS:
            raise ValueError(f"header {name!r} is set by Herald and cannot be overridden")
        if "\r" in val or "\n" in val:
            raise ValueError(f"header {name!r} must not contain line breaks")
        headers[name] = val
    return headers


def header_problem(name: str, value: str) -> str | None:
    """Why a custom header may not be set in a create or change (RFC 9110's rules for
    a field value; a header that steers the transport), or None. Never the value."""
    lowered = name.lower()
    if lowered in TRANSPORT_HEADERS or lowered.startswith(TRANSPORT_PREFIXES):
        return f"header {name!r} controls how the request travels and cannot be set"
    if _FIELD_VALUE.fullmatch(value) is None:
        return (
            f"header {name!r} must be visible characters with spaces or tabs between them"
            " (RFC 9110 field value: no control character, no leading or trailing space)"
        )
    return None


def check_custom_headers(value: str) -> dict[str, str]:
    """``custom_headers`` as a caller may set them: :func:`parse_custom_headers` and
    :func:`header_problem` for each."""
    headers = parse_custom_headers(value)
    for name, val in headers.items():
        if (problem := header_problem(name, val)) is not None:
            raise ValueError(problem)
    return headers


def _check_url(value: str, *, credentials: str) -> str:
    if len(value) > MAX_URL_LENGTH:
        raise ValueError(f"must be at most {MAX_URL_LENGTH} characters")
    return check_http_url(value, credentials=credentials)


def _check_method(value: str) -> None:
    if value not in AUTH_METHODS:
        raise ValueError(f"must be one of {', '.join(AUTH_METHODS)}")


def _check_signing_key(value: str) -> None:
    signing_algorithm(check_key(value))


def _field_problems(problems: list[tuple[str, str | None]]) -> PydanticError:
    """A validation error per named field (``None``: the field is missing), so the API's
    422 names each one rather than the whole config."""
    return PydanticError.from_exception_data(
        "WebhookConfig",
        [
            InitErrorDetails(type="missing", loc=(name,), input=None)
            if message is None
            else InitErrorDetails(
                type=PydanticCustomError("value_error", message), loc=(name,), input=None
            )
            for name, message in problems
        ],
    )


def _text(
    description: str, *, secret: bool = False, limit: int = 1024, multiline: bool = False
) -> Any:
    """A text field; ``multiline`` (a PEM) makes the console's forms edit it in a
    textarea."""
    return Field(
        default=None,
        json_schema_extra={
            **(sensitive(description) if secret else {"description": description}),
            "maxLength": limit,
            **({"multiline": True} if multiline else {}),
        },
    )


OAUTH2_FIELDS = (
    "oauth2_token_url",
    "oauth2_client_id",
    "oauth2_client_secret",
    "oauth2_scope",
    "oauth2_audience",
    "oauth2_auth_method",
    "oauth2_private_key",
    "oauth2_key_id",
)


class WebhookConfig(DestinationConfig):
    url: str = Field(json_schema_extra={**TARGET, "maxLength": MAX_URL_LENGTH})
    # Sensitive: it often carries an Authorization header or an API key.
    custom_headers: str | None = Field(
        default=None,
        json_schema_extra={
            **sensitive(f"JSON object of extra headers, at most {MAX_CUSTOM_HEADERS} of them"),
            "maxLength": MAX_CUSTOM_HEADERS_LENGTH,
            # The console's forms edit it as name/value rows.
            "pairs": True,
        },
    )
    secret: str | None = Field(default=None, json_schema_extra=sensitive("whsec_ signing secret"))
    # OAuth2 client credentials (RFC 6749 4.4): each attempt carries the token server's
    # bearer token. The token URL is a target: the client's credentials go there.
    oauth2_token_url: str | None = Field(
        default=None,
        json_schema_extra={
            **TARGET,
            "description": "OAuth2 token endpoint (https)",
            "maxLength": MAX_URL_LENGTH,
        },
    )
    oauth2_client_id: str | None = _text("OAuth2 client id")
    oauth2_client_secret: str | None = _text("OAuth2 client secret", secret=True)
    oauth2_scope: str | None = _text("OAuth2 scope, sent as scope")
    oauth2_audience: str | None = _text("sent to the token server as audience")
    oauth2_auth_method: str | None = _text(
        "client_secret_basic (default), client_secret_post or private_key_jwt", limit=32
    )
    oauth2_private_key: str | None = _text(
        "PEM private key signing the private_key_jwt assertion",
        secret=True,
        limit=MAX_PEM_LENGTH,
        multiline=True,
    )
    oauth2_key_id: str | None = _text("kid of the private_key_jwt assertion", limit=256)
    # Mutual TLS: the client certificate presented to the receiver, and the CA trusted
    # for the receiver's certificate instead of the system's.
    tls_client_certificate: str | None = _text(
        "PEM client certificate (chain, the leaf first)", limit=MAX_PEM_LENGTH, multiline=True
    )
    tls_client_key: str | None = _text(
        "PEM private key of tls_client_certificate",
        secret=True,
        limit=MAX_PEM_LENGTH,
        multiline=True,
    )
    tls_ca_certificate: str | None = _text(
        "PEM CA certificate(s) trusted for the receiver instead of the system's",
        limit=MAX_PEM_LENGTH,
        multiline=True,
    )

    # Accepted (and a target, docs/security.md) but never dialled: ``url`` is the receiver.
    unused_fields: ClassVar[frozenset[str]] = frozenset({"endpoint_url"})

    # A new URL left without a secret gets a fresh one: the old one would make it a
    # signing oracle (docs/security.md).
    renewed: ClassVar[Mapping[str, Callable[[], str]]] = {"secret": generate_secret}

    _url = checked("url", functools.partial(_check_url, credentials="; use custom_headers"))
    _token_url = checked(
        "oauth2_token_url", functools.partial(_check_url, credentials="; use oauth2_client_id")
    )
    _method = checked("oauth2_auth_method", _check_method)
    _signing_key = checked("oauth2_private_key", _check_signing_key)
    _client_key = checked("tls_client_key", check_key)
    _ca = checked("tls_ca_certificate", check_ca)

    @field_validator("tls_client_certificate")
    @classmethod
    def _certificate(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None:
            # A stored certificate that has expired since is still read (and refused by
            # the receiver); a new one must be valid now.
            check_certificate(value) if submitted(info) else check_ca(value)
        return value

    @model_validator(mode="after")
    def _together(self, info: ValidationInfo) -> Self:
        problems = self.oauth2_problems(submitted(info)) + self.tls_problems()
        if problems:
            raise _field_problems(problems)
        return self

    def oauth2_problems(self, new: bool) -> list[tuple[str, str | None]]:
        """The ``oauth2_*`` fields that are missing or out of place (None: missing)."""
        if all(getattr(self, name) is None for name in OAUTH2_FIELDS):
            return []
        problems: list[tuple[str, str | None]] = [
            (name, None)
            for name in ("oauth2_token_url", "oauth2_client_id")
            if getattr(self, name) is None
        ]
        jwt = self.oauth2_auth_method == "private_key_jwt"
        needed, unused = (
            ("oauth2_private_key", "oauth2_client_secret")
            if jwt
            else ("oauth2_client_secret", "oauth2_private_key")
        )
        if getattr(self, needed) is None:
            problems.append((needed, None))
        if getattr(self, unused) is not None:
            problems.append(
                (
                    unused,
                    "is not used with oauth2_auth_method"
                    f" {self.oauth2_auth_method or AUTH_METHODS[0]}",
                )
            )
        if not jwt and self.oauth2_key_id is not None:
            problems.append(
                ("oauth2_key_id", "is only used with oauth2_auth_method private_key_jwt")
            )
        if (
            new
            and self.custom_headers
            and any(
                name.lower() == "authorization"
                for name in parse_custom_headers(self.custom_headers)
            )
        ):
            problems.append(
                ("custom_headers", "must not set Authorization: the OAuth2 token is sent there")
            )
        return problems

    def tls_problems(self) -> list[tuple[str, str | None]]:
        """The client certificate and its key go together, and must match."""
        cert, key = self.tls_client_certificate, self.tls_client_key
        if cert is None and key is None:
            return []
        if cert is None:
            return [("tls_client_certificate", None)]
        if key is None:
            return [("tls_client_key", None)]
        if not key_matches(cert, key):
            return [("tls_client_key", "does not match tls_client_certificate's public key")]
        return []

    def oauth2_client(self) -> Client | None:
        """The OAuth2 client these fields make, or None without OAuth2."""
        if self.oauth2_token_url is None or self.oauth2_client_id is None:
            return None
        return Client(
            token_url=self.oauth2_token_url,
            client_id=self.oauth2_client_id,
            auth_method=self.oauth2_auth_method or "client_secret_basic",
            secret=self.oauth2_client_secret,
            private_key=self.oauth2_private_key,
            key_id=self.oauth2_key_id,
            scope=self.oauth2_scope,
            audience=self.oauth2_audience,
        )

    def tls_identity(self) -> Identity | None:
        """The destination's own TLS, or None for the defaults."""
        if self.tls_client_certificate is None and self.tls_ca_certificate is None:
            return None
        return Identity(self.tls_client_certificate, self.tls_client_key, self.tls_ca_certificate)

    @field_validator("custom_headers")
    @classmethod
    def _headers(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None:
            (check_custom_headers if submitted(info) else parse_custom_headers)(value)
        return value

    @field_validator("secret")
    @classmethod
    def _secret(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                parse_secret(value)
            except ValidationError as exc:
                raise ValueError(exc.message) from exc
        return value


@dataclass(frozen=True, slots=True)
class _Prepared:
    url: str
    headers: dict[str, str]
    masked: frozenset[str]
    """The custom headers' names, lower-case: ``custom_headers`` is a credential field,
    so no attempt's record keeps their values."""
    keys: tuple[bytes, ...]
    keys_until: float
    """When the previous secret stops signing (inf when there is none)."""
    oauth2: Client | None
    ssl: ssl.SSLContext | None


class WebhookAdapter(HTTPAdapter[_Prepared]):
    type_id = "webhook"
    config_model = WebhookConfig

    def __init__(self, ctx: AdapterContext) -> None:
        super().__init__(ctx)
        # Read once: the sessions are built for it (unguarded behind a proxy).
        url = ctx.settings.delivery.webhook_proxy
        self._proxy = Proxy.parse(url) if url else None
        self.tokens = Tokens(self._fetch_token)
        self._contexts = Contexts()

    @property
    def proxy(self) -> Proxy | None:
        return self._proxy

    def source_addresses(self) -> Sequence[str | None]:
        return self.ctx.settings.delivery.webhook_source_addresses or (None,)

    def dialled(self, config: DestinationConfig) -> list[Dial]:
        assert isinstance(config, WebhookConfig)
        dials = [*super().dialled(config), dial("url", config.url)]
        if config.oauth2_token_url is not None:
            dials.append(dial("oauth2_token_url", config.oauth2_token_url))
        return dials

    async def check(self, config: DestinationConfig, *, tenant_id: str) -> None:
        assert isinstance(config, WebhookConfig)
        if (problem := self._token_url_problem(config.oauth2_token_url)) is not None:
            raise ValidationError(
                f"webhook.oauth2_token_url: {problem}",
                field="webhook.oauth2_token_url",
                code="invalid_value",
            )
        await super().check(config, tenant_id=tenant_id)

    def _token_url_problem(self, url: str | None) -> str | None:
        # The client's secret travels to the token URL: never in clear, unless the
        # operator allows private networks (tests, a walk-through).
        if url is None or url[:6].lower() == "https:" or self.ctx.egress.allow_private:
            return None
        return "must be an https:// URL (the client's credentials travel there)"

    def prepare(self, dest: Destination, config: WebhookConfig) -> _Prepared:
        headers = json_headers()
        custom = parse_custom_headers(config.custom_headers) if config.custom_headers else {}
        headers.update(custom)
        keys: list[bytes] = []
        if config.secret:
            keys.append(parse_secret(config.secret))
        keys_until = float("inf")
        previous = dest.secrets.get("_previous_secret")
        previous_until = float(dest.config.get("_previous_secret_until", 0))
        if previous and time.time() < previous_until:
            keys.append(parse_secret(previous))
            keys_until = previous_until
        # The bearer token replaces an Authorization header stored before OAuth2 was set.
        client = config.oauth2_client()
        if client is not None:
            for name in [n for n in headers if n.lower() == "authorization"]:
                del headers[name]
        identity = config.tls_identity()
        context = self._contexts.get(dest.id, identity) if identity is not None else None
        masked = frozenset(name.lower() for name in custom)
        return _Prepared(config.url, headers, masked, tuple(keys), keys_until, client, context)

    def expires(self, prepared: _Prepared) -> float:
        return prepared.keys_until

    async def publish(self, dest: Destination, config: DestinationConfig, event: Event) -> Result:
        assert isinstance(config, WebhookConfig)
        prep = self.prepared.get(dest, config)
        body = event.envelope()
        timestamp = int(time.time())
        headers = dict(prep.headers)
        headers["webhook-id"] = event.id
        headers["webhook-timestamp"] = str(timestamp)
        if prep.keys:
            headers["webhook-signature"] = signature_header(prep.keys, event.id, timestamp, body)
        if event.traceparent is not None:
            # The event's trace context wins over a custom header of that name, in any case.
            for name in [n for n in headers if n.lower() == "traceparent"]:
                del headers[name]
            headers["traceparent"] = event.traceparent
        if prep.oauth2 is None:
            return await self.send(
                prep.url, body=body, headers=headers, ssl=prep.ssl, masked=prep.masked
            )
        try:
            return await self._send_with_token(dest.id, prep, body=body, headers=headers)
        except TokenError as exc:
            message = masked(exc.message, prep.oauth2.secret)
            return Result.permanent(message) if exc.permanent else Result.retryable(message)

    async def _send_with_token(
        self, dest_id: str, prep: _Prepared, *, body: bytes, headers: dict[str, str]
    ) -> Result:
        """The POST with the bearer token; a 401 drops it and repeats once with a new one
        (or the one that already replaced it)."""
        assert prep.oauth2 is not None
        token = await self.tokens.get(dest_id, prep.oauth2)
        headers["authorization"] = f"Bearer {token}"
        result = await self.send(
            prep.url, body=body, headers=headers, ssl=prep.ssl, masked=prep.masked
        )
        if result.status != 401:
            return result
        self.tokens.refused(dest_id, token)
        token = await self.tokens.get(dest_id, prep.oauth2)
        headers["authorization"] = f"Bearer {token}"
        return await self.send(
            prep.url, body=body, headers=headers, ssl=prep.ssl, masked=prep.masked
        )

    async def _fetch_token(self, client: Client) -> tuple[str, float]:
        """Ask ``client``'s token server once, through the webhooks' sessions and egress
        guard, bounded by ``delivery.webhook_timeout_seconds`` of its own."""
        if (problem := self._token_url_problem(client.token_url)) is not None:
            raise TokenError(problem, permanent=True)
        body, headers = token_request(client)
        try:
            async with (
                asyncio.timeout(self.timeout),
                request(self.route(), client.token_url, body=body, headers=headers) as resp,
            ):
                status, data = resp.status, await read_body(resp, MAX_TOKEN_RESPONSE)
        except TimeoutError:
            raise TokenError(f"no response within {self.timeout:g} s", permanent=False) from None
        except (EgressDenied, aiohttp.ClientError) as exc:
            failed = failure(exc)
            assert failed is not None
            assert failed.error is not None
            permanent = failed.outcome is Outcome.FAILURE_PERMANENT
            raise TokenError(failed.error, permanent=permanent) from None
        return read_token(status, data, now=time.time())

    async def forget(self, dest_id: str) -> None:
        await super().forget(dest_id)
        self.tokens.forget(dest_id)
        self._contexts.forget(dest_id)

    async def close(self) -> None:
        await self.tokens.close()
        await super().close()
