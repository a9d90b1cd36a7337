"""What every destination type declares and does.

A type is one module with one :class:`Adapter` subclass: its config model (the
spec's fields, with sensitive ones marked once), the hosts its config makes
Herald dial (``dialled``), whether it falls back to the daemon's own cloud
identity (``ambient_credentials``), and one ``publish`` that turns an event into
one publish call and the result into a typed :class:`Result`. The base holds
every type to the egress policy and the ambient-credential rule, at create time
(``check``) and before every attempt (``deliver``), so a new type cannot forget
them. Timeouts, cancellation, recording and retries belong to the engine
(``herald.attempt`` and ``herald.dispatch``), never to an adapter.
"""

from __future__ import annotations

import re
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Collection, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, NamedTuple, TypeVar, final
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from herald.config import MASK as MASK  # what a masked credential reads as
from herald.config import redact
from herald.egress import EgressPolicy, TargetCheck, check_target, check_url_host
from herald.errors import EgressDenied, ValidationError
from herald.model import Destination, Event, Exchange, Outcome

if TYPE_CHECKING:
    from herald.config import Settings

P = TypeVar("P")


def sensitive(description: str = "") -> Any:
    """Field metadata marking a credential: encrypted at rest, masked on output, and
    never kept for a new target (:meth:`DestinationConfig.target`)."""
    return {"sensitive": True, "description": description}


SUBMITTED: Mapping[str, Any] = {"submitted": True}
"""The validation context of a caller's create or change (``Registry.parse_config``):
rules for new input only (:func:`submitted`) check it; a stored config is read back
without it, so a rule added later never makes a stored destination unreadable."""


def submitted(info: ValidationInfo) -> bool:
    """Whether a validator is checking a caller's input (not a stored config)."""
    return isinstance(info.context, Mapping) and bool(info.context.get("submitted"))


TARGET: Any = {"target": True}
"""Field metadata marking where messages go (a URL, a broker, a queue, a bucket): a
new value is a new target, which is re-verified and must be given its credentials
again (docs/security.md, "A new target gets no old credential")."""


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

    endpoint_url: str | None = Field(default=None, json_schema_extra=TARGET)
    """Point the type at a compatible service or a local emulator (not in the spec)."""

    unused_fields: ClassVar[frozenset[str]] = frozenset()
    """Fields of this base that the type accepts (or refuses) but does nothing with: the
    console's forms leave them out (a webhook has no use for ``endpoint_url``)."""

    renewed: ClassVar[Mapping[str, Callable[[], str]]] = {}
    """Credentials that a new target gets a fresh value of, when the change does not give
    one (the webhook's signing secret); every other credential must be given again."""

    @classmethod
    def marked(cls, mark: str) -> frozenset[str]:
        """The fields whose metadata carries ``mark`` (``sensitive``, ``target``)."""
        return frozenset(
            name
            for name, info in cls.model_fields.items()
            if isinstance(info.json_schema_extra, dict) and info.json_schema_extra.get(mark)
        )

    @classmethod
    def sensitive_fields(cls) -> frozenset[str]:
        return cls.marked("sensitive")

    @classmethod
    def as_given(cls, raw: Mapping[str, Any]) -> dict[str, Any]:
        """The fields a change sets, as the model reads them (a type whose one field
        carries others, as rabbitmq's ``server_url`` carries a login, splits them)."""
        return dict(raw)

    def split(self) -> tuple[dict[str, Any], dict[str, str]]:
        """(plain fields, credential fields), leaving out unset ones."""
        secret_names = self.sensitive_fields()
        data = self.model_dump(exclude_none=True)
        plain = {k: v for k, v in data.items() if k not in secret_names}
        secrets = {k: str(v) for k, v in data.items() if k in secret_names}
        return plain, secrets

    def target(self) -> tuple[Any, ...]:
        """Where messages go: the fields marked :data:`TARGET`, in declaration order. A
        change means re-verification, and that every credential is given again. A type
        that reads part of its target out of a credential (a token's source, a
        connection string's endpoint) or normalises it adds that here."""
        marked = self.marked("target")
        return tuple(getattr(self, name) for name in type(self).model_fields if name in marked)


class Dial(NamedTuple):
    """A host a destination's config makes Herald connect to, and the field naming it."""

    field: str
    host: str
    port: int | None = None

    @property
    def address(self) -> str:
        """``tcp://host[:port]``, the form the egress checks take."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"tcp://{host}" + (f":{self.port}" if self.port is not None else "")


def dial(field: str, address: str, default_port: int | None = None) -> Dial:
    """The host and port of ``address`` (a URL, or ``host[:port]``) as named by ``field``."""
    parts = urlsplit(address if "://" in address else f"tcp://{address}")
    try:
        port = parts.port
    except ValueError:
        port = None
    return Dial(field, parts.hostname or "", port or default_port)


def egress_denial(exc: BaseException) -> EgressDenied | None:
    """The EgressDenied an SDK's error was caused by (a guarded resolver refused), if any."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, EgressDenied):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


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


_noted: ContextVar[list[Exchange] | None] = ContextVar("herald_exchange", default=None)


class noting_exchange:  # lower case: used as a function, ``with noting_exchange() as noted``
    """Inside, what an HTTP adapter puts on the wire is noted in the list yielded (the
    latest only): the engine's record keeps it even when its deadline cancels the
    attempt after the request went out, which a :class:`Result` could not carry.
    (A class, not a generator: it wraps every attempt.)"""

    __slots__ = ("_box", "_token")

    def __init__(self) -> None:
        self._box: list[Exchange] = []

    def __enter__(self) -> list[Exchange]:
        self._token = _noted.set(self._box)
        return self._box

    def __exit__(self, *exc: object) -> None:
        _noted.reset(self._token)


def note_exchange(exchange: Exchange) -> None:
    """Note what this attempt sent (and, later, what came back); a no-op outside
    :func:`noting_exchange`."""
    box = _noted.get()
    if box is not None:
        box[:] = [exchange]


_wire: ContextVar[Callable[[], Awaitable[None]] | None] = ContextVar("herald_wire", default=None)


class waiting_turn:  # lower case: used as a function, ``with waiting_turn(turn)``
    """Inside, :func:`on_the_wire` awaits ``turn`` (once) before a request is written:
    the engine's pacing of a rate-limited destination (``herald.flow.Pacer``)."""

    __slots__ = ("_token", "_turn")

    def __init__(self, turn: Callable[[], Awaitable[None]] | None) -> None:
        self._turn = turn

    def __enter__(self) -> None:
        self._token = _wire.set(self._turn)

    def __exit__(self, *exc: object) -> None:
        _wire.reset(self._token)


async def on_the_wire() -> None:
    """Called by an adapter just before its request goes out (the connection ready, the
    credentials in hand): waits for this attempt's turn, if the engine paces it."""
    turn = _wire.get()
    if turn is not None:
        await turn()


class ShuttingDown(Exception):
    """The adapter closed while an attempt waited for a shared client."""


def masked(text: str, secret: str | None) -> str:
    """Defence in depth: no library message may carry ``secret`` (a destination's
    password) into a record or log. The operator's own secrets are masked from every
    recorded attempt as well (:class:`herald.config.Redactor`)."""
    return redact(text, (secret,) if secret else ())


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
    """One destination type.

    Every host a config makes Herald connect to is declared by :meth:`dialled`
    and held to the egress policy here, for every type: when a destination is
    created or changed (:meth:`check`) and before every attempt (:meth:`deliver`,
    which then calls the type's :meth:`publish`). So is the rule that only the
    tenants in ``security.ambient_credentials_tenants`` may publish with the
    daemon's own cloud identity (:meth:`ambient_credentials`).
    """

    type_id: ClassVar[str]
    aliases: ClassVar[tuple[str, ...]] = ()
    config_model: ClassVar[type[DestinationConfig]]
    resolves_through_guard: ClassVar[bool] = False
    """True when every connection to a dialled host resolves through
    :class:`~herald.egress.GuardedResolver`, so the address checked is the
    address dialled. Otherwise each attempt resolves and checks the dialled
    hosts first (:class:`~herald.egress.TargetCheck`; a pass is remembered for
    seconds) and pins one checked address per host, and :meth:`publish` must
    make the SDK connect to exactly that address (:meth:`address`), with TLS
    still verified against the host name: the SDK never resolves a dialled
    name itself."""
    paces_on_the_wire: ClassVar[bool] = False
    """True when :meth:`publish` calls :func:`on_the_wire` itself, once its connection
    is ready; otherwise :meth:`deliver` calls it before :meth:`publish`."""

    def __init__(self, ctx: AdapterContext) -> None:
        self.ctx = ctx
        self._dial_checks = TargetCheck(ctx.egress)

    @property
    def timeout(self) -> float:
        """The engine's deadline for one attempt of this type."""
        return self.ctx.settings.delivery.adapter_timeout_seconds

    def dialled(self, config: DestinationConfig) -> list[Dial]:
        """The hosts ``config`` chooses for Herald to connect to, with the fields naming them.

        By default the ``endpoint_url``. A type whose config names other hosts (a
        broker URL, a connection string's endpoint, a key's universe) adds them;
        a type's fixed public service hosts (AWS's, Google's) are not listed.
        """
        return [] if config.endpoint_url is None else [dial("endpoint_url", config.endpoint_url)]

    def ambient_credentials(self, config: DestinationConfig) -> str | None:
        """The credential field whose absence makes ``config`` publish with the daemon's
        own identity (a cloud SDK's default credentials); None if it brings its own."""
        return None

    def check_credentials(self, config: DestinationConfig, *, tenant_id: str) -> None:
        """Refuse (ValidationError naming the field) a config that would publish with the
        daemon's own identity for a tenant the operator has not listed."""
        field = self.ambient_credentials(config)
        if field is not None and not self._ambient_allowed(tenant_id):
            name = f"{self.type_id}.{field}"
            raise ValidationError(
                f"{name} is required: tenant {tenant_id!r} may not use the daemon's ambient"
                " credentials (security.ambient_credentials_tenants)",
                field=name,
                code="credentials_required",
            )

    async def check(self, config: DestinationConfig, *, tenant_id: str) -> None:
        """Create-time checks that need I/O (e.g. DNS); raise ValidationError.

        Every host in :meth:`dialled` is held to the egress policy: whoever may
        create destinations must not be able to point Herald at its own network
        (the cloud metadata address, internal services, a port scan) unless the
        operator allows it (``security.allow_private_networks`` or
        ``security.allowed_networks``). Then :meth:`check_credentials`.
        """
        for target in self.dialled(config):
            await check_target(
                target.address, self.ctx.egress, field=f"{self.type_id}.{target.field}"
            )
        self.check_credentials(config, tenant_id=tenant_id)

    @final
    async def deliver(self, dest: Destination, config: DestinationConfig, event: Event) -> Result:
        """One attempt: the egress and credential rules, then :meth:`publish`."""
        refused = await self._refusal(dest, config)
        if refused is not None:
            return refused
        if not self.paces_on_the_wire:
            await on_the_wire()
        return await self.publish(dest, config, event)

    async def _refusal(self, dest: Destination, config: DestinationConfig) -> Result | None:
        """Why this attempt must not be made (nothing dialled, no default chain asked)."""
        field = self.ambient_credentials(config)
        if field is not None and not self._ambient_allowed(dest.tenant_id):
            return Result.permanent(
                f"ambient credentials are not allowed for tenant {dest.tenant_id!r}:"
                f" set {self.type_id}.{field} (security.ambient_credentials_tenants)"
            )
        for target in self.dialled(config):
            try:
                check_url_host(target.address, self.ctx.egress)  # IP literals
                if not self.resolves_through_guard:
                    await self._dial_checks.pin(target.address)
            except EgressDenied as exc:
                if isinstance(exc.__cause__, ValidationError):  # did not resolve (now)
                    return Result.retryable(f"connection failed: {exc.message}")
                return Result.permanent(exc.message)
            except ValidationError as exc:
                return Result.permanent(f"{self.type_id}.{target.field}: {exc.message}")
        return None

    def address(self, target: Dial) -> str:
        """The address :meth:`publish` must make the SDK connect to for ``target``: the
        one this attempt's egress check resolved and pinned (read back without
        resolving again), or the host name itself when the policy allows every
        address (``security.allow_private_networks``: nothing to hold it to).

        An adapter must connect there and verify TLS against ``target.host``.
        RuntimeError if ``target`` was never checked: a type that forgot to declare
        a host in :meth:`dialled` fails loudly instead of dialling it unchecked.
        """
        return self.addresses(target)[0]

    def addresses(self, target: Dial) -> list[str]:
        """:meth:`address` first, then the other addresses the same check resolved and
        permitted: fallbacks for a client that can try several (never a new lookup)."""
        if self.ctx.egress.allow_private:
            return [target.host]
        checked = self._dial_checks.checked(target.address)
        if not checked:
            raise RuntimeError(f"{self.type_id}: {target.host} was never checked against egress")
        return checked

    def _ambient_allowed(self, tenant_id: str) -> bool:
        return tenant_id in self.ctx.settings.security.ambient_credentials_tenants

    @abstractmethod
    async def publish(self, dest: Destination, config: DestinationConfig, event: Event) -> Result:
        """Publish ``event`` once; return the outcome (never raise for a failed publish)."""

    async def forget(self, dest_id: str) -> None:
        """Drop per-destination state (its config changed or it was deleted)."""
        return

    async def close(self) -> None:
        """Release clients and connections; called once on shutdown."""
        return
