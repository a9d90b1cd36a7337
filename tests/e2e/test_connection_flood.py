"""A flood of idle connections: one client address cannot hold more than
``api.max_connections_per_address``, connections that send no request head are capped
lower (``api.max_headless_connections``, the oldest closed to make room), and the
probes keep answering on ``metrics.listen`` while the API's port is full.

The caps are lowered so that a few hundred sockets make the flood; extra client
addresses are loopback ones (127.0.0.2, …), which Linux routes to 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator

import pytest

from tests.e2e.conftest import HeraldFactory
from tests.e2e.test_http_limits import get, raw_request
from tests.support.api import error_of
from tests.support.daemon import Herald, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.backend_neutral]

PER_ADDRESS = 20
HEADLESS = 30
MAX = 50
WITHIN = 15.0
"""Seconds within which the daemon must have closed what it closes."""

Held = list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]


@pytest.fixture
async def flooded(herald_factory: HeraldFactory) -> AsyncIterator[tuple[Herald, int, Held]]:
    """A daemon with low caps and probes on a listener of their own; the list holds
    the test's connections, all closed at the end."""
    probes = free_port()
    h = herald_factory(
        {
            "api": {
                "max_connections": MAX,
                "max_connections_per_address": PER_ADDRESS,
                "max_headless_connections": HEADLESS,
                "header_timeout_seconds": 120,  # idle connections are not timed out here
            },
            "metrics": {"listen": f"127.0.0.1:{probes}"},
        },
        start=False,
    )
    await h.astart()
    held: Held = []
    try:
        yield h, probes, held
    finally:
        for _, writer in held:
            writer.close()


async def open_idle(h: Herald, held: Held, count: int, source: str) -> Held:
    """``count`` connections from ``source`` that send nothing."""
    opened = [
        await asyncio.open_connection("127.0.0.1", h.port, local_addr=(source, 0))
        for _ in range(count)
    ]
    held.extend(opened)
    return opened


def status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code


async def probes_answer(port: int) -> None:
    for path in ("/healthz", "/readyz"):
        assert await asyncio.to_thread(status, port, path) == 200, path


async def test_one_address_cannot_take_more_than_its_cap(
    flooded: tuple[Herald, int, Held],
) -> None:
    h, probes, held = flooded
    await open_idle(h, held, PER_ADDRESS, "127.0.0.1")
    answer = await raw_request(h, get("/healthz"), source="127.0.0.1")
    assert answer.status == 503, answer
    item = error_of(answer.json())
    assert item["code"] == "too_many_connections"
    assert f"more than {PER_ADDRESS} connections are open from this address" in item["message"]
    assert answer.headers["retry-after"] == "1"
    # Another address is served, and so are the probes on their own listener.
    assert (await raw_request(h, get("/healthz"), source="127.0.0.2")).status == 200
    await probes_answer(probes)
    # Once the address's connections close, it is served again.
    for _, writer in held:
        writer.close()
    deadline = time.monotonic() + WITHIN
    while (await raw_request(h, get("/healthz"), source="127.0.0.1")).status != 200:
        assert time.monotonic() < deadline, "still refused after its connections closed"
        await asyncio.sleep(0.05)


async def test_connections_without_a_request_head_are_capped_lower(
    flooded: tuple[Herald, int, Held],
) -> None:
    h, probes, held = flooded
    sources = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
    for source in sources:  # 60 idle sockets, each address within its cap
        await open_idle(h, held, PER_ADDRESS, source)
    assert len(held) > HEADLESS
    # The oldest are closed, without a word, to keep HEADLESS of them.
    deadline = time.monotonic() + WITHIN
    while sum(reader.at_eof() for reader, _ in held) < len(held) - HEADLESS:
        assert time.monotonic() < deadline, sum(reader.at_eof() for reader, _ in held)
        await asyncio.sleep(0.05)
    closed = [reader for reader, _ in held if reader.at_eof()]
    for reader in closed:
        assert await reader.read() == b"", "a connection that sent nothing gets no answer"
    assert held[0][0] in closed, "the oldest went first"
    # A client that sends its request at once is served: it takes an idle one's place.
    answer = await raw_request(h, get("/healthz"), source="127.0.0.5")
    assert answer.status == 200, answer
    await probes_answer(probes)


async def test_the_probes_answer_on_their_listener_while_the_api_is_full(
    flooded: tuple[Herald, int, Held],
) -> None:
    h, probes, held = flooded
    # MAX connections from several addresses, each past its request head and idle in
    # keep-alive: the head-less cap does not touch them, the API's port is full.
    sources = [f"127.0.0.{i}" for i in range(2, 2 + -(-MAX // PER_ADDRESS))]
    for i in range(MAX):
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", h.port, local_addr=(sources[i % len(sources)], 0)
        )
        held.append((reader, writer))
        writer.write(get("/healthz"))
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WITHIN)
        assert head.startswith(b"HTTP/1.1 200"), head
    answer = await raw_request(h, get("/healthz"), source="127.0.0.9")
    assert answer.status == 503, answer
    assert error_of(answer.json())["code"] == "too_many_connections"
    await probes_answer(probes)
