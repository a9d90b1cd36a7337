"""``webhook``: a JSON POST of the envelope, signed per Standard Webhooks.

2xx within the deadline is success; redirects are never followed; a
``Retry-After`` on 429/503 is passed to the engine; the response body is read
up to 1 KiB and the connection is dropped rather than drained past that.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import Field, field_validator

from herald.adapters.base import (
    AdapterContext,
    DestinationConfig,
    Dial,
    Result,
    check_http_url,
    checked,
    dial,
    sensitive,
)
from herald.adapters.httpdelivery import HTTPAdapter, json_headers
from herald.errors import ValidationError
from herald.model import Destination, Event
from herald.signing import parse_secret, signature_header

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


def _check_url(value: str, *, credentials: str) -> str:
    if len(value) > MAX_URL_LENGTH:
        raise ValueError(f"must be at most {MAX_URL_LENGTH} characters")
    return check_http_url(value, credentials=credentials)


class WebhookConfig(DestinationConfig):
    url: str = Field(json_schema_extra={"maxLength": MAX_URL_LENGTH})
    # Sensitive: it often carries an Authorization header or an API key.
    custom_headers: str | None = Field(
        default=None,
        json_schema_extra={
            **sensitive(f"JSON object of extra headers, at most {MAX_CUSTOM_HEADERS} of them"),
            "maxLength": MAX_CUSTOM_HEADERS_LENGTH,
        },
    )
    secret: str | None = Field(default=None, json_schema_extra=sensitive("whsec_ signing secret"))

    _url = checked("url", functools.partial(_check_url, credentials="; use custom_headers"))
    _headers = checked("custom_headers", parse_custom_headers)

    @field_validator("secret")
    @classmethod
    def _secret(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                parse_secret(value)
            except ValidationError as exc:
                raise ValueError(exc.message) from exc
        return value

    def target(self) -> tuple[Any, ...]:
        return (self.url,)


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


class WebhookAdapter(HTTPAdapter[_Prepared]):
    type_id = "webhook"
    config_model = WebhookConfig

    def __init__(self, ctx: AdapterContext) -> None:
        super().__init__(ctx)
        # Read once: the sessions are built for it (unguarded behind a proxy).
        self._proxy = ctx.settings.delivery.webhook_proxy

    @property
    def proxy(self) -> str | None:
        return self._proxy

    def source_addresses(self) -> Sequence[str | None]:
        return self.ctx.settings.delivery.webhook_source_addresses or (None,)

    def dialled(self, config: DestinationConfig) -> list[Dial]:
        assert isinstance(config, WebhookConfig)
        return [*super().dialled(config), dial("url", config.url)]

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
        masked = frozenset(name.lower() for name in custom)
        return _Prepared(config.url, headers, masked, tuple(keys), keys_until)

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
        return await self.send(prep.url, body=body, headers=headers, masked=prep.masked)
