"""Webhook receivers that misbehave, all on one raw-socket HTTP server in its own thread.

Each path is a behaviour. Every path answers a verification ping normally (so the
destination becomes active and its events are really attempted); everything else
gets the path's misbehaviour:

``/blackhole``  reads the request and never answers (the connection stays open)
``/slow``       answers 200 after :attr:`Hostile.slow_seconds`
``/error``      answers 500
``/reset``      resets the connection (RST) right after reading the request
``/endless``    answers 200 with a chunked body that never ends
``/huge``       answers 200 with ``Content-Length`` 1 GiB and streams it

It runs on its own event loop in a thread, so a body streamed at full speed does not
slow the test's own loop; :attr:`Hostile.requests` counts requests per path.

``python -m tests.support.hostile --port P [--slow-seconds S] [--counts FILE]`` runs
it in a process of its own (bench/isolation.py: its CPU, streaming bodies, is then
its own and not the benchmark driver's) until SIGTERM or SIGINT, and then writes the
requests per path to FILE as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import socket
import struct
import threading
from collections import Counter
from pathlib import Path

BEHAVIOURS = ("blackhole", "slow", "error", "reset", "endless", "huge")
_BLOCK = b"x" * 65536
_HUGE = 1 << 30


class Hostile:
    def __init__(self, *, slow_seconds: float = 10.0, port: int = 0) -> None:
        self.slow_seconds = slow_seconds
        self.requests: Counter[str] = Counter()
        self.port = port
        """Where it listens (0 before :meth:`start`: any free port)."""
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="hostile-receivers", daemon=True)

    def url(self, behaviour: str) -> str:
        assert behaviour in BEHAVIOURS, behaviour
        return f"http://127.0.0.1:{self.port}/{behaviour}"

    def start(self) -> Hostile:
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError("the hostile receivers did not start")
        return self

    def stop(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)

    # --- the server thread ----------------------------------------------------------
    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())
        self._loop.close()

    async def _serve(self) -> None:
        # A hand-made accept loop, not asyncio.start_server: on Python 3.11 a connection
        # accepted in the same loop turn as Server.close() fails an assertion in
        # Server._attach and its socket is dropped unclosed (a ResourceWarning, an error
        # in this suite). Here every accepted socket is ours to close.
        self._stop = stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        tasks: set[asyncio.Task[None]] = set()
        conns: set[socket.socket] = set()
        listener = socket.create_server(("127.0.0.1", self.port), backlog=1024)
        listener.setblocking(False)
        self.port = listener.getsockname()[1]

        async def accept() -> None:
            while not stop.is_set():
                conn, _ = await loop.sock_accept(listener)
                conns.add(conn)
                task = asyncio.ensure_future(self._connection(conn, conns))
                tasks.add(task)
                task.add_done_callback(tasks.discard)

        acceptor = asyncio.ensure_future(accept())
        self._started.set()
        await stop.wait()
        acceptor.cancel()
        await asyncio.gather(acceptor, return_exceptions=True)
        listener.close()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.sleep(0.1)  # let the aborted transports finish closing
        for conn in conns:
            conn.close()  # accepted, but cancelled before it had a transport

    async def _connection(self, conn: socket.socket, conns: set[socket.socket]) -> None:
        reader, writer = await asyncio.open_connection(sock=conn)
        conns.discard(conn)  # its transport closes it from here on
        await self._handle(reader, writer)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            path = lines[0].split(" ")[1].strip("/")
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            body = await reader.readexactly(length)
            self.requests[path] += 1
            if b'"destination.verification"' in body:
                await self._answer(writer, b"204 No Content", b"")
                return
            await getattr(self, f"_{path}")(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        except asyncio.CancelledError:
            writer.transport.abort()  # shutting down: drop whatever is still buffered
            raise
        finally:
            with contextlib.suppress(ConnectionError, RuntimeError):
                writer.close()

    @staticmethod
    async def _answer(writer: asyncio.StreamWriter, status: bytes, body: bytes) -> None:
        writer.write(
            b"HTTP/1.1 "
            + status
            + b"\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
            + body
        )
        await writer.drain()

    async def _blackhole(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # until the client gives up and closes

    async def _slow(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(self.slow_seconds)
        await self._answer(writer, b"200 OK", b"finally")

    async def _error(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._answer(writer, b"500 Internal Server Error", b"boom")

    async def _reset(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        # Linger 0: close() sends RST instead of FIN.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()

    async def _endless(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"%x\r\n" % len(_BLOCK) + _BLOCK + b"\r\n"
        while True:
            writer.write(chunk)
            await writer.drain()

    async def _huge(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % _HUGE)
        for _ in range(_HUGE // len(_BLOCK)):
            writer.write(_BLOCK)
            await writer.drain()


def main(argv: list[str] | None = None) -> None:
    """The receivers in a process of their own, until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(prog="python -m tests.support.hostile")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--slow-seconds", type=float, default=10.0)
    parser.add_argument("--counts", type=Path, default=None, help="requests per path, as JSON")
    args = parser.parse_args(argv)
    stop = {signal.SIGTERM, signal.SIGINT}
    # Blocked before the server thread starts, so that thread inherits the mask and the
    # signal is only ever taken by sigwait below.
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    server = Hostile(slow_seconds=args.slow_seconds, port=args.port).start()
    print(f"hostile receivers on 127.0.0.1:{server.port}", flush=True)
    signal.sigwait(stop)
    server.stop()
    if args.counts is not None:
        args.counts.write_text(json.dumps(dict(server.requests)) + "\n")


if __name__ == "__main__":
    main()
