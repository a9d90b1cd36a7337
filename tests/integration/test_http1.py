"""The lean HTTP/1.1 client (herald.adapters.http1) against real sockets: scripted
servers that answer each request the way a receiver might, well or badly."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from herald.adapters import http1
from herald.adapters.http1 import MAX_HEAD_BYTES, Answer, Client, ConnectFailed, ResponseFailed
from herald.egress import EgressPolicy, GuardedResolver
from herald.errors import EgressDenied
from tests.support.receiverauth import TestCA

Answerer = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[bool]]
"""Reads one request and answers it; False closes the connection."""


class Server:
    def __init__(self, port: int) -> None:
        self.port = port
        self.connections = 0
        self.requests: list[bytes] = []
        self.closed = asyncio.Event()
        """Set when a connection ends from the client's side (EOF or reset)."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook?x=1"


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head + await reader.readexactly(length)


@asynccontextmanager
async def serving(answer: Answerer, tls: ssl.SSLContext | None = None) -> AsyncIterator[Server]:
    server: Server

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        server.connections += 1
        try:
            while True:
                try:
                    server.requests.append(await read_request(reader))
                except (asyncio.IncompleteReadError, ConnectionError):
                    server.closed.set()
                    return
                if not await answer(reader, writer):
                    return
        finally:
            writer.close()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=tls)
    server = Server(srv.sockets[0].getsockname()[1])
    try:
        yield server
    finally:
        srv.close()


def replying(raw: bytes, *, keep: bool = True) -> Answerer:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(raw)
        await writer.drain()
        return keep

    return answer


OK = b"HTTP/1.1 204 No Content\r\nX-Seen: yes\r\n\r\n"


async def eventually(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


def client(allow_private: bool = True) -> Client:
    return Client(GuardedResolver(EgressPolicy(allow_private=allow_private)), connect_timeout=5)


async def post(c: Client, url: str, body: bytes = b'{"a":1}', limit: int = 1024) -> Answer:
    request = c.request(url, body=body, headers={"content-type": "application/json"})
    return await c.send(request, limit=limit)


async def test_one_connection_serves_request_after_request() -> None:
    c = client()
    async with serving(replying(OK)) as server:
        for _ in range(3):
            answer = await c.send(
                c.request(server.url, body=b"{}", headers={"webhook-id": "evt_1"}), limit=1024
            )
            assert answer.status == 204
            assert answer.header("x-seen") == "yes"
        assert server.connections == 1
        first = server.requests[0]
        assert first.startswith(b"POST /hook?x=1 HTTP/1.1\r\n")
        assert f"Host: 127.0.0.1:{server.port}\r\n".encode() in first
        assert b"webhook-id: evt_1\r\nContent-Length: 2\r\n\r\n{}" in first
    await c.close()


async def test_the_request_as_sent_is_what_the_record_keeps() -> None:
    c = client()
    request = c.request("http://r.example/h", body=b"abc", headers={"a": "b"})
    assert request.sent == (("Host", "r.example"), ("a", "b"), ("Content-Length", "3"))
    head = b"POST /h HTTP/1.1\r\nHost: r.example\r\na: b\r\nContent-Length: 3\r\n\r\n"
    assert request.data == head + b"abc"


async def test_connection_close_is_honoured() -> None:
    c = client()
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
    async with serving(replying(answer)) as server:
        for _ in range(2):
            got = await post(c, server.url)
            assert (got.status, got.body) == (200, b"ok")
        assert server.connections == 2


async def test_a_long_body_is_cut_and_its_connection_dropped_not_drained() -> None:
    written = 0
    cut = asyncio.Event()

    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        nonlocal written
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100000000\r\n\r\n")
        try:
            for _ in range(12_000):  # 98 MB at most, far more than is ever read
                writer.write(b"x" * 8192)
                await writer.drain()
                written += 8192
        except ConnectionError:
            cut.set()
        return False

    c = client()
    async with serving(endless) as server:
        got = await post(c, server.url, limit=1024)
        assert got.status == 200
        assert got.body == b"x" * 1024
        await asyncio.wait_for(cut.wait(), 10)
        assert written < 20 * 2**20, written  # what the socket buffers held, no more


async def test_chunked_and_until_close_bodies_are_read() -> None:
    c = client()
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunked += b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    async with serving(replying(chunked)) as server:
        got = await post(c, server.url)
        assert got.body == b"abcde"
        await post(c, server.url)
        assert server.connections == 1
    until_close = b"HTTP/1.1 200 OK\r\n\r\nall of it"
    async with serving(replying(until_close, keep=False)) as server:
        got = await post(c, server.url)
        assert (got.status, got.body) == (200, b"all of it")


async def test_an_interim_answer_is_passed_over() -> None:
    c = client()
    raw = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n"
    async with serving(replying(raw)) as server:
        assert (await post(c, server.url)).status == 201


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (b"", "server disconnected without an answer"),
        (b"HTTP/1.1 200 OK\r\nContent-Le", "server disconnected without an answer"),
        (b"NOT HTTP AT ALL\r\n\r\n", "malformed response"),
        (
            b"HTTP/1.1 200 OK\r\n" + b"X-Big: " + b"v" * MAX_HEAD_BYTES + b"\r\n\r\n",
            f"response headers over {MAX_HEAD_BYTES} bytes",
        ),
        (
            b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(200)) + b"\r\n",
            "more than 128 response headers",
        ),
    ],
)
async def test_a_bad_answer_is_a_response_failure(raw: bytes, says: str) -> None:
    c = client()
    async with serving(replying(raw, keep=False)) as server:
        with pytest.raises(ResponseFailed) as caught:
            await post(c, server.url)
        assert str(caught.value).startswith(says), caught.value


async def test_an_idle_connection_the_receiver_closed_is_not_reused() -> None:
    c = client()
    async with serving(replying(OK, keep=False)) as server:  # closes after each answer
        await post(c, server.url)
        await eventually(lambda: all(n.closed for idle in c._idle.values() for n in idle))
        assert (await post(c, server.url)).status == 204
        assert server.connections == 2


async def test_refused_connections_and_bad_headers() -> None:
    c = client()
    async with serving(replying(OK)) as server:
        port = server.port
    with pytest.raises(ConnectFailed) as caught:
        await post(c, f"http://127.0.0.1:{port}/gone")
    assert isinstance(caught.value.os_error, OSError)
    for bad in ("a\r\nInjected: 1", "nul\x00"):
        with pytest.raises(ValueError, match="line break or NUL"):
            c.request("http://r.example/h", body=b"", headers={"x": bad})
    with pytest.raises(ValueError, match="not a header name"):
        c.request("http://r.example/h", body=b"", headers={"a b": "c"})
    with pytest.raises(ValueError, match="not an http"):
        c.request("ftp://r.example/h", body=b"", headers={})


async def test_the_egress_guard_decides_where_names_lead() -> None:
    guarded = client(allow_private=False)
    with pytest.raises(ConnectFailed) as caught:
        await post(guarded, "http://localhost:9/h")
    assert isinstance(caught.value.os_error, EgressDenied)


async def test_tls_checks_the_certificate_unless_given_a_context(tmp_path: Path) -> None:
    ca = TestCA()
    issued = ca.issue("127.0.0.1", server=True)
    (tmp_path / "s.pem").write_text(issued.certificate)
    (tmp_path / "s.key").write_text(issued.key)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(tmp_path / "s.pem", tmp_path / "s.key")
    trusting = ssl.create_default_context(cadata=ca.pem)
    c = client()
    async with serving(replying(OK), tls=server_tls) as server:
        url = f"https://127.0.0.1:{server.port}/h"
        with pytest.raises(ConnectFailed) as caught:
            await post(c, url)
        assert isinstance(caught.value.os_error, ssl.SSLCertVerificationError)
        request = c.request(url, body=b"{}", headers={}, tls=trusting)
        assert (await c.send(request, limit=1024)).status == 204
        assert (await c.send(request, limit=1024)).status == 204
        assert server.connections == 1  # (a refused handshake never reaches the handler)


async def test_an_idle_connection_past_its_time_is_closed_by_the_next_sweep(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    c = client()
    clock = [1000.0]
    monkeypatch.setattr("herald.adapters.http1.time.monotonic", lambda: clock[0])
    async with serving(replying(OK)) as quiet, serving(replying(OK)) as busy:
        await post(c, quiet.url)
        clock[0] += http1.IDLE_SECONDS + 1  # quiet's connection has idled too long
        await post(c, busy.url)  # the sweep runs on a send
        await asyncio.wait_for(quiet.closed.wait(), 10)
        assert list(c._idle) == [("127.0.0.1", busy.port, None)]  # quiet's pool is gone
        await post(c, busy.url)
        assert (quiet.connections, busy.connections) == (1, 1)


async def test_a_connection_closed_while_the_attempt_waits_its_turn_is_replaced() -> None:
    close_now = asyncio.Event()

    async def answer_then_close_when_told(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        writer.write(OK)
        await writer.drain()
        await close_now.wait()
        return False

    c = client()
    async with serving(answer_then_close_when_told) as server:
        await post(c, server.url)
        [[kept]] = c._idle.values()

        async def turn() -> None:  # the pacing wait, during which the receiver closes
            assert not kept.closed  # taken from the pool while still open
            close_now.set()
            await eventually(lambda: kept.closed)

        request = c.request(server.url, body=b"{}", headers={})
        assert (await c.send(request, limit=1024, ready=turn)).status == 204
        assert server.connections == 2
