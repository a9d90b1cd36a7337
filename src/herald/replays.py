"""Replays: re-queueing every delivery a filter matches, for a fresh round of attempts.

Every replay that re-queues (the CLI's, the API's, the console's) is stored as a
:class:`~herald.model.Replay` (``rpl_…``, ``herald_replays``) before its first batch,
and the deliveries it re-queues carry its id, so its outcome is counted later from
``herald_deliveries_replay``, a partial index of the re-queued deliveries only.
The service layer reaches it as ``DestinationService.replays``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import structlog

from herald.errors import NotFound
from herald.fields import check_event_types
from herald.ids import new_id
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
        check_event_types(flt.event_types)
        # Only event deliveries are replayed (verifications and test pings are not):
        # count and sample just those, so a dry run says what a real run re-queues.
        flt = replace(flt, kind=DeliveryKind.EVENT)
        total = await self.store.count_deliveries(flt)
        sample = await self.store.list_deliveries(flt, before_id=None, limit=sample_size)
        record: Replay | None = None
        if not dry_run:
            record = Replay(
                id=new_id("rpl_"),
                tenant_id=flt.tenant_id,
                filter=replay_filter(flt),
                by=by,
                created_at=time.time(),
                matched=total,
            )
            await self.store.create_replay(record)
            requeued = 0
            if total:
                requeued = await self._requeue_matching(
                    flt, total, rate_per_second, progress, record.id
                )
            finished = time.time()
            await self.store.update_replay(record.id, requeued=requeued, finished_at=finished)
            # In the database, not this process: the daemons' /metrics count CLI replays.
            await self.store.count_replay(replay_source(by), requeued)
            record = replace(
                record,
                requeued=requeued,
                finished_at=finished,
                outcome=ReplayOutcome(pending=requeued),
            )
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
            dry_run=dry_run,
            matched=total,
            requeued=0 if record is None else record.requeued,
            rate_per_second=rate_per_second or None,
        )
        return ReplayResult(
            total, 0 if record is None else record.requeued, sample, dry_run, record
        )

    async def _requeue_matching(
        self,
        flt: DeliveryFilter,
        total: int,
        rate_per_second: float | None,
        progress: Callable[[int, int], None],
        replay_id: str,
    ) -> int:
        step = max(int(rate_per_second), 1) if rate_per_second else None
        requeued = 0
        seen = 0
        before: str | None = None
        started = time.time()
        while True:
            batch = await self.store.list_deliveries(flt, before_id=before, limit=REPLAY_BATCH)
            if not batch:
                break
            # Deliveries created after the replay began are not part of it.
            ids = [d.id for d in batch if d.created_at <= started]
            chunks = (
                [ids] if step is None else [ids[i : i + step] for i in range(0, len(ids), step)]
            )
            for chunk in chunks:
                due = time.time() if step is None else started + requeued // step
                requeued += await self.store.requeue(chunk, now=due, replay_id=replay_id)
            seen += len(batch)
            before = batch[-1].id
            # Progress is stored as it goes: a console follows a large replay from it.
            await self.store.update_replay(replay_id, requeued=requeued, finished_at=None)
            progress(min(seen, total), total)
            self.on_change()
        return requeued

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
