"""What every destination type declares and does.

A type is one module with one :class:`Adapter` subclass: its config model (the
spec's fields, with sensitive ones marked once), create-time checks, and one
``deliver`` that turns an event into one publish call and the result into a
typed :class:`Result`. Timeouts, cancellation, recording and retries belong to
the engine (``herald.attempt`` and ``herald.dispatch``), never to an adapter.
"""

from __future__ import annotations

import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, field_validator

from herald.egress import EgressPolicy, check_target
from herald.model import Destination, Event, Outcome

if TYPE_CHECKING:
    from herald.config import Settings

MASK = "********"
P = TypeVar("P")


def sensitive(description: str = "") -> Any:
    """Field metadata marking a credential: encrypted at rest, masked on output."""
    return {"sensitive": True, "description": description}


def checked(field: str, check: Callable[[str], object]) -> Any:
    """A validator for the text ``field``: a set value must pass ``check`` (which
    raises ValueError) and is then kept as given.

    Many fields are stored as text but must parse (a key, a header object, an
    endpoint); the parsed form is rebuilt where it is used.
    """

    def validate(cls: type[BaseModel], value: str | None) -> str | None:
        if value is not None:
            check(value)
        return value

    return field_validator(field)(classmethod(validate))


def matching(pattern: re.Pattern[str], message: str) -> Callable[[str], None]:
    """A check for :func:`checked`: the whole value must match ``pattern``."""

    def check(value: str) -> None:
        if not pattern.fullmatch(value):
            raise ValueError(message)

    return check


def host_and_port(
    value: str, schemes: Collection[str], *, expected: str
) -> tuple[str, str, int | None]:
    """``scheme://host[:port]`` and nothing more, as (scheme, host, port).

    ValueError with ``expected`` for another scheme or no host, and saying what
    else is wrong otherwise; an endpoint carries no credentials or path.
    """
    try:
        parts = urlsplit(value)
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in schemes or not parts.hostname:
        raise ValueError(expected)
    if parts.username or parts.password or parts.path not in ("", "/") or parts.query:
        raise ValueError("must be just a host and port, without credentials or a path")
    try:
        port = parts.port
    except ValueError:
        raise ValueError("has an invalid port") from None
    return parts.scheme, parts.hostname, port


def check_http_url(value: str, *, credentials: str = "") -> str:
    """``value`` as an absolute http(s) URL without ``user:pass@``; ValueError otherwise.

    ``credentials`` says where credentials go instead, for the error message.
    """
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an absolute http:// or https:// URL")
    if parts.username or parts.password:
        raise ValueError(f"must not carry credentials{credentials}")
    return value


class DestinationConfig(BaseModel):
    """Base of every type's config model; all spec fields are strings."""

    # hide_input_in_errors: a validation error must never carry a submitted credential.
    model_config = ConfigDict(
        extra="forbid", frozen=True, str_strip_whitespace=False, hide_input_in_errors=True
    )

    endpoint_url: str | None = None
    """Point the type at a compatible service or a local emulator (not in the spec)."""

    @classmethod
    def sensitive_fields(cls) -> frozenset[str]:
        return frozenset(
            name
            for name, info in cls.model_fields.items()
            if isinstance(info.json_schema_extra, dict) and info.json_schema_extra.get("sensitive")
        )

    def split(self) -> tuple[dict[str, Any], dict[str, str]]:
        """(plain fields, credential fields), leaving out unset ones."""
        secret_names = self.sensitive_fields()
        data = self.model_dump(exclude_none=True)
        plain = {k: v for k, v in data.items() if k not in secret_names}
        secrets = {k: str(v) for k, v in data.items() if k in secret_names}
        return plain, secrets

    def target(self) -> tuple[Any, ...]:
        """The fields that say where messages go; a change means re-verification."""
        return tuple(self.model_dump(exclude=set(self.sensitive_fields())).items())


@dataclass(frozen=True, slots=True)
class Result:
    """The typed outcome of one attempt."""

    outcome: Outcome
    status: int | None = None
    error: str | None = None
    excerpt: str | None = None
    retry_after: float | None = None
    """Seconds the receiver asked us to wait (``Retry-After``), if any."""

    @classmethod
    def success(cls, *, status: int | None = None, excerpt: str | None = None) -> Result:
        return cls(Outcome.SUCCESS, status=status, excerpt=excerpt)

    @classmethod
    def retryable(
        cls,
        error: str,
        *,
        status: int | None = None,
        excerpt: str | None = None,
        retry_after: float | None = None,
    ) -> Result:
        return cls(
            Outcome.FAILURE_RETRYABLE,
            status=status,
            error=error,
            excerpt=excerpt,
            retry_after=retry_after,
        )

    @classmethod
    def permanent(
        cls, error: str, *, status: int | None = None, excerpt: str | None = None
    ) -> Result:
        """A failure no retry fixes by itself (bad credentials, missing target).

        It still follows the retry schedule: the target may be fixed meanwhile,
        and nothing disables a destination automatically.
        """
        return cls(Outcome.FAILURE_PERMANENT, status=status, error=error, excerpt=excerpt)


class ShuttingDown(Exception):
    """The adapter closed while an attempt waited for a shared client."""


def masked(text: str, secret: str | None) -> str:
    """Defence in depth: no library message may carry ``secret`` into a record or log."""
    return text.replace(secret, MASK) if secret else text


def describe(exc: BaseException) -> str:
    """``ErrorName: message``, how a failure reads in a delivery record.

    SDKs that keep the service's own text in ``message`` (Azure's, Google's) are
    read from there, without the decoration their ``str()`` adds.
    """
    message = getattr(exc, "message", None)
    text = message if isinstance(message, str) and message else str(exc)
    return f"{type(exc).__name__}: {text.strip()}"


def classify(
    exc: Exception,
    *,
    permanent: tuple[type[BaseException], ...] = (),
    retryable: tuple[type[BaseException], ...] = (),
    secret: str | None = None,
) -> Result:
    """The result of a publish call that raised ``exc``.

    ``permanent`` names an SDK's exceptions no retry fixes by itself (refused
    credentials, a missing target; they still follow the retry schedule),
    ``retryable`` its others. SDKs nest them (a permanent error subclassing the
    SDK's base error), so the most specific class named decides. Otherwise a
    socket error is a retryable ``connection failed`` and a shutdown a retryable
    interruption. ``secret`` (a password) never reaches the text. Anything else
    is re-raised: the engine records it as an adapter bug.
    """
    for cls in type(exc).__mro__:
        if cls in permanent:
            return Result.permanent(masked(describe(exc), secret))
        if cls in retryable:
            return Result.retryable(masked(describe(exc), secret))
    if isinstance(exc, OSError):
        return Result.retryable(masked(f"connection failed: {exc}", secret))
    if isinstance(exc, ShuttingDown):
        return Result.retryable(str(exc))
    raise exc


class PerDestination(Generic[P]):
    """What an adapter derives from a destination's config (parsed headers, keys, a
    broker key) once rather than per attempt; rebuilt when the destination changes
    (its ``updated_at``) or, with ``expires``, once the value's time is up."""

    def __init__(
        self,
        build: Callable[[Destination, Any], P],
        *,
        expires: Callable[[P], float] | None = None,
    ) -> None:
        self._build = build
        self._expires = expires
        self._items: dict[str, tuple[float, P]] = {}

    def get(self, dest: Destination, config: DestinationConfig) -> P:
        item = self._items.get(dest.id)
        if item is not None and item[0] == dest.updated_at and not self._expired(item[1]):
            return item[1]
        value = self._build(dest, config)
        self._items[dest.id] = (dest.updated_at, value)
        return value

    def _expired(self, value: P) -> bool:
        return self._expires is not None and time.time() >= self._expires(value)

    def forget(self, dest_id: str) -> None:
        self._items.pop(dest_id, None)

    def clear(self) -> None:
        self._items.clear()


@dataclass(slots=True)
class AdapterContext:
    """Shared resources and settings handed to every adapter."""

    settings: Settings
    egress: EgressPolicy


class Adapter(ABC):
    """One destination type."""

    type_id: ClassVar[str]
    aliases: ClassVar[tuple[str, ...]] = ()
    config_model: ClassVar[type[DestinationConfig]]

    def __init__(self, ctx: AdapterContext) -> None:
        self.ctx = ctx

    @property
    def timeout(self) -> float:
        """The engine's deadline for one attempt of this type."""
        return self.ctx.settings.delivery.adapter_timeout_seconds

    async def check(self, config: DestinationConfig) -> None:
        """Create-time checks that need I/O (e.g. DNS); raise ValidationError.

        An ``endpoint_url`` is held to the webhook egress policy: whoever may create
        destinations must not be able to point Herald at its own network (the cloud
        metadata address, internal services) unless the operator allows it
        (``security.allow_private_networks`` or ``security.allowed_networks``).
        """
        if config.endpoint_url is not None:
            await check_target(
                config.endpoint_url, self.ctx.egress, field=f"{self.type_id}.endpoint_url"
            )

    @abstractmethod
    async def deliver(self, dest: Destination, config: DestinationConfig, event: Event) -> Result:
        """Publish ``event`` once; return the outcome (never raise for a failed publish)."""

    async def forget(self, dest_id: str) -> None:
        """Drop per-destination state (its config changed or it was deleted)."""
        return

    async def close(self) -> None:
        """Release clients and connections; called once on shutdown."""
        return
