"""The attempt recorder: writes finished attempts in batches, one transaction each.

An outcome that cannot be written is retried until it is, never dropped.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable

import structlog

from herald.errors import StorageError
from herald.model import AttemptRecord, Recorded
from herald.retry import retry_storage
from herald.store import Store

log = structlog.get_logger("herald.recorder")


class Recorder:
    """Batches attempt records into one transaction per flush; retries failed writes."""

    def __init__(
        self,
        store: Store,
        *,
        on_flush: Callable[[list[AttemptRecord]], None],
        on_storage: Callable[[str, bool], None] = lambda component, ok: None,
        on_recorded: Callable[[Recorded], None] = lambda recorded: None,
    ) -> None:
        self._store = store
        self._on_storage = on_storage
        self._pending: list[AttemptRecord] = []
        self._ready = asyncio.Event()
        self._on_flush = on_flush
        self._on_recorded = on_recorded
        self._idle = asyncio.Event()
        self._idle.set()
        self.storage_error: str | None = None
        """Why the last write failed while writes keep failing (/readyz shows it)."""
        self.unwritten = 0
        """Records added and not yet committed (pending, or in the write under way)."""

    def add(self, record: AttemptRecord) -> None:
        self._pending.append(record)
        self.unwritten += 1
        self._idle.clear()
        self._ready.set()

    async def run(self, stop: asyncio.Event) -> None:
        while True:
            if not self._pending:
                self._idle.set()
                if stop.is_set():
                    return
                self._ready.clear()
                waiters = [
                    asyncio.ensure_future(self._ready.wait()),
                    asyncio.ensure_future(stop.wait()),
                ]
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
                for w in waiters:
                    w.cancel()
                continue
            batch, self._pending = self._pending, []

            def trouble(exc: StorageError, delay: float, count: int = len(batch)) -> None:
                self.storage_error = exc.message
                self._on_storage("recorder", False)
                log.error("record_attempts_failed", error=exc.message, retry_in=delay, count=count)

            # An outcome that cannot be written is retried until it is, even while
            # stopping: nothing is dropped, and the batch keeps its place in line.
            recorded = await retry_storage(
                functools.partial(self._store.record_attempts, batch), on_error=trouble, first=0.05
            )
            self.storage_error = None
            self._on_storage("recorder", True)
            self.unwritten -= len(batch)
            self._on_flush(batch)
            if recorded is not None and (recorded.signals or recorded.exhausted):
                signalled(recorded)
            if recorded is not None and (
                recorded.signals or recorded.exhausted or recorded.circuits
            ):
                self._on_recorded(recorded)

    async def drained(self) -> None:
        await self._idle.wait()


def signalled(recorded: Recorded) -> None:
    """Log the operational events a committed recording wrote (one info line each,
    ``operational_event``: the attempt's own lines, such as ``delivery_exhausted``,
    are the dispatcher's)."""
    for s in recorded.signals:
        log.info(
            "operational_event",
            type=s.type,
            tenant_id=s.tenant_id,
            destination_id=s.destination_id,
            event_id=s.event_id,
            delivery_id=s.data.get("delivery_id") or s.data.get("last_delivery_id"),
        )
