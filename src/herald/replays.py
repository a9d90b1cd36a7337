"""Replays: re-queueing every delivery a filter matches, for a fresh round of attempts.

Every replay that re-queues (the CLI's, the API's, the console's) is stored as a
:class:`~herald.model.Replay` (``rpl_…``, ``herald_replays``) before its first batch,
and the deliveries it re-queues carry its id, so its outcome is counted later from
``herald_deliveries_replay``, a partial index of the re-queued deliveries only.
The service layer reaches it as ``Operations.replays``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import structlog

from herald.errors import HeraldError, NotFound
from herald.fields import check_event_types
from herald.ids import new_id
from herald.logs import ALWAYS
from herald.metrics import replay_source
from herald.model import DeliveryFilter, DeliveryKind, Replay, ReplayOutcome, ReplayResult
from herald.store import Store
from herald.timeutil import format_epoch

REPLAY_BATCH = 500
REPLAY_IDS_KEPT = 100

replay_log = structlog.get_logger("herald.replay")


def replay_filter(flt: DeliveryFilter) -> dict[str, Any]:
    """The filter a replay used, as stored with it and shown in its JSON: the fields
    that narrowed it, with times as RFC 3339 text."""
    out: dict[str, Any] = {}
    if flt.destination_id is not None:
        out["destination_id"] = flt.destination_id
    if flt.status is not None:
        out["status"] = flt.status.value
    if flt.event_types:
        out["event_types"] = list(flt.event_types)
    if flt.replay_id is not None:
        out["replay_id"] = flt.replay_id
    if flt.since is not None:
        out["since"] = format_epoch(flt.since)
    if flt.until is not None:
        out["until"] = format_epoch(flt.until)
    if flt.ids:
        # An ids file may name thousands: the row keeps how many, and the first few.
        out["delivery_ids"] = list(flt.ids[:REPLAY_IDS_KEPT])
        if len(flt.ids) > REPLAY_IDS_KEPT:
            out["delivery_id_count"] = len(flt.ids)
    return out


@dataclass(slots=True)
class _Run:
    """How far a running replay got: what it re-queued, and whether a stop ended it."""

    requeued: int = 0
    cut_short: bool = False


def _log(
    flt: DeliveryFilter,
    *,
    by: str,
    matched: int,
    rate_per_second: float | None,
    record: Replay | None = None,
) -> None:
    """The one audit line of a replay, dry (``record`` None) or ended."""
    cut = {"cut_short": True} if record is not None and record.cut_short else {}
    replay_log.info(
        "replay",
        by=by,
        replay_id=None if record is None else record.id,
        tenant_id=flt.tenant_id,
        destination_id=flt.destination_id,
        status=flt.status.value if flt.status else None,
        event_types=list(flt.event_types),
        since=format_epoch(flt.since) if flt.since is not None else None,
        until=format_epoch(flt.until) if flt.until is not None else None,
        ids=len(flt.ids),
        dry_run=record is None,
        matched=matched,
        requeued=0 if record is None else record.requeued,
        rate_per_second=rate_per_second or None,
        **cut,
        **{ALWAYS: True},
    )


class Replays:
    """Replays over one store: run one, read one, list them.

    ``on_change`` is called after each batch re-queued (it wakes a daemon's
    dispatcher when the replay runs inside it)."""

    def __init__(self, store: Store, *, on_change: Callable[[], None] = lambda: None) -> None:
        self.store = store
        self.on_change = on_change

    async def run(
        self,
        flt: DeliveryFilter,
        *,
        by: str = "service",
        dry_run: bool = False,
        sample_size: int = 5,
        rate_per_second: float | None = None,
        progress: Callable[[int, int], None] = lambda done, total: None,
    ) -> ReplayResult:
        """Re-queue every delivery matching ``flt``, in batches; ``dry_run`` only counts.

        Every replay that re-queues (the CLI's, the API's, the console's) is stored as
        a :class:`Replay` with an id (``rpl_…``) before its first batch, and the
        deliveries it re-queues carry that id, so its outcome can be counted later
        (:meth:`get`). ``flt.tenant_id`` None is an operator-wide replay. A dry
        run stores nothing.

        With ``rate_per_second``, re-queued deliveries become due in one-second
        steps of that many, so a large replay never floods a recovering endpoint.
        ``by`` says who asked (``cli:<OS user>``, ``api:<tenant>``); every replay,
        dry or not, is logged here once with who, the filter and how many, so the
        CLI and the API cannot drift apart in what the audit trail records.
        """
        flt = self._matching(flt)
        # Both read the same rows: side by side (PostgreSQL's pool runs them at once).
        total, sample = await asyncio.gather(
            self.store.count_deliveries(flt),
            self.store.list_deliveries(flt, before_id=None, limit=sample_size),
        )
        if dry_run:
            _log(flt, by=by, matched=total, rate_per_second=rate_per_second)
            return ReplayResult(total, 0, sample, True)
        record = await self._store(flt, total, by)
        record = await self.execute(record, flt, rate_per_second=rate_per_second, progress=progress)
        return ReplayResult(total, record.requeued, sample, False, record)

    async def start(self, flt: DeliveryFilter, *, by: str) -> tuple[Replay, DeliveryFilter]:
        """Store a replay of what ``flt`` matches and return it, with the filter to run
        it with, before anything is re-queued: the caller runs :meth:`execute` (the
        daemon's :class:`~herald.replayer.Replayer` does, in the background)."""
        flt = self._matching(flt)
        return await self._store(flt, await self.store.count_deliveries(flt), by), flt

    @staticmethod
    def _matching(flt: DeliveryFilter) -> DeliveryFilter:
        check_event_types(flt.event_types)
        # Only event deliveries are replayed (verifications and test pings are not):
        # count and sample just those, so a dry run says what a real run re-queues.
        return replace(flt, kind=DeliveryKind.EVENT)

    async def _store(self, flt: DeliveryFilter, total: int, by: str) -> Replay:
        record = Replay(
            id=new_id("rpl_"),
            tenant_id=flt.tenant_id,
            filter=replay_filter(flt),
            by=by,
            created_at=time.time(),
            matched=total,
        )
        await self.store.create_replay(record)
        return record

    async def execute(
        self,
        record: Replay,
        flt: DeliveryFilter,
        *,
        rate_per_second: float | None = None,
        progress: Callable[[int, int], None] = lambda done, total: None,
        stop: asyncio.Event | None = None,
    ) -> Replay:
        """Re-queue what a stored replay matches (``flt`` from :meth:`start`), storing
        its progress as it goes and its end; returns it as it ended.

        ``stop`` set (the daemon stopping) ends it between two batches: it is stored
        ``cut_short``, with ``finished_at`` and how far it got."""
        run = _Run()
        try:
            if record.matched:
                await self._requeue_matching(flt, record, run, rate_per_second, progress, stop)
        except (HeraldError, asyncio.CancelledError):
            # A database error, or a stop that could not wait for the batch: it ends cut
            # short, as far as it got (if the database lets that be stored).
            with contextlib.suppress(HeraldError):
                await self.store.update_replay(
                    record.id, requeued=run.requeued, finished_at=time.time(), cut_short=True
                )
            raise
        finished = time.time()
        await self.store.update_replay(
            record.id, requeued=run.requeued, finished_at=finished, cut_short=run.cut_short
        )
        # In the database, not this process: the daemons' /metrics count CLI replays.
        await self.store.count_replay(replay_source(record.by), run.requeued)
        record = replace(
            record,
            requeued=run.requeued,
            finished_at=finished,
            cut_short=run.cut_short,
            outcome=ReplayOutcome(pending=run.requeued),
        )
        _log(
            flt,
            by=record.by,
            matched=record.matched,
            record=record,
            rate_per_second=rate_per_second,
        )
        return record

    async def _requeue_matching(
        self,
        flt: DeliveryFilter,
        record: Replay,
        run: _Run,
        rate_per_second: float | None,
        progress: Callable[[int, int], None],
        stop: asyncio.Event | None,
    ) -> None:
        """Re-queue in batches, counting in ``run`` as it goes."""
        step = max(int(rate_per_second), 1) if rate_per_second else None
        total = record.matched
        seen = 0
        before: str | None = None
        started = time.time()
        while True:
            if stop is not None and stop.is_set():
                run.cut_short = True
                return
            batch = await self.store.list_deliveries(flt, before_id=before, limit=REPLAY_BATCH)
            if not batch:
                break
            # Deliveries created after the replay began are not part of it.
            ids = [d.id for d in batch if d.created_at <= started]
            chunks = (
                [ids] if step is None else [ids[i : i + step] for i in range(0, len(ids), step)]
            )
            for chunk in chunks:
                due = time.time() if step is None else started + run.requeued // step
                run.requeued += await self.store.requeue(chunk, now=due, replay_id=record.id)
            seen += len(batch)
            before = batch[-1].id
            # Progress is stored as it goes: a console follows a large replay from it.
            await self.store.update_replay(record.id, requeued=run.requeued, finished_at=None)
            progress(min(seen, total), total)
            self.on_change()

    async def get(self, tenant_id: str | None, replay_id: str) -> Replay:
        """A replay with its deliveries counted by status now; a tenant sees only its
        own (``tenant_id`` None: an operator, who sees every one)."""
        replay = await self.store.get_replay(tenant_id, replay_id)
        if replay is None:
            raise NotFound(f"no replay {replay_id}", code="replay_not_found")
        return replay

    async def page(
        self, tenant_id: str | None, *, before_id: str | None = None, limit: int = 20
    ) -> tuple[list[Replay], bool]:
        """Replays newest first with their outcomes (every tenant's if ``tenant_id`` is None)."""
        rows = await self.store.list_replays(
            tenant_id=tenant_id, before_id=before_id, limit=limit + 1
        )
        return rows[:limit], len(rows) > limit
