"""SSRF guard for egress: which addresses Herald may connect to.

For HTTP the guard sits in the resolver aiohttp connects through
(:class:`GuardedResolver`), so the address that is checked is the address that is
dialled; a DNS answer that changes between checks (rebinding) cannot slip past it.
aiohttp never calls the resolver for hosts that look like IP literals, so those are
checked separately by :func:`check_url_host`.

For the SDKs that resolve on their own (aio-pika, Azure's AMQP, gRPC),
:class:`TargetCheck` resolves once, checks every answer and *pins* one of them: the
adapter hands the SDK that address to connect to, with TLS still verified against the
host name, so the SDK never resolves the name itself.

Where names are resolved is the policy's ``resolver`` (the system's by default), so a
test can answer the check with one address and any later lookup with another.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import re
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import ThreadedResolver
from yarl import URL

from herald.errors import EgressDenied, ValidationError

__all__ = [
    "EgressPolicy",
    "GuardedResolver",
    "Resolve",
    "TargetCheck",
    "check_target",
    "check_url_host",
    "is_public_address",
    "resolve_and_check",
    "system_resolve",
]

RESOLVE_TIMEOUT_SECONDS = 5.0
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolve = Callable[[str], Awaitable[list[str]]]
"""A host name → its addresses (text), in the order to try them; OSError if it has none."""


async def system_resolve(host: str) -> list[str]:
    """The system resolver's addresses for ``host`` (getaddrinfo, off the event loop)."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(sockaddr[0]) for *_, sockaddr in infos))


def _ranges(*cidrs: str) -> tuple[tuple[int, int], ...]:
    nets = [ipaddress.ip_network(c) for c in cidrs]
    return tuple((int(n.network_address), int(n.broadcast_address)) for n in nets)


# Special-purpose IPv4 blocks (IANA registry) that are not globally reachable.
_V4_BLOCKED = _ranges(
    "0.0.0.0/8",  # "this network", includes the unspecified address
    "10.0.0.0/8",
    "100.64.0.0/10",  # carrier-grade NAT
    "127.0.0.0/8",
    "169.254.0.0/16",  # link-local, includes cloud metadata 169.254.169.254
    "172.16.0.0/12",
    "192.0.0.0/24",  # IETF protocol assignments
    "192.0.2.0/24",  # TEST-NET-1
    "192.88.99.0/24",  # deprecated 6to4 relay anycast
    "192.168.0.0/16",
    "198.18.0.0/15",  # benchmarking
    "198.51.100.0/24",  # TEST-NET-2
    "203.0.113.0/24",  # TEST-NET-3
    "224.0.0.0/4",  # multicast
    "240.0.0.0/4",  # reserved, includes broadcast 255.255.255.255
)

# Only 2000::/3 is allocated as global unicast. Everything outside it is non-public once
# the forms that embed an IPv4 address are unwrapped: loopback, unspecified, ULA fc00::/7
# (AWS metadata fd00:ec2::254 lives there), link-local fe80::/10, site-local fec0::/10,
# multicast ff00::/8, discard 100::/64, local-use NAT64 64:ff9b:1::/48 and the rest.
_V6_GLOBAL_UNICAST = _ranges("2000::/3")[0]
_V6_BLOCKED = _ranges(
    "2001:2::/48",  # benchmarking
    "2001:10::/28",  # ORCHID (deprecated)
    "2001:20::/28",  # ORCHIDv2
    "2001:db8::/32",  # documentation
    "3fff::/20",  # documentation (RFC 9637)
)
_V4_MAPPED = _ranges("::ffff:0:0/96")[0]
_V4_COMPATIBLE = _ranges("::/96")[0]
_NAT64 = _ranges("64:ff9b::/96")[0]
_SIX_TO_FOUR = _ranges("2002::/16")[0]
_TEREDO = _ranges("2001::/32")[0]


def _in(value: int, span: tuple[int, int]) -> bool:
    return span[0] <= value <= span[1]


def _is_public_v4(value: int) -> bool:
    return not any(lo <= value <= hi for lo, hi in _V4_BLOCKED)


def is_public_address(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """True if ``ip`` is a globally reachable unicast address Herald may call by default."""
    value = int(ip)
    if ip.version == 4:
        return _is_public_v4(value)
    # Forms that carry an IPv4 address in their low 32 bits reach that IPv4 host.
    if _in(value, _V4_MAPPED) or _in(value, _V4_COMPATIBLE) or _in(value, _NAT64):
        return _is_public_v4(value & 0xFFFF_FFFF)
    if not _in(value, _V6_GLOBAL_UNICAST):
        return False
    if _in(value, _SIX_TO_FOUR) and not _is_public_v4(value >> 80 & 0xFFFF_FFFF):
        return False
    if _in(value, _TEREDO):
        server = value >> 64 & 0xFFFF_FFFF
        client = ~value & 0xFFFF_FFFF  # Teredo stores the client address inverted
        if not (_is_public_v4(server) and _is_public_v4(client)):
            return False
    return not any(lo <= value <= hi for lo, hi in _V6_BLOCKED)


def _parse_ip(text: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class EgressPolicy:
    """Which addresses outbound deliveries may reach."""

    allow_private: bool = False
    allowed_networks: tuple[IPNetwork, ...] = ()
    resolver: Resolve | None = field(default=None, compare=False, hash=False, repr=False)
    """How :func:`resolve_and_check` and :class:`TargetCheck` resolve names (None: the
    system's, :func:`system_resolve`). Not part of the policy's identity."""

    async def resolve(self, host: str) -> list[str]:
        """The addresses of ``host`` through :attr:`resolver`."""
        return await (self.resolver or system_resolve)(host)

    def permits(self, ip_str: str) -> bool:
        """True if connecting to the address ``ip_str`` is allowed; unparseable means no."""
        if self.allow_private:
            return True
        ip = _parse_ip(ip_str)
        if ip is None:
            return False
        if self.allowed_networks:
            candidates: list[IPAddress] = [ip]
            if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
                candidates.append(ip.ipv4_mapped)
            for net in self.allowed_networks:
                if any(c.version == net.version and c in net for c in candidates):
                    return True
        return is_public_address(ip)

    def check_ip(self, ip_str: str, host: str) -> None:
        """Raise EgressDenied unless the policy permits ``ip_str`` (an address of ``host``)."""
        if not self.permits(ip_str):
            message = (
                f"egress denied: {host} resolves to {ip_str} which is not a public address "
                "and is not in the allowed networks"
            )
            exc = EgressDenied(message, hint=DENIED_HINT)
            # aiohttp's ClientConnectorError shows the OS error's strerror in its text.
            exc.strerror = message
            raise exc


DENIED_HINT = (
    "Point it at a public address; for a receiver on this machine or a private network"
    " (tests, a walk-through) set security.allow_private_networks = true"
    " (HERALD_SECURITY__ALLOW_PRIVATE_NETWORKS=true), or list the network in"
    " security.allowed_networks, in the config that the daemon and the CLI read."
)
"""The hint of a refused address: loopback and private addresses are what a newcomer
meets first, and ``allow_private_networks`` is the setting they need."""


class GuardedResolver(AbstractResolver):
    """An aiohttp resolver that drops addresses the policy does not permit.

    Use it as ``TCPConnector(resolver=GuardedResolver(policy))``. When every address of a
    host is refused it raises EgressDenied, which aiohttp wraps in
    ``ClientConnectorDNSError`` (the EgressDenied is its ``__cause__``).
    """

    def __init__(
        self, policy: EgressPolicy | None = None, *, inner: AbstractResolver | None = None
    ) -> None:
        self.policy = policy if policy is not None else EgressPolicy()
        # ThreadedResolver binds the running loop, so the default is made on first use.
        self._inner = inner

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        """Resolve via the inner resolver and keep only permitted addresses."""
        if self._inner is None:
            self._inner = ThreadedResolver()
        results = await self._inner.resolve(host, port, family)
        permitted = [r for r in results if self.policy.permits(r["host"])]
        if results and not permitted:
            self.policy.check_ip(results[0]["host"], host)
        return permitted

    async def close(self) -> None:
        """Close the inner resolver."""
        if self._inner is not None:
            await self._inner.close()


# A part of a legacy IPv4 literal as inet_aton reads it: hex, octal or decimal.
_LEGACY_PART = re.compile(r"0x[0-9a-f]*|0[0-7]*|[1-9][0-9]*", re.ASCII | re.IGNORECASE)


def _legacy_ipv4(host: str) -> ipaddress.IPv4Address | None:
    """The address inet_aton would make of ``host`` (``127.1``, ``0x7f.1``, ``2130706433``)."""
    parts = host.split(".")
    if len(parts) > 4 or not all(_LEGACY_PART.fullmatch(p) for p in parts):
        return None
    numbers = [_legacy_part(p) for p in parts]
    *head, last = numbers
    if any(n > 255 for n in head) or last >= 256 ** (5 - len(numbers)):
        return None
    value = last
    for i, n in enumerate(head):
        value |= n << (24 - 8 * i)
    return ipaddress.IPv4Address(value)


def _legacy_part(part: str) -> int:
    lower = part.lower()
    if lower.startswith("0x"):
        return int(lower[2:] or "0", 16)  # inet_aton reads a bare "0x" as zero
    if len(part) > 1 and part[0] == "0":
        return int(part, 8)
    # More than ten decimal digits is beyond 32 bits anyway; this also keeps int() away
    # from its digit-count limit on absurd input.
    return int(part) if len(part) <= 10 else 1 << 32


@functools.lru_cache(maxsize=4096)
def check_url_host(url: str, policy: EgressPolicy) -> None:
    """Raise EgressDenied if the URL's host is an IP literal the policy does not permit.

    Called before every request; a URL and policy that passed once pass again, so a
    pass is remembered (a refusal is not: it raises, and raises again next time).

    Host names pass; they are checked when resolved (GuardedResolver, resolve_and_check).
    Numeric forms such as ``2130706433`` or ``0x7f.1`` count as the IPv4 address they
    spell, since the system resolver would turn them into exactly that.
    """
    try:
        host = URL(url).raw_host
    except (ValueError, TypeError) as exc:
        raise ValidationError(f"invalid URL: {exc}") from None
    if not host:
        raise ValidationError("URL has no host")
    host = host.strip("[]")
    ip: IPAddress | None
    if ":" in host:
        # yarl keeps an IPv6 zone percent-encoded ("%25eth0"); the zone does not matter here.
        ip = _parse_ip(host.split("%", 1)[0])
        if ip is None:
            raise ValidationError(f"invalid IPv6 address in URL: {host!r}")
    else:
        ip = _legacy_ipv4(host[:-1] if host.endswith(".") else host)
    if ip is not None:
        policy.check_ip(str(ip), host)


async def resolve_and_check(host: str, policy: EgressPolicy) -> list[str]:
    """Resolve ``host`` now (through ``policy.resolver``) and refuse it if any of its
    addresses is not permitted; return the addresses, every one of them checked.

    Raises EgressDenied for a refused address, ValidationError if the host does not resolve.
    """
    name = host.strip("[]")
    if not name:
        raise ValidationError("host is empty")
    try:
        addresses = await policy.resolve(name)
    except UnicodeError:
        raise ValidationError(f"host {host!r} is not a valid host name") from None
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise ValidationError(f"host {host!r} does not resolve: {reason}") from None
    if not addresses:
        raise ValidationError(f"host {host!r} does not resolve")
    for address in addresses:
        policy.check_ip(address, host)
    return addresses


async def check_target(url: str, policy: EgressPolicy, *, field: str) -> None:
    """Create-time check of where a destination sends: refuse a host that is, or resolves
    to, an address the policy does not permit, as a ValidationError naming ``field``.

    ``url`` may lack a scheme (``host:port``). Codes: ``url_not_allowed``,
    ``url_unresolvable`` (no answer within RESOLVE_TIMEOUT_SECONDS), ``url_invalid``.
    """
    if "://" not in url:
        url = f"tcp://{url}"
    try:
        host = URL(url).raw_host or ""
        check_url_host(url, policy)
        async with asyncio.timeout(RESOLVE_TIMEOUT_SECONDS):
            await resolve_and_check(host, policy)
    except TimeoutError:
        raise ValidationError(
            f"{host} did not resolve within {RESOLVE_TIMEOUT_SECONDS:g} s",
            field=field,
            code="url_unresolvable",
        ) from None
    except EgressDenied as exc:
        raise ValidationError(
            exc.message, field=field, code="url_not_allowed", hint=exc.hint
        ) from exc
    except ValidationError as exc:
        raise ValidationError(exc.message, field=field, code="url_invalid") from exc
    except ValueError as exc:
        raise ValidationError(f"invalid URL: {exc}", field=field, code="url_invalid") from None


class TargetCheck:
    """Resolve-and-check of target hosts that pins the address to dial.

    For connections whose resolver Herald does not own: the SDKs that cannot take
    a resolver (aio-pika, Azure's AMQP, gRPC), and a proxy, which resolves the
    target itself. :meth:`pin` resolves the host through the policy, refuses it
    unless every address is permitted, and answers the one address the
    connection must go to; the adapter hands the SDK that address (TLS still
    verifies the host name), so a DNS answer that changes after the check
    (rebinding) is never dialled. A proxy cannot be pinned: it must refuse
    private ranges too (documented).

    A pass is remembered for ``ttl`` seconds, so an attempt costs a dictionary
    look-up. When it is checked again the same address is kept while the host
    still resolves to it (round-robin DNS does not churn pooled connections keyed
    by it). A host that does not resolve raises EgressDenied whose ``__cause__``
    is the ValidationError. Under ``allow_private`` nothing is checked or pinned.
    """

    def __init__(self, egress: EgressPolicy, *, ttl: float = 10.0) -> None:
        self._egress = egress
        self._ttl = ttl
        self._pins: dict[str, tuple[float, str, tuple[str, ...]]] = {}

    async def check(self, url: str) -> None:
        """Refuse ``url``'s host unless it resolves only to permitted addresses."""
        await self.pin(url)

    async def pin(self, url: str) -> str | None:
        """The checked address of ``url``'s host to connect to (None under ``allow_private``:
        there is nothing to hold the connection to, and the SDK resolves as it likes)."""
        if self._egress.allow_private:
            return None
        host = urlsplit(url).hostname or ""
        now = time.monotonic()
        cached = self._pins.get(host)
        if cached is not None and cached[0] > now:
            return cached[1]
        literal = _parse_ip(host)
        try:
            if literal is not None:
                self._egress.check_ip(str(literal), host)
                addresses = [str(literal)]
            else:
                addresses = await resolve_and_check(host, self._egress)
        except ValidationError as exc:
            self._pins.pop(host, None)
            raise EgressDenied(exc.message) from exc
        except EgressDenied:
            self._pins.pop(host, None)  # no stale address to read back
            raise
        chosen = cached[1] if cached is not None and cached[1] in addresses else addresses[0]
        if len(self._pins) > 10_000:
            self._pins.clear()
        self._pins[host] = (now + self._ttl, chosen, tuple(addresses))
        return chosen

    def pinned(self, url: str) -> str | None:
        """The address the last :meth:`pin` of ``url``'s host chose, without resolving
        again (None if it was never pinned or under ``allow_private``)."""
        addresses = self.checked(url)
        return addresses[0] if addresses else None

    def checked(self, url: str) -> list[str]:
        """Every address the last :meth:`pin` of ``url``'s host checked, the pinned one
        first (empty if it was never pinned or under ``allow_private``): a client that
        can try several addresses falls back to these, never to a new lookup."""
        if self._egress.allow_private:
            return []
        cached = self._pins.get(urlsplit(url).hostname or "")
        if cached is None:
            return []
        return [cached[1], *(a for a in cached[2] if a != cached[1])]
