"""Attempt processes: the network half of delivery on more than one core.

One Python process makes attempts on one core. With ``delivery.worker_processes``
above 1, ``herald run`` forks that many children at start (:func:`fork_workers`; where
fork is unsafe it executes ``herald worker`` processes instead) and hands them
the attempts themselves: signing, the request, the response. Everything that
touches the database stays in the parent — the relay, the claims, the attempt
records, the API — so one process writes the database (SQLite gets no cross-process
lock contention) and the limits (``max_concurrency``, ``max_per_destination``) are
enforced where the claims are made, exactly as with one process.

Parent and child talk over the child's stdin and stdout, one JSON value per line:

- parent → child: first ``{"op":"start"}`` once the database is migrated (a forked
  child waits for it; its input ending first means the daemon gave up), then
  a flat JSON array per attempt (:func:`encode_item`: a claimed delivery and its
  event), or ``{"op": "changed"}`` (destinations changed: reload them). End of input: the
  child finishes what it has, answers, and exits.
- child → parent: first ``{"op":"ready"}`` once loaded (``herald run`` waits for
  every child before it serves), then each attempt's record as a flat array
  (:func:`encode_record`: the type, the delivery's next state, the attempt's row),
  which the parent stores with the others of its batch. The record's exchange (the
  HTTP headers) crosses as the JSON text its column holds, and the parent writes it
  as it came: it is never parsed in the daemon.

The children read the destinations (configs, decrypted secrets) from the database
themselves, as the parent does. A child that dies stops the instance (exit 1), as
any dead component does; its claimed deliveries come back with their leases.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import sys
import threading
import traceback
import zlib
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import orjson
import structlog

from herald.attempt import AttemptDone, attempt
from herald.catalog import Catalog
from herald.config import Settings
from herald.dispatch import Dispatcher
from herald.gctune import settle_after_startup
from herald.model import (
    DueDelivery,
)
from herald.retry import RetryPolicy
from herald.wire import (
    LINE_LIMIT,
    LineBatcher,
    decode_item,
    decode_record,
    encode_item,
    encode_record,
    is_item,
    read_lines,
)

log = structlog.get_logger("herald.workers")

CATALOG_POLL_SECONDS = 1.0
START = b'{"op":"start"}\n'
"""The parent's first line: the database is migrated, go and read it."""
READY = b'{"op":"ready"}\n'
"""A child's first line: loaded, catalog read, ready for attempts."""
TITLE = b"herald worker"
"""A forked child's process name (``top``, ``pgrep``; the command line stays the parent's)."""
START_TIMEOUT_SECONDS = 60.0


# --- the child ----------------------------------------------------------------------------
class WorkerParts(Protocol):
    """What an attempt process needs of its wiring (``herald.wiring.Components``)."""

    @property
    def catalog(self) -> Catalog: ...

    @property
    def policy(self) -> RetryPolicy: ...


async def serve_worker(parts: AbstractAsyncContextManager[WorkerParts]) -> int:
    """``herald worker``: make the attempts the parent sends until its input ends, with
    the catalog and policy of ``parts`` (opened once the parent says start)."""
    loop = asyncio.get_running_loop()
    # The parent decides when to stop (it closes our input once its attempts are back):
    # signals sent to the whole group (Ctrl-C, a supervisor) must not cut attempts short.
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: None)

    reader, out = await _pipe_streams(loop, read_fd=0, write_fd=1)
    # A forked child waits here until the parent has migrated the database.
    first = await reader.readline()
    if first != START:
        return 0 if not first else 2  # the parent went away before it started us
    records = LineBatcher(out, loop)

    async with parts as comp:
        await comp.catalog.refresh(force=True)
        settle_after_startup()
        out.write(READY)  # the parent waits for this before it serves
        changed = asyncio.Event()
        tasks: set[asyncio.Task[None]] = set()

        async def make(item: DueDelivery) -> None:
            record, type_id = await attempt(comp.catalog, comp.policy, item)
            records.send(encode_record(record, type_id) + b"\n")

        async def follow_catalog() -> None:
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), CATALOG_POLL_SECONDS)
                changed.clear()
                try:
                    await comp.catalog.refresh()
                except Exception as exc:  # the next poll retries
                    log.warning("catalog_refresh_failed", error=repr(exc))

        follower = asyncio.create_task(follow_catalog(), name="herald-worker-catalog")
        try:
            async for lines in read_lines(reader):
                for line in lines:
                    if not is_item(line):
                        if orjson.loads(line)["op"] == "changed":
                            changed.set()
                        continue
                    task = loop.create_task(make(decode_item(line)))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                await out.drain()  # at most the parent's in-flight limit waits to be read
            await asyncio.gather(*tasks)
            records.flush()
            await out.drain()
        finally:
            follower.cancel()
            await asyncio.gather(follower, return_exceptions=True)
            out.close()
    return 0


async def _pipe_streams(
    loop: asyncio.AbstractEventLoop, *, read_fd: int, write_fd: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Stream reader and writer over two pipe ends (the file descriptors pass to them)."""
    reader = asyncio.StreamReader(limit=LINE_LIMIT)
    await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_fd, "rb", buffering=0)
    )
    transport, protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, os.fdopen(write_fd, "wb", buffering=0)
    )
    return reader, asyncio.StreamWriter(transport, protocol, None, loop)


# --- forking the children -----------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Forked:
    """A child forked by :func:`fork_workers`, waiting for :data:`START`."""

    pid: int
    stdin: int
    """The parent's end of the child's input."""
    stdout: int
    """The parent's end of the child's output."""


def fork_workers(count: int, child_main: Callable[[], int]) -> list[Forked] | None:
    """Fork ``count`` attempt processes that run ``child_main`` on their own pipes.

    Called by ``herald run`` before it starts an event loop or a thread: a child then
    begins with every module imported, where a ``herald worker`` it would execute
    spends a third of a second importing them again (a third of the daemon's start).
    None where fork is not available or not safe (a thread runs already): the pool
    then starts ``herald worker`` processes instead.
    """
    if not hasattr(os, "fork") or threading.active_count() > 1:
        return None
    sys.stdout.flush()
    sys.stderr.flush()
    children: list[Forked] = []
    for _ in range(count):
        child_in, parent_out = os.pipe()
        parent_in, child_out = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child, which never returns
            code = 1
            try:
                os.close(parent_out)
                os.close(parent_in)
                for sibling in children:
                    os.close(sibling.stdin)
                    os.close(sibling.stdout)
                os.dup2(child_in, 0)
                os.dup2(child_out, 1)
                os.close(child_in)
                os.close(child_out)
                _become_worker()
                code = child_main()
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stderr.flush()
                os._exit(code)
        os.close(child_in)
        os.close(child_out)
        children.append(Forked(pid, parent_out, parent_in))
    return children


def _become_worker() -> None:
    """Signals are the parent's to act on (it closes our input to stop us); and a name
    of our own for ``top`` and ``pgrep``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with contextlib.suppress(Exception):  # Linux only, and only cosmetic
        # The process's own symbols include libc's (find_library would run ldconfig).
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, ctypes.c_char_p(TITLE), 0, 0, 0)  # PR_SET_NAME


class _Process(Protocol):
    """What the pool needs of a child: asyncio's Process, or a forked one."""

    pid: int
    stdin: asyncio.StreamWriter | None
    stdout: asyncio.StreamReader | None

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...

    def kill(self) -> None: ...


class ForkedProcess:
    """A forked child as the pool drives it, like asyncio's Process: pipes and exit."""

    def __init__(self, pid: int, stdin: asyncio.StreamWriter, stdout: asyncio.StreamReader) -> None:
        self.pid = pid
        self.stdin: asyncio.StreamWriter | None = stdin
        self.stdout: asyncio.StreamReader | None = stdout
        self._exit: asyncio.Future[tuple[int, int]] | None = None
        self._returncode: int | None = None

    @classmethod
    async def attach(cls, child: Forked) -> ForkedProcess:
        loop = asyncio.get_running_loop()
        reader, writer = await _pipe_streams(loop, read_fd=child.stdout, write_fd=child.stdin)
        return cls(child.pid, writer, reader)

    @property
    def returncode(self) -> int | None:
        return self._returncode

    async def wait(self) -> int:
        if self._exit is None:
            # One waiting thread per child, as asyncio's own child watcher does.
            self._exit = asyncio.ensure_future(asyncio.to_thread(os.waitpid, self.pid, 0))
        _, status = await asyncio.shield(self._exit)
        self._returncode = os.waitstatus_to_exitcode(status)
        return self._returncode

    def kill(self) -> None:
        if self._returncode is None:
            os.kill(self.pid, signal.SIGKILL)


# --- the parent ---------------------------------------------------------------------------
@dataclass(slots=True)
class _Child:
    index: int
    proc: _Process
    input: LineBatcher = field(repr=False)
    """The child's stdin, a line per attempt, written once per loop turn."""
    waiting: dict[str, tuple[DueDelivery, AttemptDone]] = field(default_factory=dict)
    """Sent and not answered yet, by delivery id."""
    reader: asyncio.Task[None] | None = field(default=None, repr=False)


class WorkerPool:
    """The parent's side: starts the children and sends each attempt to one of them."""

    def __init__(
        self,
        settings: Settings,
        *,
        config_path: Path | None,
        forked: list[Forked] | None = None,
        pinned: Callable[[str], bool] = lambda destination_id: False,
    ) -> None:
        self._settings = settings
        self._pinned = pinned
        """Destinations whose attempts all go to one child (a rate paced on the wire,
        herald.flow.Pacer, needs to see them all)."""
        self._config_path = config_path
        self._forked = forked
        """Children forked at start-up (:func:`fork_workers`); else they are executed."""
        self._children: list[_Child] = []
        # Looked up once: asyncio.get_running_loop() makes a getpid() system call.
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def pids(self) -> list[int]:
        return [c.proc.pid for c in self._children]

    async def start(self, *, timeout: float = START_TIMEOUT_SECONDS) -> None:
        """Start the children and wait until each has loaded and said so: attempts
        handed out before would wait for a child's imports (a second or so)."""
        self._loop = asyncio.get_running_loop()
        argv = [sys.executable, "-m", "herald", "worker"]
        if self._config_path is not None:
            argv += ["--config", str(self._config_path)]
        try:
            for index in range(1, self._settings.delivery.worker_processes + 1):
                proc: _Process
                if self._forked is not None:
                    proc = await ForkedProcess.attach(self._forked[index - 1])
                else:
                    proc = await asyncio.create_subprocess_exec(
                        *argv,
                        stdin=asyncio.subprocess.PIPE,
                        stdout=asyncio.subprocess.PIPE,
                        limit=LINE_LIMIT,
                    )
                assert proc.stdin is not None
                self._children.append(_Child(index, proc, LineBatcher(proc.stdin, self._loop)))
                proc.stdin.write(START)
            async with asyncio.timeout(timeout):
                await asyncio.gather(*(self._ready(c) for c in self._children))
        except BaseException:
            await self._kill_all()
            raise
        for child in self._children:
            child.reader = asyncio.create_task(
                self._read(child), name=f"herald-worker-{child.index}"
            )
        log.info("workers_started", pids=self.pids)

    @staticmethod
    async def _ready(child: _Child) -> None:
        assert child.proc.stdout is not None
        line = await child.proc.stdout.readline()
        if line != READY:
            code = await child.proc.wait() if not line else None
            raise RuntimeError(
                f"worker process {child.index} (pid {child.proc.pid}) did not start"
                + (f": exited {code}" if code is not None else f": said {line[:200]!r}")
            )

    async def _kill_all(self) -> None:
        for child in self._children:
            with contextlib.suppress(ProcessLookupError):
                child.proc.kill()
            await child.proc.wait()

    def submit(self, item: DueDelivery, done: AttemptDone) -> None:
        """Have the least busy child (a pinned destination's own) attempt ``item``;
        ``done`` gets its record (later, never from within this call)."""
        children = self._children
        if self._pinned(item.destination_id):
            child = children[zlib.crc32(item.destination_id.encode()) % len(children)]
        else:
            child = children[0]
            for other in children:
                if len(other.waiting) < len(child.waiting):
                    child = other
        assert self._loop is not None  # started
        stdin = child.proc.stdin
        if stdin is None or stdin.is_closing() or child.reader is None or child.reader.done():
            gone = RuntimeError(f"worker process {child.index} is gone")
            self._loop.call_soon(done, item, gone)
            return
        child.waiting[item.id] = (item, done)
        child.input.send(encode_item(item) + b"\n")

    def changed(self) -> None:
        for child in self._children:
            child.input.send(b'{"op":"changed"}\n')

    async def _read(self, child: _Child) -> None:
        assert child.proc.stdout is not None
        try:
            async for lines in read_lines(child.proc.stdout):
                for line in lines:
                    delivery_id, record, type_id = decode_record(line)
                    sent = child.waiting.pop(delivery_id, None)
                    if sent is not None:
                        item, done = sent
                        record.item = item  # not sent over the pipe: the parent has it
                        done(item, (record, type_id))
        finally:
            gone = RuntimeError(f"worker process {child.index} stopped answering")
            unanswered, child.waiting = child.waiting, {}
            for item, done in unanswered.values():
                done(item, gone)

    async def supervise(self) -> None:
        """Return never; raise as soon as a child exits or stops answering."""
        readers = {c.reader: c for c in self._children if c.reader is not None}
        done, _ = await asyncio.wait(readers, return_when=asyncio.FIRST_COMPLETED)
        child = readers[next(iter(done))]
        code = await child.proc.wait()
        raise RuntimeError(f"worker process {child.index} (pid {child.proc.pid}) exited: {code}")

    async def stop(self) -> None:
        """Close the children's input (they finish, answer and exit); wait for them."""
        for child in self._children:
            child.input.flush()
            if child.proc.stdin is not None and not child.proc.stdin.is_closing():
                child.proc.stdin.close()
        grace = self._settings.delivery.shutdown_grace_seconds + 10
        for child in self._children:
            try:
                await asyncio.wait_for(child.proc.wait(), grace)
            except TimeoutError:
                log.error("worker_stop_timeout", worker=child.index, pid=child.proc.pid)
                with contextlib.suppress(ProcessLookupError):
                    child.proc.kill()
                await child.proc.wait()
            if child.reader is not None:
                await asyncio.gather(child.reader, return_exceptions=True)
        log.info("workers_stopped", exit_codes=[c.proc.returncode for c in self._children])


async def run_dispatcher(
    dispatcher: Dispatcher, pool: WorkerPool | None, stop: asyncio.Event
) -> None:
    """The dispatcher's task, with its attempt processes when there are any."""
    if pool is None:
        await dispatcher.run(stop)
        return
    try:
        engine = asyncio.create_task(dispatcher.run(stop), name="herald-dispatcher-engine")
        watch = asyncio.create_task(pool.supervise(), name="herald-worker-supervisor")
        await asyncio.wait([engine, watch], return_when=asyncio.FIRST_COMPLETED)
        if watch.done():
            stop.set()  # the instance cannot go on without the child: stop it, exit 1
            await asyncio.gather(engine, return_exceptions=True)
            watch.result()  # raises why
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)
        engine.result()
    finally:
        await pool.stop()
