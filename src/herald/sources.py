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
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from herald.errors import StorageError
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
        db: SourceDB,
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
        wait = self._poll
        try:
            while not stop.is_set():
                self._wake.clear()
                try:
                    moved = await self._pass()
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
                    # source, so the rows are read again once it answers.
                    log.warning("source_storage_error", source=self.name, error=exc.message)
                    await sleep_unless(stop, retry)
                    retry = min(retry * 2, RETRY_MAX_SECONDS)
                    continue
                retry = RETRY_FIRST_SECONDS
                if moved is None:  # standing by: another instance relays it
                    await sleep_unless(stop, RENEW_EVERY_SECONDS)
                    continue
                if moved >= self._batch:
                    wait = self._poll
                    continue
                # Polled while rows arrive, backing off to the idle poll when none do
                # (a notified or watched source waits for its wake-up instead).
                wait = self._poll if moved else min(wait * 2, self._idle_poll)
                timeout = self._idle_poll if self._watched and not moved else wait
                await self._sleep(stop, timeout)
        finally:
            if self._lease_until:
                with contextlib.suppress(StorageError):
                    await self._store.source_release(self.name, self._owner)
            await self.db.shutdown()

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

    async def _pass(self) -> int | None:
        """One read, relay and delete; the rows moved, or None while standing by."""
        if not await self._lease():
            if self._connected:
                self._connected = False
                await self.db.close()
            self._set("standby")
            return None
        if not self._connected:
            await self.db.open()
            self._connected = True
            if not self._watched:
                self._watched = await self.db.watch(self.wake)
        rows = await self.db.read(self._batch)
        if rows:
            done = await self._relay.relay_source(self.name, rows)
            if done is None:
                return 0  # destinations kept changing: read them again next pass
            _, relayed = done
            if relayed:
                log.info("source_rows_relayed_before", source=self.name, rows=len(relayed))
            await self.db.delete([r.seq for r in rows])
        self._set("up")
        if time.monotonic() - self._stats_at >= STATS_EVERY_SECONDS:
            self._stats_at = time.monotonic()
            self.state.pending, self.state.oldest = await self.db.stats()
            self._on_state(self.state)
        return len(rows)
