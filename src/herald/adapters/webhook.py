"""``webhook``: a JSON POST of the envelope, signed per Standard Webhooks.

2xx within the deadline is success; redirects are never followed; a
``Retry-After`` on 429/503 is passed to the engine; the response body is read
up to 1 KiB and the connection is dropped rather than drained past that.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson
from pydantic import Field, field_validator

from herald import __version__
from herald.adapters.base import Adapter, DestinationConfig, Result, sensitive
from herald.adapters.httpdelivery import TargetCheck, new_session, post
from herald.egress import check_target
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


def parse_custom_headers(value: str) -> dict[str, str]:
    """Decode ``custom_headers``: a JSON object of header names to string values."""
    try:
        obj = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"must be a JSON-encoded object ({exc})") from exc
    if not isinstance(obj, dict):
        raise ValueError("must be a JSON-encoded object of header names to strings")
    headers: dict[str, str] = {}
    for name, val in obj.items():
        if not isinstance(val, str):
            raise ValueError(f"header {name!r} must have a string value")
        if not _TOKEN.match(name):
            raise ValueError(f"{name!r} is not a valid header name")
        if name.lower() in RESERVED_HEADERS:
            raise ValueError(f"header {name!r} is set by Herald and cannot be overridden")
        if "\r" in val or "\n" in val:
            raise ValueError(f"header {name!r} must not contain line breaks")
        headers[name] = val
    return headers


class WebhookConfig(DestinationConfig):
    url: str
    # Sensitive: it often carries an Authorization header or an API key.
    custom_headers: str | None = Field(
        default=None, json_schema_extra=sensitive("JSON object of extra headers")
    )
    secret: str | None = Field(default=None, json_schema_extra=sensitive("whsec_ signing secret"))

    @field_validator("url")
    @classmethod
    def _absolute(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an absolute http:// or https:// URL")
        if parts.username or parts.password:
            raise ValueError("must not carry credentials; use custom_headers")
        return value

    @field_validator("custom_headers")
    @classmethod
    def _headers(cls, value: str | None) -> str | None:
        if value is not None:
            parse_custom_headers(value)
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

    def target(self) -> tuple[Any, ...]:
        return (self.url,)


@dataclass(frozen=True, slots=True)
class _Prepared:
    version: float
    url: str
    headers: dict[str, str]
    keys: tuple[bytes, ...]
    keys_until: float
    """When the previous secret stops signing (inf when there is none)."""


class WebhookAdapter(Adapter):
    type_id = "webhook"
    config_model = WebhookConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._sessions: list[aiohttp.ClientSession] = []
        self._turn = 0
        self._prepared: dict[str, _Prepared] = {}
        self._proxy = self.ctx.settings.delivery.webhook_proxy
        self._targets = TargetCheck(self.ctx.egress)

    @property
    def timeout(self) -> float:
        return self.ctx.settings.delivery.webhook_timeout_seconds

    def session(self) -> aiohttp.ClientSession:
        """A shared client session, created on first use inside the running loop.

        With ``delivery.webhook_source_addresses`` there is one session per
        address and requests take them in turn (fixed egress for allow-lists).
        """
        if not self._sessions:
            settings = self.ctx.settings.delivery
            addresses = settings.webhook_source_addresses or (None,)
            self._sessions = [
                new_session(
                    self.ctx.egress,
                    limit=settings.max_concurrency,
                    connect_timeout=settings.webhook_timeout_seconds,
                    local_address=address,
                    guarded=self._proxy is None,
                )
                for address in addresses
            ]
        self._turn = (self._turn + 1) % len(self._sessions)
        return self._sessions[self._turn]

    async def check(self, config: DestinationConfig) -> None:
        """Refuse, at create time, a URL that resolves to a non-public address."""
        assert isinstance(config, WebhookConfig)
        await super().check(config)
        await check_target(config.url, self.ctx.egress, field="webhook.url")

    def _prepare(self, dest: Destination, config: WebhookConfig) -> _Prepared:
        prepared = self._prepared.get(dest.id)
        now = time.time()
        if (
            prepared is not None
            and prepared.version == dest.updated_at
            and now < prepared.keys_until
        ):
            return prepared
        headers = {"content-type": "application/json", "user-agent": f"Herald/{__version__}"}
        if config.custom_headers:
            headers.update(parse_custom_headers(config.custom_headers))
        keys: list[bytes] = []
        if config.secret:
            keys.append(parse_secret(config.secret))
        keys_until = float("inf")
        previous = dest.secrets.get("_previous_secret")
        previous_until = float(dest.config.get("_previous_secret_until", 0))
        if previous and now < previous_until:
            keys.append(parse_secret(previous))
            keys_until = previous_until
        prepared = _Prepared(dest.updated_at, config.url, headers, tuple(keys), keys_until)
        self._prepared[dest.id] = prepared
        return prepared

    async def deliver(self, dest: Destination, config: DestinationConfig, event: Event) -> Result:
        assert isinstance(config, WebhookConfig)
        prep = self._prepare(dest, config)
        body = event.envelope()
        timestamp = int(time.time())
        headers = dict(prep.headers)
        headers["webhook-id"] = event.id
        headers["webhook-timestamp"] = str(timestamp)
        if prep.keys:
            headers["webhook-signature"] = signature_header(prep.keys, event.id, timestamp, body)
        return await post(
            self.session(),
            prep.url,
            body=body,
            headers=headers,
            egress=self.ctx.egress,
            proxy=self._proxy,
            targets=self._targets,
        )

    async def forget(self, dest_id: str) -> None:
        self._prepared.pop(dest_id, None)

    async def close(self) -> None:
        sessions, self._sessions = self._sessions, []
        for session in sessions:
            await session.close()
