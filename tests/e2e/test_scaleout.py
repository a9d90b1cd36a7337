"""Several `herald run` instances sharing one PostgreSQL database.

Three instances split one outbox and its deliveries: every delivery arrives,
none is attempted twice at the same time, and when one instance is killed its
leased deliveries are taken over by the others once the leases lapse.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_ops import scrape
from tests.support.daemon import Herald
from tests.support.databases import create_postgres_database, drop_postgres_database
from tests.support.nginx import Nginx, nginx_binary

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        nginx_binary() is None, reason="nginx missing: run scripts/test-services.sh"
    ),
]

DESTINATIONS = 5


@pytest.fixture
async def database() -> AsyncIterator[str]:
    url = await create_postgres_database()
    try:
        yield url
    finally:
        await drop_postgres_database(url)


@pytest.fixture
def nginx() -> Iterator[Nginx]:
    server = Nginx()
    yield server
    server.stop()


# How a killed instance's leased deliveries come back: its leases run out (short
# leases, heartbeats too rare to matter), or its peers miss its heartbeats (long
# leases, as by default).
FAILOVER: dict[str, dict[str, float]] = {
    "lease": {"lease_seconds": 3, "heartbeat_seconds": 100, "instance_timeout_seconds": 600},
    # A loaded test machine can hold a live instance's heartbeat up for seconds (it
    # would then be presumed dead and its attempts repeated): leave room for that.
    "heartbeat": {"lease_seconds": 300, "heartbeat_seconds": 1, "instance_timeout_seconds": 6},
}


def cluster(
    tmp_path: Path, url: str, count: int, delivery: dict[str, float] = FAILOVER["lease"]
) -> list[Herald]:
    key = base64.urlsafe_b64encode(os.urandom(32)).decode()
    overrides: dict[str, dict[str, Any]] = {
        "security": {"encryption_key": key},
        "delivery": delivery,
        "log": {"level": "warning"},
    }
    nodes = []
    for i in range(count):
        workdir = tmp_path / f"node{i}"
        workdir.mkdir()
        nodes.append(Herald(workdir, overrides, database_url=url))
    return nodes


async def prepare(h: Herald, nginx: Nginx) -> list[str]:
    dests = []
    for i in range(DESTINATIONS):
        body = {
            "name": f"d{i}",
            "type": "webhook",
            "webhook": {"url": nginx.url(f"d{i}")},
            "events": ["*"],
        }
        dest = await h.acli_json("destinations", "create", "--data", json.dumps(body))
        dests.append(dest["id"])
    return dests


async def wait_done(h: Herald, expected: int, timeout: float) -> float:
    started = time.monotonic()
    deadline = started + timeout
    done = 0
    while time.monotonic() < deadline:
        done = h.query(
            "SELECT COUNT(*) FROM herald_deliveries WHERE kind = 'event' AND status = 'success'"
        )[0][0]
        if done >= expected:
            return time.monotonic() - started
        await asyncio.sleep(0.25)
    raise AssertionError(f"{done} of {expected} deliveries succeeded within {timeout} s")


async def wait_active(h: Herald, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        active = h.query("SELECT COUNT(*) FROM herald_destinations WHERE status = 'active'")
        if active[0][0] == DESTINATIONS:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("destinations not verified")


def insert(h: Herald, count: int) -> None:
    rows = [(f"evt_s{i:06d}", "default", "load.test", json.dumps({"i": i})) for i in range(count)]
    for start in range(0, count, 5000):
        h.insert_events(rows[start : start + 5000])


def no_concurrent_attempts(h: Herald) -> None:
    """No delivery was ever attempted by two instances at overlapping times."""
    rows = h.query(
        "SELECT delivery_id, started_at, duration_ms FROM herald_attempts"
        " ORDER BY delivery_id, started_at"
    )
    last: dict[str, float] = {}
    for delivery_id, started, duration in rows:
        assert started >= last.get(delivery_id, 0.0) - 0.001, f"{delivery_id} overlapped"
        last[delivery_id] = started + duration / 1000


async def test_three_instances_share_the_work(tmp_path: Path, database: str, nginx: Nginx) -> None:
    events = 4_000
    nodes = cluster(tmp_path, database, 3)
    await nodes[0].acli("migrate")
    await prepare(nodes[0], nginx)
    await asyncio.gather(*(n.astart() for n in nodes))
    try:
        await wait_active(nodes[0], 30)
        insert(nodes[0], events)
        seconds = await wait_done(nodes[0], events * DESTINATIONS + 0, 420)
        arrivals = nginx.arrivals()
        per_destination = Counter(path for path, _ in arrivals)
        events_seen = {(p, w) for p, w in arrivals if w.startswith("evt_s")}
        assert len(events_seen) == events * DESTINATIONS
        duplicates = sum(n - 1 for (p, w), n in arrivals.items() if w.startswith("evt_s"))
        assert duplicates == 0, f"{duplicates} duplicate arrivals without any crash"
        assert set(per_destination) == {f"/d{i}" for i in range(DESTINATIONS)}
        no_concurrent_attempts(nodes[0])
        print(
            f"\n3 instances: {events * DESTINATIONS} deliveries in {seconds:.1f} s"
            f" = {events * DESTINATIONS / seconds:.0f}/s"
        )
        for n in nodes:
            assert await n.astop() == 0
    finally:
        for n in nodes:
            if n.proc is not None and n.proc.poll() is None:
                n.kill()


@pytest.mark.parametrize("mechanism", sorted(FAILOVER))
async def test_killed_instance_leases_are_taken_over(
    tmp_path: Path, database: str, nginx: Nginx, mechanism: str
) -> None:
    # Enough work that the victim still holds unrecorded leases when it is killed, after
    # the `instances` listing that precedes the kill (a second or two of CLI start-up).
    events = 4_000
    nodes = cluster(tmp_path, database, 3, FAILOVER[mechanism])
    await nodes[0].acli("migrate")
    await prepare(nodes[0], nginx)
    await asyncio.gather(*(n.astart() for n in nodes))
    try:
        await wait_active(nodes[0], 30)
        insert(nodes[0], events)
        victim = nodes[1]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            leased = victim.query(
                "SELECT COUNT(*) FROM herald_deliveries WHERE lease_owner LIKE ?",
                (f"%:{victim.proc.pid}:%" if victim.proc else "",),
            )[0][0]
            if leased > 0:
                break
            await asyncio.sleep(0.01)
        assert leased > 0, "the victim never held a lease"
        listed = await nodes[0].acli_json("instances", "--json")
        assert sorted(i["pid"] for i in listed["data"]) == sorted(
            n.proc.pid for n in nodes if n.proc is not None
        )
        assert {i["state"] for i in listed["data"]} == {"live"}
        victim.kill()
        orphaned = victim.query(
            "SELECT COUNT(*) FROM herald_deliveries WHERE status = 'pending'"
            " AND lease_owner IS NOT NULL"
        )[0][0]
        # Heartbeats bring the deliveries back long before the 300 s leases would.
        await wait_done(nodes[0], events * DESTINATIONS, 240 if mechanism == "lease" else 120)
        if mechanism == "heartbeat":
            # The survivors may finish every delivery before they presume the victim dead
            # (when it had none of its leases left unrecorded): wait for the reaping.
            survivors = sorted(n.proc.pid for n in (nodes[0], nodes[2]) if n.proc is not None)
            reap_deadline = time.monotonic() + 30
            while True:
                listed = await nodes[0].acli_json("instances", "--json")
                pids = sorted(i["pid"] for i in listed["data"])
                if pids == survivors or time.monotonic() > reap_deadline:
                    break
                await asyncio.sleep(0.5)
            assert pids == survivors
            assert victim.proc is not None
            presumed = [
                e["instance"]
                for n in (nodes[0], nodes[2])
                for e in n.log_events()
                if e.get("event") == "instance_presumed_dead"
            ]
            assert any(f":{victim.proc.pid}:" in i for i in presumed), presumed
            scrapes = [scrape(n.port) for n in (nodes[0], nodes[2])]
            assert sum(m["herald_instances_reaped_total"] for m in scrapes) == len(presumed)
            assert sum(m["herald_leases_released_total"] for m in scrapes) > 0
            assert {m["herald_instances"] for m in scrapes} == {2}
        arrivals = nginx.arrivals()
        seen = {(p, w) for p, w in arrivals if w.startswith("evt_s")}
        assert len(seen) == events * DESTINATIONS  # every event, at least once
        duplicates = sum(n - 1 for (p, w), n in arrivals.items() if w.startswith("evt_s"))
        print(f"\nfailover: {orphaned} deliveries leased when killed, {duplicates} duplicates")
        no_concurrent_attempts(nodes[0])
        for n in (nodes[0], nodes[2]):
            assert await n.astop() == 0
    finally:
        for n in nodes:
            if n.proc is not None and n.proc.poll() is None:
                n.kill()
