"""The checks settings share: each section's base, and the field types that validate
what a value must look like (keys, proxies, origins, logos, colours, addresses)."""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Callable, Collection
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, SecretStr

from herald.crypto import parse_key
from herald.errors import ConfigError


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _every(parse: Callable[[str], object], what: str) -> AfterValidator:
    """One check of the whole tuple, not one per item: per item, pydantic would add the
    item's index to the key the message names."""

    def check(values: tuple[str, ...]) -> tuple[str, ...]:
        for value in values:
            try:
                parse(value)
            except ValueError as exc:
                raise ValueError(f"{value!r} is not {what}") from exc
        return values

    return AfterValidator(check)


def check_key(key: SecretStr, *, where: str = "") -> SecretStr:
    try:
        parse_key(key.get_secret_value())
    except ConfigError as exc:
        raise ValueError(f"{where}{exc.message}") from None
    return key


def check_sqlite_url(value: str) -> str:
    """A ``sqlite:`` URL (the store's or a source's) names a file: three slashes, then a path."""
    if not value.startswith("sqlite:///") or value == "sqlite:///":
        raise ValueError("expected sqlite:///path/to/file.db (three slashes, then a path)")
    return value


def check_database_url(
    value: str, schemes: Collection[str], *, what: str, use: str, addressed: bool = False
) -> str:
    """A database URL (the store's or a source's): ``sqlite:///path``, checked as such,
    or one of ``schemes``; ``addressed``, the server's URL names a host and a database.
    ``what`` and ``use`` word the error: unsupported {what} URL scheme …; use {use}."""
    parts = urlsplit(value)
    if parts.scheme == "sqlite":
        return check_sqlite_url(value)
    if parts.scheme not in schemes:
        raise ValueError(f"unsupported {what} URL scheme {parts.scheme!r}; use {use}")
    if addressed and (not parts.hostname or not parts.path.strip("/")):
        raise ValueError(f"expected {parts.scheme}://user:password@host[:port]/database")
    return value


def _check_proxy(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("expected http://host:port or https://host:port")
    return value


_HOST_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def _check_origin(value: str) -> str:
    """An origin a CSP ``frame-ancestors`` can name: ``scheme://host[:port]`` and
    nothing more (no path, no user, no wildcard, nothing that would break the header)."""
    parts = urlsplit(value)
    port = parts.port  # a bad port raises ValueError
    host = parts.hostname or ""
    if (
        parts.scheme not in ("http", "https")
        or value != f"{parts.scheme}://{parts.netloc}"
        or "@" in parts.netloc
        or port == 0
    ):
        raise ValueError("expected scheme://host[:port]")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not all(_HOST_LABEL.fullmatch(label) for label in host.split(".")):
            raise ValueError("expected scheme://host[:port]") from None
    return value


LOGO_DATA = re.compile(r"data:image/(png|gif|jpeg|webp|svg\+xml);base64,[A-Za-z0-9+/]+={0,2}")
MAX_LOGO_CHARS = 65_536
_ACCENT = re.compile(r"#[0-9a-fA-F]{3}(?:[0-9a-fA-F]{3})?")


def _check_logo(value: str) -> str:
    """A same-origin path or an image ``data:`` URL: what the portal's CSP
    (``img-src 'self' data:``) lets a page load, and nothing that breaks out of it."""
    if len(value) > MAX_LOGO_CHARS:
        raise ValueError(f"must be at most {MAX_LOGO_CHARS} characters")
    same_origin = (
        value.startswith("/")
        and not value.startswith("//")
        and "\\" not in value
        and value.isprintable()
        and " " not in value
    )
    if not same_origin and not LOGO_DATA.fullmatch(value):
        raise ValueError(
            "must be a path on Herald's own origin (/brand/logo.svg) or a"
            " data:image/png|gif|jpeg|webp|svg+xml;base64,… URL; another site's"
            " image is refused by the portal's Content-Security-Policy"
        )
    return value


def _check_accent(value: str) -> str:
    if not _ACCENT.fullmatch(value):
        raise ValueError("must be a colour as #rgb or #rrggbb")
    return value


# As field types the checks run only on a value that is set: ``X | None`` skips None.
LogoUrl = Annotated[str, AfterValidator(_check_logo)]
AccentColor = Annotated[str, AfterValidator(_check_accent)]
TenantName = Annotated[str, Field(min_length=1, max_length=200)]
ProxyUrl = Annotated[str, AfterValidator(_check_proxy)]
EncryptionKey = Annotated[SecretStr, AfterValidator(check_key)]
IpAddresses = Annotated[tuple[str, ...], _every(ipaddress.ip_address, "an IP address")]
Origins = Annotated[tuple[str, ...], _every(_check_origin, "an origin (scheme://host[:port])")]
Networks = Annotated[
    tuple[str, ...],
    _every(functools.partial(ipaddress.ip_network, strict=False), "a CIDR network"),
]
