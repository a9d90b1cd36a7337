"""Replays the daemon runs in the background, so that a request that starts a large
one answers at once (the console's ``Replay`` button).

:meth:`Replayer.start` stores the replay (``rpl_…``) and returns it before anything
is re-queued; the re-queue runs as a named task this object tracks. :meth:`stop`
(the daemon stopping) asks every running one to end between two batches, and each
is stored ``cut_short`` with ``finished_at`` and how far it got; one that does not
end within :data:`STOP_GRACE_SECONDS` is cancelled. The CLI and the API replay in
the request (:meth:`~herald.replays.Replays.run`).
"""

from __future__ import annotations

import asyncio

import structlog

from herald.errors import Conflict
from herald.model import DeliveryFilter, Replay
from herald.replays import Replays

log = structlog.get_logger("herald.replay")

STOP_GRACE_SECONDS = 10.0
"""How long a stop waits for a running replay's current batch (one ``UPDATE`` of at
most 500 deliveries) before cancelling it."""


class Replayer:
    """The daemon's background replays: started, tracked, ended at stop."""

    def __init__(self, replays: Replays, *, rate_per_second: float | None = None) -> None:
        self._replays = replays
        self._rate = rate_per_second
        """``delivery.replay_rate_per_second``: re-queued deliveries become due at this
        pace, as for the API's and the CLI's replays."""
        self._stop = asyncio.Event()
        self._tasks: dict[str, asyncio.Task[None]] = {}

    @property
    def running(self) -> list[str]:
        """The ids of the replays re-queuing right now."""
        return sorted(self._tasks)

    async def start(self, flt: DeliveryFilter, *, by: str) -> Replay:
        """Store a replay of what ``flt`` matches and start re-queuing it; returns the
        stored replay (nothing re-queued yet). Raises what the service's checks raise,
        and Conflict once the daemon is stopping."""
        if self._stop.is_set():
            raise Conflict("Herald is stopping; replay again after it starts", code="stopping")
        record, matching = await self._replays.start(flt, by=by)
        task = asyncio.create_task(self._run(record, matching), name=f"herald-replay-{record.id}")
        self._tasks[record.id] = task
        task.add_done_callback(lambda _: self._tasks.pop(record.id, None))
        return record

    async def _run(self, record: Replay, flt: DeliveryFilter) -> None:
        try:
            await self._replays.execute(record, flt, stop=self._stop, rate_per_second=self._rate)
        except Exception as exc:
            # One replay failing (the database, say) is not the daemon failing: it is
            # stored cut short where it could be, and said loudly here.
            log.error(
                "replay_failed", replay_id=record.id, error=getattr(exc, "message", repr(exc))
            )

    async def stop(self) -> None:
        """End every running replay (between two batches; cancelled after the grace)."""
        self._stop.set()
        tasks = list(self._tasks.values())
        if not tasks:
            return
        _, late = await asyncio.wait(tasks, timeout=STOP_GRACE_SECONDS)
        for task in late:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
