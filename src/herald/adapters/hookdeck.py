"""``hookdeck`` (spec alias ``gateway``): a signed POST of the envelope to a gateway source.

The source token is base64 of ``id:secret``; it is decoded when the destination
is created or changed, and a token that is not base64 of ``id:…`` is a
validation error (422). Each event is POSTed to
``{endpoint_url, default https://hkdk.events}/{id}`` with
``X-Hookdeck-Signature: v0=<base64 HMAC-SHA256 of the body, keyed with the
whole token>`` and the event metadata as headers. Routing and delivery settings
live in the gateway's own dashboard.

The HTTP side is the webhook's (``herald.adapters.httpdelivery``): 2xx within
``delivery.webhook_timeout_seconds`` is success, redirects are not followed,
``Retry-After`` on 429/503 is honoured, the response excerpt is capped at 1 KiB.
The egress guard applies as to a webhook, at create time and at every send, to
the default gateway URL and to an ``endpoint_url`` alike: a self-hosted gateway
on a private network needs its network in ``security.allowed_networks``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from pydantic import Field

from herald.adapters.base import DestinationConfig, Result, check_http_url, checked, sensitive
from herald.adapters.httpdelivery import HTTPAdapter, json_headers
from herald.model import Destination, Event

__all__ = ["DEFAULT_ENDPOINT", "HookdeckAdapter", "HookdeckConfig", "parse_token", "signature"]

DEFAULT_ENDPOINT = "https://hkdk.events"
_BASE64 = re.compile(r"[A-Za-z0-9+/]+={0,2}", re.ASCII)
# Source ids go into the URL path verbatim, so only path-safe characters are accepted.
_SOURCE_ID = re.compile(r"[A-Za-z0-9_-]{1,128}", re.ASCII)


def parse_token(token: str) -> str:
    """The source id inside a gateway token; ValueError (never echoing the token) if malformed."""
    if _BASE64.fullmatch(token) is None or len(token) % 4 == 1:
        raise ValueError("must be the gateway source token (standard base64 of id:secret)")
    try:
        decoded = base64.b64decode(token + "=" * (-len(token) % 4), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        raise ValueError(
            "must be the gateway source token (standard base64 of id:secret)"
        ) from None
    source_id, sep, secret = decoded.partition(":")
    if not sep or not secret:
        raise ValueError("must decode to id:secret (the gateway source token)")
    if _SOURCE_ID.fullmatch(source_id) is None:
        raise ValueError("must decode to id:secret where id is a gateway source id")
    return source_id


def signature(token: str, body: bytes) -> str:
    """The ``X-Hookdeck-Signature`` value: ``v0=`` + base64 HMAC-SHA256 keyed with the token."""
    digest = hmac.new(token.encode(), body, hashlib.sha256).digest()
    return "v0=" + base64.b64encode(digest).decode()


def check_gateway_url(value: str) -> None:
    """A gateway base URL: the source id is appended to its path."""
    check_http_url(value)
    parts = urlsplit(value)
    if parts.query or parts.fragment:
        raise ValueError("must not carry a query string or fragment")


class HookdeckConfig(DestinationConfig):
    # Required, so a missing token is reported as "gateway.token is required".
    token: str = Field(json_schema_extra=sensitive("gateway source token: base64 of id:secret"))

    _token = checked("token", parse_token)
    _endpoint = checked("endpoint_url", check_gateway_url)

    @property
    def url(self) -> str:
        """Where events go: the gateway base URL and the token's source id."""
        base = (self.endpoint_url or DEFAULT_ENDPOINT).rstrip("/")
        return f"{base}/{parse_token(self.token)}"

    def target(self) -> tuple[Any, ...]:
        # The source id comes from the token, but it says where events go: a token for
        # another source re-verifies; a new secret for the same source does not.
        return (self.url,)


@dataclass(frozen=True, slots=True)
class _Prepared:
    url: str
    token: str


class HookdeckAdapter(HTTPAdapter[_Prepared]):
    type_id = "hookdeck"
    aliases = ("gateway",)
    config_model = HookdeckConfig

    def prepare(self, dest: Destination, config: HookdeckConfig) -> _Prepared:
        return _Prepared(config.url, config.token)

    async def publish(self, dest: Destination, config: DestinationConfig, event: Event) -> Result:
        assert isinstance(config, HookdeckConfig)
        prep = self.prepared.get(dest, config)
        body = event.envelope()
        headers = {
            **json_headers(),
            "x-hookdeck-signature": signature(prep.token, body),
            **event.metadata(),
        }
        return await self.send(prep.url, body=body, headers=headers)
