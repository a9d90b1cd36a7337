"""`herald replay`: each filter re-delivers exactly the matching deliveries."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from tests.e2e.conftest import SECRET, HeraldFactory
from tests.e2e.test_delivery import wait_active, wait_deliveries
from tests.support.daemon import Herald
from tests.support.receiver import Received, Receiver

pytestmark = pytest.mark.e2e


class Scenario:
    """Two destinations whose receivers fail every event (max_retries = 0), so every
    delivery ends `failure` after one attempt; a replay's arrivals are then exact."""

    def __init__(self, h: Herald, receivers: list[Receiver], dests: list[str]) -> None:
        self.h, self.receivers, self.dests = h, receivers, dests
        self.failing = True

    def arrivals(self) -> Counter[str]:
        return Counter(
            r.event_id
            for rc in self.receivers
            for r in rc.received
            if not r.type.startswith("destination.")
        )

    async def settle(self, expected_arrivals: int) -> None:
        await self.receivers[0].wait_for(
            lambda: sum(self.arrivals().values()) >= expected_arrivals,
            timeout=20,
            what=f"{expected_arrivals} arrivals",
        )
        await asyncio.sleep(0.4)  # nothing more arrives
        assert sum(self.arrivals().values()) == expected_arrivals

    async def replay(self, *args: str) -> dict[str, object]:
        result: dict[str, object] = await self.h.acli_json("replay", "--rate", "0", *args)
        return result


@pytest.fixture
async def scenario(herald_factory: HeraldFactory) -> AsyncIterator[Scenario]:
    h = herald_factory({"delivery": {"max_retries": 0}})
    state = {"fail": True}

    def behaviour(item: Received) -> web.StreamResponse:
        if item.type == "destination.verification" or not state["fail"]:
            return web.Response(status=204)
        return web.Response(status=500)

    receivers = [await Receiver(secrets=[SECRET], behaviour=behaviour).start() for _ in range(2)]
    dests = []
    for i, r in enumerate(receivers):
        dest = await h.acreate_webhook(r.url, secret=SECRET, name=f"d{i}")
        await wait_active(h, dest["id"])
        dests.append(dest["id"])
    s = Scenario(h, receivers, dests)
    h.insert_events([(f"evt_a{i}", "default", "order.created", "{}") for i in range(3)])
    h.insert_events([(f"evt_b{i}", "default", "order.paid", "{}") for i in range(2)])
    await wait_deliveries(h, "status = 'failure' AND kind = 'event'", 10)
    await s.settle(10)
    state["fail"] = False
    for r in receivers:
        r.received.clear()
    yield s
    for r in receivers:
        await r.stop()


def snapshot(h: Herald) -> list[tuple[object, ...]]:
    return h.query(
        "SELECT id, status, attempt_count, next_attempt_at, max_attempts, updated_at"
        " FROM herald_deliveries ORDER BY id"
    )


async def test_dry_run_changes_nothing(scenario: Scenario) -> None:
    before = snapshot(scenario.h)
    out = await scenario.replay("--status", "failure", "--dry-run")
    assert out["matched"] == 10
    assert out["requeued"] == 0
    assert out["dry_run"] is True
    assert len(out["sample"]) == 5  # type: ignore[arg-type]
    await asyncio.sleep(0.5)
    assert snapshot(scenario.h) == before
    assert scenario.arrivals() == Counter()


async def test_by_destination(scenario: Scenario) -> None:
    out = await scenario.replay("--destination", scenario.dests[1])
    assert out["requeued"] == 5
    await scenario.settle(5)
    assert scenario.receivers[0].received == []
    assert set(scenario.arrivals()) == {"evt_a0", "evt_a1", "evt_a2", "evt_b0", "evt_b1"}


async def test_by_status_and_event_type(scenario: Scenario) -> None:
    out = await scenario.replay("--status", "failure", "--event-type", "order.paid")
    assert out["requeued"] == 4
    await scenario.settle(4)
    assert scenario.arrivals() == Counter({"evt_b0": 2, "evt_b1": 2})
    # Now those are `success`: a second replay by status failure leaves them out.
    out = await scenario.replay("--status", "failure", "--dry-run")
    assert out["matched"] == 6


async def test_by_time_range(scenario: Scenario) -> None:
    h = scenario.h
    cut = time.time()
    await asyncio.sleep(0.05)
    h.insert_events([("evt_late", "default", "order.created", "{}")])
    await scenario.settle(2)  # the new event is delivered (receivers succeed now)
    for r in scenario.receivers:
        r.received.clear()
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(cut)) + f".{int(cut % 1 * 1e6):06d}Z"
    out = await scenario.replay("--since", since)
    assert out["requeued"] == 2
    await scenario.settle(2)
    assert set(scenario.arrivals()) == {"evt_late"}
    for r in scenario.receivers:
        r.received.clear()
    out = await scenario.replay("--until", since, "--destination", scenario.dests[0])
    assert out["requeued"] == 5
    await scenario.settle(5)
    assert "evt_late" not in scenario.arrivals()


async def test_by_delivery_ids_and_file(scenario: Scenario, tmp_path: Path) -> None:
    h = scenario.h
    ids = [
        row[0]
        for row in h.query(
            "SELECT id FROM herald_deliveries WHERE kind = 'event' ORDER BY id LIMIT 3"
        )
    ]
    out = await scenario.replay("--delivery", ids[0])
    assert out["requeued"] == 1
    await scenario.settle(1)
    path = tmp_path / "ids.txt"
    path.write_text(f"{ids[1]}\n\n{ids[2]}\n")
    out = await scenario.replay("--ids-file", str(path))
    assert out["requeued"] == 2
    await scenario.settle(3)
    replayed = h.query("SELECT event_id FROM herald_deliveries WHERE id IN (?, ?, ?)", tuple(ids))
    assert Counter(scenario.arrivals()) == Counter(r[0] for r in replayed)


async def test_by_tenant(scenario: Scenario) -> None:
    out = await scenario.replay("--tenant", "someone-else")
    assert out["matched"] == 0
    await asyncio.sleep(0.4)
    assert scenario.arrivals() == Counter()


async def test_replay_is_logged_and_rate_limited(scenario: Scenario) -> None:
    proc = await scenario.h.acli("replay", "--status", "failure", "--rate", "4")
    assert "re-queued 10 of 10" in proc.stdout
    logged = [json.loads(line) for line in proc.stderr.splitlines() if line.startswith("{")]
    entry = next(e for e in logged if e.get("event") == "replay")
    assert entry["matched"] == 10
    assert entry["requeued"] == 10
    assert entry["by"].endswith("@cli")
    assert entry["rate_per_second"] == 4
    due = sorted(
        r[0]
        for r in scenario.h.query(
            "SELECT next_attempt_at FROM herald_deliveries WHERE kind = 'event'"
            " AND status = 'pending' AND attempt_count = 1"
        )
    )
    # 10 deliveries at 4 per second: due over three one-second steps, not all at once.
    if len(due) == 10:
        assert due[-1] - due[0] >= 2
    await scenario.settle(10)
