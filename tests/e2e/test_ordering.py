"""Ordered delivery per key (docs/ordering.md), proven by a ledger.

20 keys x 50 events, interleaved, go to one webhook whose receiver fails about a
third of first attempts (some with 429 and a Retry-After): every event arrives, and
for every key the receiver's arrivals never step back in the outbox order (a repeat
of the current head is allowed). The same through a kill -9 and a restart, with
three instances on PostgreSQL, and a control run unordered that does step back (so
the ledger can tell).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import time
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.e2e.conftest import SECRET, HeraldFactory
from tests.support.daemon import Herald
from tests.support.receiver import Received, Receiver, verification_ok_then

pytestmark = pytest.mark.e2e

KEYS = 20
PER_KEY = 50
EVENTS = KEYS * PER_KEY


def fault(event_id: str) -> int:
    """0: the first attempt answers 429 with a Retry-After of one second (1 in 21
    events: each holds its key for a second); 1-6: it answers 500 (6 in 21); else 204."""
    return hashlib.sha256(event_id.encode()).digest()[0] % 21


def make_receiver() -> Receiver:
    """Fails the first attempt of a third of the events, decided by the event id (so a
    run is repeatable): 500, or 429 with a Retry-After of one second (:func:`fault`)."""
    receiver = Receiver(secrets=[SECRET])
    seen: dict[str, int] = defaultdict(int)

    def behave(item: Received) -> web.StreamResponse:
        seen[item.event_id] += 1
        if seen[item.event_id] == 1:
            roll = fault(item.event_id)
            if roll == 0:
                return web.Response(status=429, headers={"Retry-After": "1"})
            if roll <= 6:
                return web.Response(status=500)
        return web.Response(status=204)

    receiver.behaviour = verification_ok_then(behave)
    return receiver


def ledger_rows(prefix: str) -> list[tuple[str, str, str, str, str]]:
    """(id, tenant, type, data, ordering_key), interleaved: event i is key i % KEYS."""
    rows = []
    for i in range(EVENTS):
        key = f"k{i % KEYS}"
        data = json.dumps({"seq": i, "key": key})
        rows.append((f"evt_{prefix}_{i:05d}", "default", "ledger.step", data, key))
    return rows


def insert(h: Herald, rows: list[tuple[str, str, str, str, str]], *, per_tx: int = 100) -> None:
    """The producer: ``per_tx`` rows a transaction, in order."""
    db = h.connect()
    try:
        for start in range(0, len(rows), per_tx):
            db.execute("BEGIN")
            db.executemany(
                "INSERT INTO herald_outbox (id, tenant_id, type, data, ordering_key)"
                " VALUES (?, ?, ?, ?, ?)",
                rows[start : start + per_tx],
            )
            db.execute("COMMIT")
    finally:
        db.close()


def create(h: Herald, url: str, ordering: str) -> str:
    body = {
        "name": f"ledger {ordering}",
        "type": "webhook",
        "webhook": {"url": url, "secret": SECRET},
        "events": ["ledger.*"],
        "ordering": ordering,
    }
    request = urllib.request.Request(
        f"http://127.0.0.1:{h.port}/v2/event-destinations",
        data=json.dumps(body).encode(),
        headers={
            "Authorization": f"Bearer {h.api_key()}",
            "Content-Type": "application/json",
        },
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        made: dict[str, Any] = json.loads(resp.read())
    assert made["ordering"] == ordering
    return str(made["id"])


async def start(h: Herald) -> None:
    """Start ``h``, with room for a loaded machine's slow start-up."""
    await asyncio.to_thread(h.start, timeout=90)


async def wait_active(h: Herald, dest_id: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = await asyncio.to_thread(
            h.query, "SELECT status FROM herald_destinations WHERE id = ?", (dest_id,)
        )
        if got[0][0] == "active":
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{dest_id} did not become active")


async def wait_all_succeeded(h: Herald, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    sql = "SELECT COUNT(*) FROM herald_deliveries WHERE status <> 'success'"
    while (left := (await asyncio.to_thread(h.query, sql))[0][0]) != 0:
        if time.monotonic() > deadline:
            raise AssertionError(f"{left} deliveries not successful\n{h.log()[-3000:]}")
        await asyncio.sleep(0.1)


def delivered(receiver: Receiver) -> set[str]:
    """The events the receiver accepted (its answer was 204: not the first of a failed)."""
    ok: set[str] = set()
    count: dict[str, int] = defaultdict(int)
    for r in receiver.events("ledger.step"):
        count[r.event_id] += 1
        if count[r.event_id] > 1 or fault(r.event_id) > 6:
            ok.add(r.event_id)
    return ok


def reorders(receiver: Receiver) -> list[str]:
    """Every arrival that stepped back in its key's order: an event older than one of
    its key that arrived before it (a repeat of the latest is not a step back)."""
    latest: dict[str, int] = {}
    back = []
    for r in receiver.events("ledger.step"):
        data = r.envelope["data"]
        key, seq = data["key"], int(data["seq"])
        if seq < latest.get(key, -1):
            back.append(f"{key}: {seq} after {latest[key]}")
        latest[key] = max(seq, latest.get(key, -1))
    return back


async def run_ledger(
    h: Herald, receiver: Receiver, *, ordering: str, kill_at: int | None = None
) -> None:
    dest_id = await asyncio.to_thread(create, h, receiver.url, ordering)
    await wait_active(h, dest_id)
    await asyncio.to_thread(insert, h, ledger_rows(ordering))
    if kill_at is not None:
        await receiver.wait_for(
            lambda: len(delivered(receiver)) >= kill_at, timeout=60, what="a third delivered"
        )
        h.kill()
        assert len(delivered(receiver)) < EVENTS, "the kill came too late to prove anything"
        await start(h)
    await receiver.wait_for(
        lambda: len(delivered(receiver)) == EVENTS, timeout=90, what="every event delivered"
    )


@pytest.mark.parametrize("kill", [False, True], ids=["steady", "kill9"])
async def test_ordered_ledger_keeps_each_key_in_order(
    herald_factory: HeraldFactory, kill: bool
) -> None:
    h = herald_factory(start=False)
    await start(h)
    receiver = await make_receiver().start()
    try:
        await run_ledger(h, receiver, ordering="key", kill_at=EVENTS // 3 if kill else None)
        assert not receiver.errors
        assert reorders(receiver) == []
        # Every delivery ends well (its last record may still be on its way).
        await wait_all_succeeded(h)
    finally:
        await receiver.stop()


async def test_unordered_control_run_does_reorder(herald_factory: HeraldFactory) -> None:
    """The same faults without ordering: the ledger sees keys step back."""
    h = herald_factory(start=False)
    await start(h)
    receiver = await make_receiver().start()
    try:
        await run_ledger(h, receiver, ordering="none")
        assert len(reorders(receiver)) > 0
    finally:
        await receiver.stop()


async def test_three_instances_keep_each_key_in_order(tmp_path: Path) -> None:
    from tests.support.databases import create_postgres_database, drop_postgres_database

    url = await create_postgres_database()
    key = base64.urlsafe_b64encode(os.urandom(32)).decode()
    overrides: dict[str, dict[str, Any]] = {
        "security": {"encryption_key": key},
        "log": {"level": "warning"},
    }
    nodes = []
    for i in range(3):
        workdir = tmp_path / f"node{i}"
        workdir.mkdir()
        nodes.append(Herald(workdir, overrides, database_url=url))
    receiver = await make_receiver().start()
    try:
        for n in nodes:
            await start(n)
        await run_ledger(nodes[0], receiver, ordering="key")
        assert not receiver.errors
        assert reorders(receiver) == []
    finally:
        await receiver.stop()
        for n in nodes:
            n.discard()
        await drop_postgres_database(url)
