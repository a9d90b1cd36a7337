"""Retention in a running daemon: the background task deletes finished history older
than ``retention.days`` and keeps what is still pending, on both backends."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiohttp import web

from tests.e2e.conftest import SECRET, HeraldFactory
from tests.e2e.test_delivery import wait_active, wait_deliveries
from tests.support.daemon import Herald
from tests.support.receiver import Received, Receiver, verification_ok_then

pytestmark = pytest.mark.e2e

RETAIN = 8.0
"""``retention.days`` in seconds: long enough to see finished rows before the cutoff."""


def answer(item: Received) -> web.StreamResponse:
    if item.path.endswith("/gone"):
        return web.Response(status=404)  # two attempts (max_retries = 1), then failure
    if item.path.endswith("/later"):
        # Retried in an hour: pending, with one attempt, for the whole test.
        return web.Response(status=503, headers={"Retry-After": "3600"})
    return web.Response(status=204)


def finished(h: Herald) -> dict[str, float]:
    """Finished event deliveries and when they finished."""
    return dict(
        h.query(
            "SELECT id, updated_at FROM herald_deliveries"
            " WHERE kind = 'event' AND status <> 'pending'"
        )
    )


def count(h: Herald, sql: str) -> int:
    return int(h.query(sql)[0][0])


async def test_retention_deletes_old_finished_history_and_keeps_pending(
    herald_factory: HeraldFactory,
) -> None:
    receiver = await Receiver(secrets=[SECRET], behaviour=verification_ok_then(answer)).start()
    try:
        h = herald_factory(
            {
                "retention": {"days": RETAIN / 86400, "interval_seconds": 0.25},
                "delivery": {"max_retries": 1},
            },
            start=False,
        )
        await h.astart()
        base = receiver.url.removesuffix("/hook")
        for path, events in (("ok", ["*"]), ("gone", ["*"]), ("later", ["keep.*"])):
            dest = await h.acreate_webhook(f"{base}/{path}", secret=SECRET, events=events)
            await wait_active(h, dest["id"])
        # Two events only the finishing destinations take, one that "later" takes too.
        h.insert_events(
            [
                ("evt_r1", "default", "drop.one", "{}"),
                ("evt_r2", "default", "drop.two", "{}"),
                ("evt_r3", "default", "keep.three", "{}"),
            ]
        )
        await wait_deliveries(h, "kind = 'event' AND status <> 'pending'", 6)
        await wait_deliveries(h, "kind = 'event' AND status = 'pending' AND attempt_count = 1", 1)
        done = finished(h)
        assert (
            sorted(
                h.query(
                    "SELECT status FROM herald_deliveries WHERE id IN (?, ?, ?, ?, ?, ?)", (*done,)
                )
            )
            == [("failure",)] * 3 + [("success",)] * 3
        )
        [(pending_id,)] = h.query(
            "SELECT id FROM herald_deliveries WHERE kind = 'event' AND status = 'pending'"
        )
        # Younger than the cutoff: nothing of it is gone yet.
        assert time.time() - min(done.values()) < RETAIN, "the setup took longer than RETAIN"
        # ok 3 x 1, gone 3 x 2, later 1, and the 3 verification pings.
        assert count(h, "SELECT COUNT(*) FROM herald_attempts") == 3 + 6 + 1 + 3

        # Then each finished delivery goes with its attempts once it is older than the
        # cutoff, and not before.
        deadline = time.monotonic() + RETAIN + 20
        while True:
            present = finished(h)
            now = time.time()
            early = {i: now - t for i, t in done.items() if i not in present and now - t < RETAIN}
            assert not early, f"purged younger than {RETAIN} s: {early}"
            if not present:
                break
            assert time.monotonic() < deadline, f"{len(present)} finished deliveries left"
            await asyncio.sleep(0.1)
        assert count(h, "SELECT COUNT(*) FROM herald_deliveries WHERE status <> 'pending'") == 0
        left = h.query("SELECT delivery_id FROM herald_attempts")
        assert left == [(pending_id,)], "attempts of purged deliveries remain"
        # The pending delivery stays, although it is older than the cutoff too, and so
        # does its event; the events whose deliveries all went are gone, each on the
        # pass that finds it past the cutoff: an operational event (a delivery
        # exhausted) is ingested just after the delivery it speaks of ended, so it may
        # go a pass later than that delivery.
        [(status, attempts, updated_at)] = h.query(
            "SELECT status, attempt_count, updated_at FROM herald_deliveries"
        )
        assert (status, attempts) == ("pending", 1)
        assert time.time() - updated_at > RETAIN
        deadline = time.monotonic() + 10
        while (stored := h.query("SELECT id FROM herald_events ORDER BY id")) != [("evt_r3",)]:
            assert ("evt_r3",) in stored, "the pending delivery's event was purged"
            assert time.monotonic() < deadline, f"events left: {stored}"
            await asyncio.sleep(0.1)
        purged = [e for e in h.log_events() if e.get("event") == "retention_purged"]
        # Six event deliveries and the three verification pings.
        assert sum(e["deliveries"] for e in purged) == 9
        assert {e["older_than_days"] for e in purged} == {RETAIN / 86400}
        assert await h.astop() == 0
    finally:
        await receiver.stop()
