"""Masking secrets in text: a URL's password, and the secrets an operator configured."""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import SplitResult, urlsplit

MASK = "********"


def mask_secrets(value: str) -> str:
    """``value`` with the password of a URL in it replaced by ``********``: the one
    after ``user:`` (``postgresql://user:PASSWORD@host/db``, a proxy's
    ``http://user:PASSWORD@host:port``) and any ``…password=`` query parameter.
    Anything that is not such a URL comes back as it is."""
    try:
        parts = urlsplit(value)
    except ValueError:  # a URL urlsplit cannot read (a bad "[" host): whole, if in doubt
        return MASK if "@" in value or "password" in value.lower() else value
    if not parts.scheme:
        return value
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        user, colon, _ = userinfo.partition(":")
        netloc = f"{user}{colon and ':' + MASK}@{hostport}"
    query = "&".join(
        f"{name}={MASK}" if name.lower().endswith("password") and sep else f"{name}{sep}{v}"
        for name, sep, v in (pair.partition("=") for pair in parts.query.split("&"))
    )
    if (netloc, query) == (parts.netloc, parts.query):
        return value
    return SplitResult(parts.scheme, netloc, parts.path, query, parts.fragment).geturl()


# A URL's password in free text (a library's message quoting a URL): ``scheme://user:…@``.
_URL_PASSWORD = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^\s/?#@:]*:)[^\s/?#@]+@")


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with each of ``secrets`` and any URL's password replaced by ``********``."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, MASK)
    return _URL_PASSWORD.sub(rf"\1{MASK}@", text) if "://" in text else text
