"""Tests for herald.egress: address classification, policy, and the guarded aiohttp resolver."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult

from herald.egress import (
    EgressPolicy,
    GuardedResolver,
    TargetCheck,
    check_url_host,
    is_public_address,
    resolve_and_check,
)
from herald.errors import EgressDenied, ValidationError

STRICT = EgressPolicy()
OPEN = EgressPolicy(allow_private=True)


@pytest.mark.parametrize(
    "address",
    [
        # IPv4 special-purpose blocks
        "0.0.0.0",
        "0.1.2.3",
        "10.0.0.1",
        "10.255.255.255",
        "100.64.0.1",
        "100.127.255.254",
        "127.0.0.1",
        "127.255.255.254",
        "169.254.0.1",
        "169.254.169.254",
        "172.16.0.1",
        "172.31.255.255",
        "192.0.0.8",
        "192.0.2.10",
        "192.88.99.1",
        "192.168.1.1",
        "198.18.0.1",
        "198.19.255.255",
        "198.51.100.7",
        "203.0.113.9",
        "224.0.0.1",
        "239.255.255.250",
        "240.0.0.1",
        "255.255.255.255",
        # IPv6 native
        "::",
        "::1",
        "fe80::1",
        "fe80::1%eth0",
        "febf:ffff::1",
        "fec0::1",
        "fc00::1",
        "fd12:3456::1",
        "fd00:ec2::254",
        "ff02::1",
        "ff0e::1",
        "100::1",
        "64:ff9b:1::a00:1",
        "2001:db8::1",
        "2001:2::1",
        "2001:10::1",
        "2001:20::1",
        "3fff::1",
        "5f00::1",
        "4000::1",
        # IPv6 forms embedding a non-public IPv4 address
        "::ffff:127.0.0.1",
        "::ffff:10.0.0.1",
        "::ffff:169.254.169.254",
        "::127.0.0.1",
        "::192.168.0.1",
        "64:ff9b::127.0.0.1",
        "64:ff9b::a9fe:a9fe",
        "2002:7f00:1::1",
        "2002:a00:1::",
        "2002:a9fe:a9fe::1",
        "2002:c0a8:101:808:808::1",
        # Teredo: server 65.54.227.120, client inverted 127.0.0.1 -> 80ff:fffe
        "2001:0:4136:e378:8000:63bf:80ff:fffe",
        # Teredo with a private server address
        "2001:0:a00:1:8000:63bf:f7f7:f7f7",
    ],
)
def test_non_public_addresses(address: str) -> None:
    assert is_public_address(ipaddress.ip_address(address)) is False


@pytest.mark.parametrize(
    "address",
    [
        "1.1.1.1",
        "8.8.8.8",
        "9.255.255.255",
        "11.0.0.0",
        "100.63.255.255",
        "100.128.0.0",
        "126.255.255.255",
        "128.0.0.0",
        "169.253.255.255",
        "172.15.255.255",
        "172.32.0.0",
        "192.0.1.1",
        "192.167.255.255",
        "192.169.0.0",
        "198.17.255.255",
        "198.20.0.0",
        "223.255.255.255",
        "2606:4700:4700::1111",
        "2001:4860:4860::8888",
        "2a00:1450:4001:80b::200e",
        "2001:1::1",
        "::ffff:8.8.8.8",
        "::8.8.8.8",
        "64:ff9b::1.1.1.1",
        "2002:0808:0808::1",
        "2002:808:808:c0a8:101::1",
        # Teredo: server 65.54.227.120, client inverted 8.8.8.8 -> f7f7:f7f7
        "2001:0:4136:e378:8000:63bf:f7f7:f7f7",
    ],
)
def test_public_addresses(address: str) -> None:
    assert is_public_address(ipaddress.ip_address(address)) is True


def test_policy_permits() -> None:
    assert STRICT.permits("8.8.8.8")
    assert not STRICT.permits("127.0.0.1")
    assert not STRICT.permits("not-an-ip")
    assert not STRICT.permits("")
    assert OPEN.permits("127.0.0.1")
    assert OPEN.permits("fd00:ec2::254")


def test_policy_allowed_networks() -> None:
    policy = EgressPolicy(
        allowed_networks=(
            ipaddress.ip_network("10.1.0.0/16"),
            ipaddress.ip_network("fd00:1::/32"),
        )
    )
    assert policy.permits("10.1.2.3")
    assert policy.permits("::ffff:10.1.2.3")
    assert policy.permits("fd00:1::5")
    assert policy.permits("1.1.1.1")
    assert not policy.permits("10.2.0.1")
    assert not policy.permits("127.0.0.1")
    assert not policy.permits("fd00:2::5")


def test_policy_is_frozen() -> None:
    with pytest.raises(AttributeError):
        STRICT.allow_private = True  # type: ignore[misc]


def test_check_ip_message() -> None:
    STRICT.check_ip("8.8.8.8", "example.com")
    with pytest.raises(EgressDenied, match=r"internal\.example resolves to 10\.0\.0\.1") as info:
        STRICT.check_ip("10.0.0.1", "internal.example")
    assert "not a public address" in info.value.message
    assert isinstance(info.value, OSError)
    assert str(info.value) == info.value.message == info.value.strerror
    assert info.value.code == "egress_denied"


class FakeResolver(AbstractResolver):
    """Answers from a script, one answer list per call, and records the calls."""

    def __init__(self, answers: list[list[str]]) -> None:
        self.answers = answers
        self.calls: list[str] = []
        self.closed = False

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        self.calls.append(host)
        addresses = self.answers[min(len(self.calls), len(self.answers)) - 1]
        return [
            ResolveResult(
                hostname=host,
                host=addr,
                port=port,
                family=socket.AF_INET6 if ":" in addr else socket.AF_INET,
                proto=0,
                flags=socket.AI_NUMERICHOST,
            )
            for addr in addresses
        ]

    async def close(self) -> None:
        self.closed = True


async def test_rebinding_second_answer_refused() -> None:
    inner = FakeResolver([["93.184.216.34"], ["127.0.0.1"]])
    resolver = GuardedResolver(STRICT, inner=inner)
    first = await resolver.resolve("rebind.example", 443)
    assert [r["host"] for r in first] == ["93.184.216.34"]
    with pytest.raises(EgressDenied, match=r"rebind\.example resolves to 127\.0\.0\.1"):
        await resolver.resolve("rebind.example", 443)
    assert inner.calls == ["rebind.example", "rebind.example"]


async def test_mixed_answer_keeps_only_permitted() -> None:
    inner = FakeResolver([["10.0.0.5", "1.1.1.1", "::1", "2606:4700::1"]])
    resolver = GuardedResolver(STRICT, inner=inner)
    result = await resolver.resolve("mixed.example", 80)
    assert [r["host"] for r in result] == ["1.1.1.1", "2606:4700::1"]
    assert all(r["port"] == 80 for r in result)


async def test_empty_answer_passes_through() -> None:
    resolver = GuardedResolver(STRICT, inner=FakeResolver([[]]))
    assert await resolver.resolve("nothing.example") == []


async def test_close_closes_inner() -> None:
    inner = FakeResolver([["1.1.1.1"]])
    resolver = GuardedResolver(inner=inner)
    await resolver.close()
    assert inner.closed
    # Without an inner resolver yet, close is a no-op.
    await GuardedResolver().close()


async def test_default_policy_is_strict() -> None:
    resolver = GuardedResolver(inner=FakeResolver([["192.168.0.1"]]))
    assert resolver.policy == EgressPolicy()
    with pytest.raises(EgressDenied):
        await resolver.resolve("lan.example")


async def test_default_inner_resolves_localhost_and_refuses_it() -> None:
    resolver = GuardedResolver(STRICT)
    try:
        with pytest.raises(EgressDenied):
            await resolver.resolve("localhost", 80)
    finally:
        await resolver.close()
    allowing = GuardedResolver(OPEN)
    try:
        result = await allowing.resolve("localhost", 80, socket.AF_INET)
    finally:
        await allowing.close()
    assert "127.0.0.1" in [r["host"] for r in result]


@pytest.fixture
async def server() -> AsyncIterator[tuple[int, list[str]]]:
    """A real aiohttp server on 127.0.0.1; yields its port and the paths it served."""
    hits: list[str] = []

    async def handler(request: web.Request) -> web.Response:
        hits.append(request.path)
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield port, hits
    finally:
        await runner.cleanup()


async def fetch(url: str, resolver: AbstractResolver) -> str:
    connector = aiohttp.TCPConnector(resolver=resolver, family=socket.AF_INET)
    async with (
        aiohttp.ClientSession(connector=connector, trust_env=False) as session,
        session.get(url) as response,
    ):
        return await response.text()


async def test_real_session_refused_when_private_disallowed(
    server: tuple[int, list[str]],
) -> None:
    port, hits = server
    resolver = GuardedResolver(STRICT, inner=FakeResolver([["127.0.0.1"]]))
    with pytest.raises(aiohttp.ClientConnectorDNSError) as info:
        await fetch(f"http://hook.example:{port}/deliver", resolver)
    assert isinstance(info.value.__cause__, EgressDenied)
    assert "hook.example resolves to 127.0.0.1" in str(info.value)
    assert hits == []


async def test_real_session_allowed_when_private_allowed(server: tuple[int, list[str]]) -> None:
    port, hits = server
    resolver = GuardedResolver(OPEN, inner=FakeResolver([["127.0.0.1"]]))
    assert await fetch(f"http://hook.example:{port}/deliver", resolver) == "ok"
    assert hits == ["/deliver"]


async def test_real_session_allowed_by_network(server: tuple[int, list[str]]) -> None:
    port, hits = server
    policy = EgressPolicy(allowed_networks=(ipaddress.ip_network("127.0.0.0/8"),))
    resolver = GuardedResolver(policy, inner=FakeResolver([["127.0.0.1"]]))
    assert await fetch(f"http://hook.example:{port}/net", resolver) == "ok"
    assert hits == ["/net"]


async def test_real_session_with_default_inner_resolver(server: tuple[int, list[str]]) -> None:
    port, hits = server
    with pytest.raises(aiohttp.ClientConnectorDNSError):
        await fetch(f"http://localhost:{port}/a", GuardedResolver(STRICT))
    assert await fetch(f"http://localhost:{port}/b", GuardedResolver(OPEN)) == "ok"
    assert hits == ["/b"]


async def test_real_session_rebinding_after_first_connection(
    server: tuple[int, list[str]],
) -> None:
    port, hits = server
    # First answer is permitted (allowed network), the rebound answer is not.
    policy = EgressPolicy(allowed_networks=(ipaddress.ip_network("127.0.0.1/32"),))
    inner = FakeResolver([["127.0.0.1"], ["127.0.0.2"]])
    connector = aiohttp.TCPConnector(
        resolver=GuardedResolver(policy, inner=inner), use_dns_cache=False, force_close=True
    )
    async with aiohttp.ClientSession(connector=connector, trust_env=False) as session:
        async with session.get(f"http://rebind.example:{port}/one") as response:
            assert await response.text() == "ok"
        with pytest.raises(aiohttp.ClientConnectorDNSError):
            await session.get(f"http://rebind.example:{port}/two")
    assert hits == ["/one"]
    assert inner.calls == ["rebind.example", "rebind.example"]


async def test_aiohttp_skips_resolver_for_ip_literals(server: tuple[int, list[str]]) -> None:
    """Why check_url_host exists: aiohttp dials IP literals without asking the resolver."""
    port, hits = server
    inner = FakeResolver([["1.1.1.1"]])
    url = f"http://127.0.0.1:{port}/literal"
    assert await fetch(url, GuardedResolver(STRICT, inner=inner)) == "ok"
    assert inner.calls == []
    assert hits == ["/literal"]
    with pytest.raises(EgressDenied):
        check_url_host(url, STRICT)


async def test_hex_ip_form_goes_through_resolver_and_is_refused(
    server: tuple[int, list[str]],
) -> None:
    port, hits = server
    # "0x7f.1" is not an IP literal to aiohttp, so the system resolver turns it into
    # 127.0.0.1 (or fails on resolvers that do not read hex); either way nothing is sent.
    with pytest.raises(aiohttp.ClientConnectorDNSError):
        await fetch(f"http://0x7f.1:{port}/hex", GuardedResolver(STRICT))
    assert hits == []
    with pytest.raises(EgressDenied, match=r"resolves to 127\.0\.0\.1"):
        check_url_host(f"http://0x7f.1:{port}/hex", STRICT)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/",
        "https://127.0.0.1:8443/x",
        "http://10.0.0.1/",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]/",
        "http://[::1]:8080/hook",
        "http://[::ffff:127.0.0.1]/",
        "http://[::ffff:7f00:1]/",
        "http://[fd00:ec2::254]/",
        "http://[fe80::1%25eth0]/",
        "http://2130706433/",
        "http://017700000001/",
        "http://0x7f000001/",
        "http://0x7f.1/",
        "http://0X7F.0.0.1/",
        "http://127.1/",
        "http://0177.0.0.1/",
        "http://127.0.0.1./",
        "http://0/",
        "http://0.0.0.0/",
        "http://1２7.0.0.1/",
    ],
)
def test_check_url_host_denies_private_literals(url: str) -> None:
    with pytest.raises(EgressDenied):
        check_url_host(url, STRICT)
    check_url_host(url, OPEN)


@pytest.mark.parametrize(
    "url",
    [
        "https://example.com/hook",
        "https://localhost/hook",
        "http://8.8.8.8/",
        "http://[2606:4700:4700::1111]:443/",
        "http://134744072/",
        "http://0x8.0x8.0x8.0x8/",
        "http://1.2.3.4.5/",
        "http://256.1.1.1/",
        "http://99999999999999999999999/",
        "http://0x7f.example/",
    ],
)
def test_check_url_host_passes_names_and_public_literals(url: str) -> None:
    check_url_host(url, STRICT)


@pytest.mark.parametrize("url", ["/relative/path", "mailto:ops@example.com", "http://[::1/"])
def test_check_url_host_rejects_urls_without_host(url: str) -> None:
    with pytest.raises(ValidationError):
        check_url_host(url, STRICT)


@pytest.mark.parametrize(
    "host",
    ["127.1", "0x7f.1", "2130706433", "017700000001", "0177.0.0.1", "10.1", "0x0a.0.0.1", "0"],
)
def test_legacy_forms_agree_with_inet_aton(host: str) -> None:
    expected = socket.inet_ntoa(socket.inet_aton(host))
    with pytest.raises(EgressDenied, match=f"resolves to {expected.replace('.', '[.]')} "):
        check_url_host(f"http://{host}/", STRICT)


async def test_resolve_and_check_refuses_localhost() -> None:
    with pytest.raises(EgressDenied, match="localhost resolves to"):
        await resolve_and_check("localhost", STRICT)
    await resolve_and_check("localhost", OPEN)


@pytest.mark.parametrize("host", ["127.0.0.1", "[::1]", "::1", "169.254.169.254", "0x7f.1"])
async def test_resolve_and_check_refuses_literals(host: str) -> None:
    with pytest.raises(EgressDenied):
        await resolve_and_check(host, STRICT)


async def test_resolve_and_check_accepts_public_literal() -> None:
    await resolve_and_check("8.8.8.8", STRICT)
    await resolve_and_check("[2606:4700:4700::1111]", STRICT)


@pytest.mark.parametrize("host", ["does-not-exist.invalid", "", "[]", "bad..name", "a" * 300])
async def test_resolve_and_check_unresolvable(host: str) -> None:
    with pytest.raises(ValidationError):
        await resolve_and_check(host, STRICT)


# --- TargetCheck: resolve once, check, pin ------------------------------------------------------
class Answers:
    """A resolver whose answers the test changes between lookups."""

    def __init__(self, **answers: list[str]) -> None:
        self.answers = {name.replace("_", "."): ips for name, ips in answers.items()}
        self.lookups = 0

    async def __call__(self, host: str) -> list[str]:
        self.lookups += 1
        if host not in self.answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return list(self.answers[host])


def policy_with(dns: Answers, *networks: str) -> EgressPolicy:
    return EgressPolicy(
        allowed_networks=tuple(ipaddress.ip_network(n) for n in networks), resolver=dns
    )


async def test_resolve_and_check_uses_the_policys_resolver() -> None:
    dns = Answers(mq_example=["10.0.0.5", "10.0.0.6"])
    assert await resolve_and_check("mq.example", policy_with(dns, "10.0.0.0/24")) == [
        "10.0.0.5",
        "10.0.0.6",
    ]
    with pytest.raises(EgressDenied, match=r"10\.0\.0\.6"):
        await resolve_and_check("mq.example", policy_with(dns, "10.0.0.5/32"))
    with pytest.raises(ValidationError, match="does not resolve"):
        await resolve_and_check("other.example", policy_with(dns))


def test_the_resolver_is_not_part_of_the_policys_identity() -> None:
    assert policy_with(Answers()) == policy_with(Answers())
    assert hash(policy_with(Answers())) == hash(EgressPolicy())


async def test_pin_answers_one_checked_address_and_remembers_it() -> None:
    dns = Answers(mq_example=["10.0.0.5", "10.0.0.6"])
    check = TargetCheck(policy_with(dns, "10.0.0.0/24"))
    assert check.pinned("tcp://mq.example:5672") is None
    assert await check.pin("tcp://mq.example:5672") == "10.0.0.5"
    dns.answers["mq.example"] = ["127.0.0.1"]  # rebound after the check
    assert await check.pin("tcp://mq.example:5672") == "10.0.0.5"  # remembered, not resolved
    assert check.pinned("tcp://mq.example:1") == "10.0.0.5"
    assert check.checked("tcp://mq.example") == ["10.0.0.5", "10.0.0.6"]  # fallbacks after
    assert check.checked("tcp://other.example") == []
    assert dns.lookups == 1


async def test_pin_refuses_a_rebound_name_once_the_pass_expires() -> None:
    dns = Answers(mq_example=["10.0.0.5"])
    check = TargetCheck(policy_with(dns, "10.0.0.0/24"), ttl=0.0)
    assert await check.pin("tcp://mq.example") == "10.0.0.5"
    dns.answers["mq.example"] = ["10.0.0.7", "169.254.169.254"]
    with pytest.raises(EgressDenied, match=r"169\.254\.169\.254"):
        await check.pin("tcp://mq.example")
    assert check.pinned("tcp://mq.example") is None  # nothing stale to read back


async def test_pin_keeps_its_address_while_the_name_still_resolves_to_it() -> None:
    """Round-robin DNS must not move a pooled connection on every re-check."""
    dns = Answers(mq_example=["10.0.0.5", "10.0.0.6"])
    check = TargetCheck(policy_with(dns, "10.0.0.0/24"), ttl=0.0)
    assert await check.pin("tcp://mq.example") == "10.0.0.5"
    dns.answers["mq.example"] = ["10.0.0.6", "10.0.0.5"]
    assert await check.pin("tcp://mq.example") == "10.0.0.5"
    assert check.checked("tcp://mq.example") == ["10.0.0.5", "10.0.0.6"]
    dns.answers["mq.example"] = ["10.0.0.6"]
    assert await check.pin("tcp://mq.example") == "10.0.0.6"


async def test_pin_of_an_unresolvable_name_is_egress_denied_caused_by_validation() -> None:
    check = TargetCheck(policy_with(Answers()))
    with pytest.raises(EgressDenied) as denied:
        await check.pin("tcp://nowhere.example")
    assert isinstance(denied.value.__cause__, ValidationError)


async def test_pin_of_a_literal_checks_it_without_resolving() -> None:
    dns = Answers()
    check = TargetCheck(policy_with(dns, "10.0.0.0/8"))
    assert await check.pin("tcp://10.1.2.3:5672") == "10.1.2.3"
    assert await check.pin("tcp://[2606:4700:4700::1111]:443") == "2606:4700:4700::1111"
    with pytest.raises(EgressDenied):
        await check.pin("tcp://127.0.0.1")
    assert dns.lookups == 0


async def test_nothing_is_pinned_when_private_networks_are_allowed() -> None:
    dns = Answers()
    check = TargetCheck(EgressPolicy(allow_private=True, resolver=dns))
    assert await check.pin("tcp://localhost:5672") is None
    assert check.pinned("tcp://localhost:5672") is None
    assert check.checked("tcp://localhost:5672") == []
    assert dns.lookups == 0
