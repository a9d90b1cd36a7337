"""The daemon's background replays, on both backends: a started replay is stored and
returned before it re-queues, runs to its end as a tracked task, and a stop ends it
between two batches, stored cut short with how far it got."""

from __future__ import annotations

import asyncio
import time

import pytest

from herald.errors import Conflict
from herald.model import DeliveryFilter, DeliveryStatus, Replay
from herald.replayer import Replayer
from tests.integration.conftest import Harness, eventually
from tests.integration.test_store import delivery, event


async def failed_deliveries(h: Harness, count: int) -> str:
    """``count`` failed event deliveries of one destination; its id."""
    dest = await h.add_webhook("http://127.0.0.1:1/", events=("a.b",))
    events = [event(i) for i in range(count)]
    await h.store.insert_deliveries(events, [delivery(e, dest) for e in events])
    h.rows(
        "UPDATE herald_deliveries SET status = 'failure', next_attempt_at = NULL,"
        " attempt_count = 1 WHERE destination_id = ?",
        (dest.id,),
    )
    return dest.id


async def test_a_started_replay_answers_at_once_and_runs_to_its_end(harness: Harness) -> None:
    h = harness
    dest_id = await failed_deliveries(h, 1200)
    replayer = Replayer(h.service.replays)
    flt = DeliveryFilter(tenant_id="default", status=DeliveryStatus.FAILURE)
    started = await replayer.start(flt, by="console:test")
    assert (started.matched, started.requeued, started.finished_at) == (1200, 0, None)
    assert replayer.running == [started.id]

    async def finished() -> bool:
        return (await h.service.replays.get(None, started.id)).finished_at is not None

    await eventually(finished, timeout=20, what="the replay finished")
    done = await h.service.replays.get("default", started.id)
    assert (done.requeued, done.cut_short, done.outcome.pending) == (1200, False, 1200)
    assert done.filter == {"status": "failure"}
    assert (
        h.scalar(
            "SELECT COUNT(*) FROM herald_deliveries WHERE destination_id = ? AND replay_id = ?",
            (dest_id, started.id),
        )
        == 1200
    )

    async def untracked() -> bool:
        return replayer.running == []

    await eventually(untracked, timeout=5, what="the task forgotten")
    await replayer.stop()


async def test_a_stop_cuts_a_running_replay_short(harness: Harness) -> None:
    h = harness
    await failed_deliveries(h, 1200)
    replayer = Replayer(h.service.replays)
    flt = DeliveryFilter(tenant_id="default", status=DeliveryStatus.FAILURE)
    started = await replayer.start(flt, by="console:test")
    t0 = time.time()
    await replayer.stop()
    stopped = await h.service.replays.get(None, started.id)
    assert stopped.cut_short
    assert stopped.finished_at is not None
    assert t0 <= stopped.finished_at <= time.time()
    # It ends between two batches (of 500): how far it got is what it re-queued.
    assert stopped.requeued < 1200
    assert stopped.requeued == stopped.outcome.pending
    assert replayer.running == []
    with pytest.raises(Conflict) as refused:
        await replayer.start(flt, by="console:test")
    assert refused.value.code == "stopping"


async def test_a_replay_cancelled_mid_run_is_stored_cut_short(harness: Harness) -> None:
    """A stop that cannot wait (the grace is over) cancels the task between its
    awaits: the replay still ends cut short, with what it had re-queued."""
    h = harness
    await failed_deliveries(h, 600)
    flt = DeliveryFilter(tenant_id="default", status=DeliveryStatus.FAILURE)
    record, matching = await h.service.replays.start(flt, by="console:test")
    task: asyncio.Task[Replay] | None = None

    def progress(done: int, total: int) -> None:
        # After the first batch of 500: cancelled at its next await, inside the run.
        assert task is not None
        task.cancel()

    task = asyncio.create_task(h.service.replays.execute(record, matching, progress=progress))
    with pytest.raises(asyncio.CancelledError):
        await task
    # As stored, read through the store whose read the cancel interrupted: no
    # statement of it is left open holding an old snapshot.
    stored = await h.service.replays.get(None, record.id)
    assert (stored.cut_short, stored.requeued) == (True, 500)
    assert stored.finished_at is not None


async def test_unfinished_replays_end_cut_short_where_they_stood(harness: Harness) -> None:
    """What ``herald run`` does on SQLite at start: a replay its previous run left
    running (killed mid-run) ends cut short, with the progress it had stored."""
    h = harness
    await failed_deliveries(h, 3)
    flt = DeliveryFilter(tenant_id="default", status=DeliveryStatus.FAILURE)
    left, _ = await h.service.replays.start(flt, by="console:test")
    await h.store.update_replay(left.id, requeued=2, finished_at=None)
    done = (await h.service.replays.run(flt, by="cli:test")).replay
    assert done is not None
    now = time.time()
    assert await h.store.end_unfinished_replays(now=now) == 1
    ended = await h.service.replays.get(None, left.id)
    assert (ended.cut_short, ended.requeued, ended.finished_at) == (True, 2, now)
    untouched = await h.service.replays.get(None, done.id)
    assert (untouched.cut_short, untouched.finished_at) == (False, done.finished_at)
    assert await h.store.end_unfinished_replays(now=now) == 0
