"""Outbox sources: rows of producers' own databases in, through the relay.

One :class:`SourceReader` per ``[[outbox.sources]]`` entry. It reads every row the
source's table holds, in ``seq`` order, hands them to the relay (which commits
their events and deliveries, or their rejection naming the source, in Herald's
database) and only then deletes them from the source. It keeps no high-water
mark: a producer's row whose ``seq`` was taken before a higher one's but committed
after is still there at the next read, and is relayed then. A crash between
Herald's commit and the source's delete leaves rows that are read again; the store
knows their events (the same tenant, id, type and data) and they are only deleted.

A source that is down or wrong never stops the daemon: the reader says so once
per change of state, retries with backoff, and the others go on. On a database
several instances share (PostgreSQL) one instance at a time relays each source,
under a lease in Herald's database that another takes over once it runs out.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from herald.errors import StorageError
from herald.model import OutboxRow
from herald.outbox import Relay, sleep_unless
from herald.sourcedb import SourceDB, SourceError
from herald.store import Store

log = structlog.get_logger("herald.sources")

LEASE_SECONDS = 15.0
"""How long an instance's hold on relaying a source lasts unless renewed; a killed
instance's source is taken over by another after at most this long."""
RENEW_EVERY_SECONDS = LEASE_SECONDS / 3
RETRY_FIRST_SECONDS = 0.5
RETRY_MAX_SECONDS = 30.0
STATS_EVERY_SECONDS = 5.0


@dataclass(slots=True)
class SourceState:
    """What ``herald outbox sources`` and the metrics say of one source."""

    name: str
    dialect: str
    table: str
    state: str = "starting"
    """``starting``, ``up``, ``down`` (``error`` says why) or ``standby`` (another
    instance holds the lease)."""
    error: str | None = None
    pending: int | None = None
    oldest: float | None = None
    """``created_at`` epoch of the oldest row waiting, if any."""

    def as_dict(self) -> dict[str, object]:
        lag = 0.0 if self.oldest is None else max(0.0, time.time() - self.oldest)
        return {
            "name": self.name,
            "dialect": self.dialect,
            "table": self.table,
            "state": self.state,
            "error": self.error,
            "pending": self.pending,
            "lag_seconds": round(lag, 3),
        }


class SourceReader:
    """Relays one outbox source until stopped."""

    def __init__(
        self,
        db: SourceDB[Any],
        relay: Relay,
        store: Store,
        *,
        owner: str,
        batch_size: int,
        poll_interval: float,
        idle_poll: float,
        on_state: Callable[[SourceState], None] = lambda state: None,
        on_error: Callable[[str], None] = lambda name: None,
    ) -> None:
        self.db = db
        self._relay = relay
        self._store = store
        self._owner = owner
        self._batch = batch_size
        self._poll = poll_interval
        self._idle_poll = max(idle_poll, poll_interval)
        self._on_state = on_state
        self._on_error = on_error
        """Told of each failed round trip with the source (a storage error count)."""
        self._wake = asyncio.Event()
        self._read_at = 0.0
        """When the last read started (``time.monotonic()``): polls are spaced from it."""
        self._interval = poll_interval
        self._connected = False
        self._watched = False
        self._lease_until = 0.0
        self._stats_at = 0.0
        s = db.settings
        self.state = SourceState(name=s.name, dialect=s.dialect, table=s.table)

    @property
    def name(self) -> str:
        return self.db.name

    def wake(self) -> None:
        self._wake.set()

    def _set(self, state: str, error: str | None = None) -> None:
        if (state, error) == (self.state.state, self.state.error):
            return
        before = self.state.state
        self.state.state, self.state.error = state, error
        if state == "down":
            log.warning("source_down", source=self.name, error=error, was=before)
        else:
            log.info(f"source_{state}", source=self.name, was=before)
        self._on_state(self.state)

    async def run(self, stop: asyncio.Event) -> None:
        retry = RETRY_FIRST_SECONDS
        try:
            while not stop.is_set():
                try:
                    stopping = await self._drain(stop)
                except SourceError as exc:
                    self._on_error(self.name)
                    self._connected = False
                    await self.db.close()
                    self._set("down", exc.message)
                    await sleep_unless(stop, retry)
                    retry = min(retry * 2, RETRY_MAX_SECONDS)
                    continue
                except StorageError as exc:
                    # Herald's own database is away: nothing was deleted from the
                    # source that it had not committed, so the rest is read again.
                    log.warning("source_storage_error", source=self.name, error=exc.message)
                    await sleep_unless(stop, retry)
                    retry = min(retry * 2, RETRY_MAX_SECONDS)
                    continue
                retry = RETRY_FIRST_SECONDS
                if not stopping:  # another instance relays it
                    if self._connected:
                        self._connected = False
                        await self.db.close()
                    self._set("standby")
                    await sleep_unless(stop, RENEW_EVERY_SECONDS)
        finally:
            if self._lease_until:
                with contextlib.suppress(StorageError):
                    await self._store.source_release(self.name, self._owner)
            await self.db.shutdown()

    async def _drain(self, stop: asyncio.Event) -> bool:
        """Read, relay and delete, batch after batch, until ``stop`` (True) or another
        instance holds the lease (False); a failure of the source raises
        :class:`SourceError`, one of Herald's database :class:`StorageError`.

        While rows come in full batches (a backlog), three steps overlap: batch N is
        committed in Herald's database while batch N+1 is read and batch N-1 deleted
        from the source, on a connection of its own. A batch is deleted only after its
        commit returned, one delete at a time, in order. A read leaves out the ``seq``
        ranges of the batches still in flight (the one being committed, the one being
        deleted), nothing else: a row of such a range that committed late is read once
        its batch is gone. Once a batch is not full, the next read waits for the commit
        of this one (and the poll, or a wake-up), so that it takes every row committed
        meanwhile: a batch's commit costs more than a read."""
        deleting: tuple[asyncio.Task[None], tuple[int, int]] | None = None
        reading = asyncio.ensure_future(self._read(stop, (), wait=False, found=False))
        try:
            while True:
                rows = await reading
                if rows is None:
                    if deleting is not None:
                        await deleting[0]  # its batch committed: finish its delete
                    return stop.is_set()
                full = len(rows) >= self._batch
                if full:  # read the next batch while this one is committed
                    spans = [(rows[0].seq, rows[-1].seq)]
                    if deleting is not None:
                        spans.append(deleting[1])
                    reading = asyncio.ensure_future(self._read(stop, spans, wait=False, found=True))
                if rows:
                    deleting = await self._relay_rows(rows, deleting)
                if not full:
                    spans = [deleting[1]] if deleting is not None else []
                    reading = asyncio.ensure_future(
                        self._read(stop, spans, wait=True, found=bool(rows))
                    )
        finally:
            # On a failure, what is cut short is read again and known (never lost).
            pending: list[asyncio.Future[Any]] = [reading]
            if deleting is not None:
                pending.append(deleting[0])
            for future in pending:
                future.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    async def _relay_rows(
        self,
        rows: list[OutboxRow],
        deleting: tuple[asyncio.Task[None], tuple[int, int]] | None,
    ) -> tuple[asyncio.Task[None], tuple[int, int]] | None:
        """Commit ``rows`` in Herald's database, then start their delete from the
        source once the batch before's has ended; the delete under way."""
        done = await self._relay.relay_source(self.name, rows)
        if done is None:
            return deleting  # destinations kept changing, nothing written: read again
        if done[1]:
            log.info("source_rows_relayed_before", source=self.name, rows=len(done[1]))
        if deleting is not None:
            await deleting[0]
        task = asyncio.ensure_future(self.db.delete([r.seq for r in rows]))
        return task, (rows[0].seq, rows[-1].seq)

    async def _read(
        self,
        stop: asyncio.Event,
        exclude: Sequence[tuple[int, int]],
        *,
        wait: bool,
        found: bool,
    ) -> list[OutboxRow] | None:
        """The next batch, none of the ``exclude`` ranges; None when stopping or when
        another instance holds the lease. With ``wait`` (the last batch was not full),
        first wait: ``poll_interval`` from the last read's start while rows arrive
        (``found``), doubling to ``idle_poll`` while none do; a notified or watched
        source waits for its wake-up instead, or ``idle_poll`` in case one was lost."""
        if wait:
            if found:
                self._interval = self._poll
                timeout = self._poll
            else:
                self._interval = min(self._interval * 2, self._idle_poll)
                timeout = self._idle_poll if self._watched else self._interval
            left = self._read_at + timeout - time.monotonic()
            if left > 0 and not self._wake.is_set():
                await self._sleep(stop, left)
        if stop.is_set() or not await self._lease():
            return None
        if not self._connected:
            await self.db.open()
            self._connected = True
            if not self._watched:
                self._watched = await self.db.watch(self.wake)
        # Cleared before the read: rows committed during it wake the next one.
        self._wake.clear()
        self._read_at = time.monotonic()
        rows = await self.db.read(self._batch, exclude)
        self._set("up")
        if self._read_at - self._stats_at >= STATS_EVERY_SECONDS:
            self._stats_at = self._read_at
            self.state.pending, self.state.oldest = await self.db.stats()
            self._on_state(self.state)
        return rows

    async def _sleep(self, stop: asyncio.Event, timeout: float) -> None:
        waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._wake.wait())]
        try:
            await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()

    async def _lease(self) -> bool:
        """Whether this instance relays the source now (always, on an unshared store)."""
        if not self._store.shared:
            return True
        now = time.time()
        if now < self._lease_until - (LEASE_SECONDS - RENEW_EVERY_SECONDS):
            return True
        if await self._store.source_lease(
            self.name, self._owner, until=now + LEASE_SECONDS, now=now
        ):
            self._lease_until = now + LEASE_SECONDS
            return True
        self._lease_until = 0.0
        return False
