"""What of the settings is secret: the masked view ``check-config`` prints, and the
:class:`Redactor` every recorded attempt's error goes through."""

from __future__ import annotations

import base64
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.parse import unquote, unquote_plus, urlsplit

from herald.config.masks import MASK, mask_secrets, redact
from herald.config.settings import Settings


def _mask_strings(data: Any) -> Any:
    if isinstance(data, str):
        return mask_secrets(data)
    if isinstance(data, dict):
        return {k: _mask_strings(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_mask_strings(v) for v in data]
    return data


def masked(settings: Settings) -> dict[str, Any]:
    """The effective settings as plain data, secrets replaced by ``********``: the
    keys, and the password of every URL (``database.url``, proxies)."""
    out: dict[str, Any] = _mask_strings(settings.model_dump(mode="json"))
    key = settings.security.encryption_key
    out["security"]["encryption_key"] = None if key is None else MASK
    out["security"]["previous_encryption_keys"] = [
        MASK for _ in settings.security.previous_encryption_keys
    ]
    return out


_SHORTEST_SECRET = 4  # shorter values would mask ordinary words, not secrets


def operator_secrets(settings: Settings) -> tuple[str, ...]:
    """Every secret of the operator's that a library message could quote, for
    :class:`Redactor`: the password of every URL in the settings (``database.url``,
    ``delivery.webhook_proxy``, and any URL a section adds, such as an outbox
    source's) as written, percent-decoded and as the Basic credentials sent for it,
    and the encryption keys. A new secret that is not in a URL is added here."""
    found: set[str] = set()
    for value in _strings(settings.model_dump(mode="python")):
        found.update(_url_secrets(value))
    keys = [settings.security.encryption_key, *settings.security.previous_encryption_keys]
    found.update(key.get_secret_value() for key in keys if key is not None)
    # Longest first: a secret that contains another is masked whole.
    return tuple(sorted((s for s in found if len(s) >= _SHORTEST_SECRET), key=len, reverse=True))


def _strings(data: Any) -> Iterator[str]:
    if isinstance(data, str):
        yield data
    elif isinstance(data, dict):
        for value in data.values():
            yield from _strings(value)
    elif isinstance(data, list | tuple):
        for value in data:
            yield from _strings(value)


def _url_secrets(value: str) -> set[str]:
    """The password of the URL ``value`` (userinfo or ``…password=`` parameter), in
    the forms it travels in; nothing when ``value`` is no such URL."""
    try:
        parts = urlsplit(value)
    except ValueError:
        return set()
    if not parts.scheme or not parts.netloc:
        return set()
    out: set[str] = set()
    userinfo, at, _ = parts.netloc.rpartition("@")
    user, colon, password = userinfo.partition(":")
    if at and colon and password:
        plain = f"{unquote(user)}:{unquote(password)}"
        out.update((password, unquote(password), base64.b64encode(plain.encode()).decode()))
    for name, _, raw in (pair.partition("=") for pair in parts.query.split("&")):
        if name.lower().endswith("password") and raw:
            out.update((raw, unquote(raw), unquote_plus(raw)))
    return out


class Redactor:
    """The one masking step every recorded attempt's error and excerpt goes through
    (herald.attempt), and with it every place that shows them: the API, the console,
    the portal, the CLI, the log and the operational events' ``last_error``."""

    __slots__ = ("secrets",)

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self.secrets = tuple(secrets)

    @classmethod
    def of(cls, settings: Settings) -> Redactor:
        return cls(operator_secrets(settings))

    def __call__(self, text: str | None) -> str | None:
        return None if text is None else redact(text, self.secrets)
