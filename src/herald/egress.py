"""SSRF guard for webhook egress: which addresses Herald may connect to.

The guard sits in the resolver aiohttp connects through, so the address that is checked is
the address that is dialled; a DNS answer that changes between checks (rebinding) cannot
slip past it. aiohttp never calls the resolver for hosts that look like IP literals, so
those are checked separately by :func:`check_url_host`.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import re
import socket
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import ThreadedResolver
from yarl import URL

from herald.errors import EgressDenied, ValidationError

__all__ = [
    "EgressPolicy",
    "GuardedResolver",
    "TargetCheck",
    "check_target",
    "check_url_host",
    "is_public_address",
    "resolve_and_check",
]

RESOLVE_TIMEOUT_SECONDS = 5.0
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


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
            exc = EgressDenied(message)
            # aiohttp's ClientConnectorError shows the OS error's strerror in its text.
            exc.strerror = message
            raise exc


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


async def resolve_and_check(host: str, policy: EgressPolicy) -> None:
    """Resolve ``host`` now and refuse it if any of its addresses is not permitted.

    Meant for create-time validation; connect time is still guarded by GuardedResolver.
    Raises ValidationError if the host does not resolve.
    """
    name = host.strip("[]")
    if not name:
        raise ValidationError("host is empty")
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ValidationError(f"host {host!r} does not resolve: {exc.strerror}") from None
    except UnicodeError:
        raise ValidationError(f"host {host!r} is not a valid host name") from None
    if not infos:
        raise ValidationError(f"host {host!r} does not resolve")
    for *_, sockaddr in infos:
        policy.check_ip(str(sockaddr[0]), host)


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
        raise ValidationError(exc.message, field=field, code="url_not_allowed") from exc
    except ValidationError as exc:
        raise ValidationError(exc.message, field=field, code="url_invalid") from exc
    except ValueError as exc:
        raise ValidationError(f"invalid URL: {exc}", field=field, code="url_invalid") from None


class TargetCheck:
    """Resolve-and-check of target hosts, with a short cache of hosts that passed.

    For connections whose resolver Herald does not own: a proxy resolves the
    target itself, and so do the SDKs that cannot take a resolver (aio-pika,
    Azure's AMQP, gRPC). The check cannot pin the address they then connect to:
    a proxy must refuse private ranges too (documented). A host that does not
    resolve raises EgressDenied whose ``__cause__`` is the ValidationError.
    """

    def __init__(self, egress: EgressPolicy, *, ttl: float = 10.0) -> None:
        self._egress = egress
        self._ttl = ttl
        self._ok: dict[str, float] = {}

    async def check(self, url: str) -> None:
        if self._egress.allow_private:
            return
        host = urlsplit(url).hostname or ""
        now = time.monotonic()
        if self._ok.get(host, 0.0) > now:
            return
        try:
            await resolve_and_check(host, self._egress)
        except ValidationError as exc:
            raise EgressDenied(exc.message) from exc
        if len(self._ok) > 10_000:
            self._ok.clear()
        self._ok[host] = now + self._ttl
