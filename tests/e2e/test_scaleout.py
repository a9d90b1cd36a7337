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
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_ops import scrape
from tests.support.api import Api, base_url, create_key, fresh_rate_window
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


async def wait_done(h: Herald, expected: int, stall: float, cap: float = 600) -> float:
    """Seconds until ``expected`` event deliveries succeeded.

    A stuck run fails once no delivery has succeeded for ``stall`` seconds; a slow one
    (a loaded CI machine runs other tests beside this one) only at ``cap``. How fast the
    fleet delivers is bench postgres's to measure, not a test's.
    """
    started = time.monotonic()
    last_progress, done = started, 0
    while (now := time.monotonic()) < started + cap and now < last_progress + stall:
        count = h.query(
            "SELECT COUNT(*) FROM herald_deliveries WHERE kind = 'event' AND status = 'success'"
        )[0][0]
        if count >= expected:
            return now - started
        if count > done:
            last_progress, done = now, count
        await asyncio.sleep(0.25)
    raise AssertionError(
        f"{done} of {expected} deliveries succeeded, none for the last {stall} s"
        if now >= last_progress + stall
        else f"{done} of {expected} deliveries succeeded within {cap} s"
    )


async def wait_active(h: Herald, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        active = h.query("SELECT COUNT(*) FROM herald_destinations WHERE status = 'active'")
        if active[0][0] == DESTINATIONS:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("destinations not verified")


async def wait_arrivals(
    nginx: Nginx, expected: int, timeout: float = 15
) -> Counter[tuple[str, str]]:
    """nginx's arrivals once ``expected`` distinct (path, event) pairs are in its log.

    Herald records a success after nginx answered; nginx writes its log line from a
    buffer flushed every 100 ms, so the last arrivals show up a little later."""
    deadline = time.monotonic() + timeout
    while True:
        arrivals = nginx.arrivals()
        seen = sum(1 for _, w in arrivals if w.startswith("evt_s"))
        if seen >= expected or time.monotonic() > deadline:
            return arrivals
        await asyncio.sleep(0.1)


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


@pytest.mark.slow
async def test_three_instances_share_the_work(
    tmp_path: Path, database: str, nginx: Nginx, record_property: Callable[[str, object], None]
) -> None:
    # The scale-out: 20,000 events to 5 webhooks, 100,000 deliveries. One
    # process per instance (worker_processes = 1, tests.support.daemon): three daemons,
    # PostgreSQL and nginx already share the 2 cores of the test machine.
    events = 20_000
    deliveries = events * DESTINATIONS
    nodes = cluster(tmp_path, database, 3)
    await nodes[0].acli("migrate")
    await prepare(nodes[0], nginx)
    await asyncio.gather(*(n.astart() for n in nodes))
    try:
        await wait_active(nodes[0], 30)
        insert(nodes[0], events)
        # 45-55 s alone on the 2-core test machine, longer beside other tests.
        seconds = await wait_done(nodes[0], deliveries, stall=30)
        arrivals = await wait_arrivals(nginx, deliveries)
        per_destination = Counter(path for path, _ in arrivals)
        events_seen = {(p, w) for p, w in arrivals if w.startswith("evt_s")}
        assert len(events_seen) == deliveries
        duplicates = sum(n - 1 for (p, w), n in arrivals.items() if w.startswith("evt_s"))
        assert duplicates == 0, f"{duplicates} duplicate arrivals without any crash"
        assert set(per_destination) == {f"/d{i}" for i in range(DESTINATIONS)}
        # Every instance did part of the work: attempts do not record their instance,
        # each instance's metrics count its own.
        made = [attempts_made(n) for n in nodes]
        assert all(m > 0 for m in made), made
        assert sum(made) == deliveries + DESTINATIONS  # and the 5 verification pings
        no_concurrent_attempts(nodes[0])
        record_property("deliveries", deliveries)
        record_property("seconds", round(seconds, 1))
        record_property("deliveries_per_s", round(deliveries / seconds))
        record_property("attempts_per_instance", made)
        for n in nodes:
            assert await n.astop() == 0
    finally:
        for n in nodes:
            if n.proc is not None and n.proc.poll() is None:
                n.kill()


def attempts_made(h: Herald) -> int:
    """Attempts the daemon ``h`` made, by its ``/metrics``."""
    return int(
        sum(v for k, v in scrape(h.port).items() if k.startswith("herald_delivery_attempts_total{"))
    )


def instance_id(h: Herald) -> str:
    """The id (and lease owner) under which the running daemon ``h`` registered."""
    assert h.proc is not None
    [(found,)] = h.query("SELECT id FROM herald_instances WHERE pid = ?", (h.proc.pid,))
    return str(found)


def leased_to(h: Herald, owner: str) -> dict[str, float]:
    """Pending deliveries leased to ``owner``, and when each lease runs out."""
    return dict(
        h.query(
            "SELECT id, next_attempt_at FROM herald_deliveries"
            " WHERE status = 'pending' AND lease_owner = ?",
            (owner,),
        )
    )


@pytest.mark.parametrize("mechanism", sorted(FAILOVER))
async def test_killed_instance_leases_are_taken_over(
    tmp_path: Path,
    database: str,
    nginx: Nginx,
    mechanism: str,
    record_property: Callable[[str, object], None],
) -> None:
    # Enough work that the victim still holds leases of unrecorded attempts when it is
    # killed: 20,000 deliveries, several seconds' work for the three.
    events = 4_000
    nodes = cluster(tmp_path, database, 3, FAILOVER[mechanism])
    await nodes[0].acli("migrate")
    await prepare(nodes[0], nginx)
    await asyncio.gather(*(n.astart() for n in nodes))
    try:
        await wait_active(nodes[0], 30)
        listed = await nodes[0].acli_json("instances", "--json")
        assert sorted(i["pid"] for i in listed["data"]) == sorted(
            n.proc.pid for n in nodes if n.proc is not None
        )
        assert {i["state"] for i in listed["data"]} == {"live"}
        victim = nodes[1]
        victim_id = instance_id(victim)
        insert(nodes[0], events)
        # Mid-run: a fifth of the work done, the victim making attempts and holding leases.
        deadline = time.monotonic() + 60
        while True:
            assert time.monotonic() < deadline, "the victim never held a lease mid-run"
            [(done,)] = victim.query(
                "SELECT COUNT(*) FROM herald_deliveries WHERE kind = 'event' AND status = 'success'"
            )
            if done >= events * DESTINATIONS // 5 and attempts_made(victim) > DESTINATIONS:
                before_kill = leased_to(victim, victim_id)
                if before_kill:
                    break
            await asyncio.sleep(0.01)
        victim.kill()
        killed_at = time.time()
        # What the victim held when it died: its leases that are still there now that
        # it cannot record anything (what it recorded between the two looks is not
        # orphaned; what it leased between them is).
        orphaned = leased_to(victim, victim_id)
        assert len(orphaned) > 0, f"the victim held {len(before_kill)} leases, none at the kill"
        # Heartbeats bring the deliveries back long before the 300 s leases would.
        await wait_done(nodes[0], events * DESTINATIONS, stall=60)
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
            presumed = [
                e["instance"]
                for n in (nodes[0], nodes[2])
                for e in n.log_events()
                if e.get("event") == "instance_presumed_dead"
            ]
            assert victim_id in presumed, presumed
            scrapes = [scrape(n.port) for n in (nodes[0], nodes[2])]
            assert sum(m["herald_instances_reaped_total"] for m in scrapes) == len(presumed)
            assert sum(m["herald_leases_released_total"] for m in scrapes) >= len(orphaned)

            # Each survivor counts the live instances at its own heartbeat (every second
            # here): the one that did not reap sees the victim gone at its next beat.
            def gauges() -> set[float]:
                return {scrape(n.port)["herald_instances"] for n in (nodes[0], nodes[2])}

            gauge_deadline = time.monotonic() + 10
            while (counted := gauges()) != {2}:
                assert time.monotonic() < gauge_deadline, counted
                await asyncio.sleep(0.2)
        # The takeover: each orphaned delivery succeeded in an attempt that started after
        # the kill, so a survivor's (attempts do not record their instance; a dead one
        # makes none), and, on lease expiry alone, not before its lease ran out.
        taken_over = dict(
            nodes[0].query(
                "SELECT d.id, a.started_at FROM herald_deliveries d"
                " JOIN herald_attempts a ON a.id = d.last_attempt_id"
                " WHERE d.status = 'success' AND a.outcome = 'success'"
                " AND d.id = ANY(?)",
                (list(orphaned),),
            )
        )
        assert set(taken_over) == set(orphaned)
        late = {i: t for i, t in taken_over.items() if t < killed_at}
        assert not late, f"attempted before the kill, so by the victim: {late}"
        if mechanism == "lease":
            early = {i: (t, orphaned[i]) for i, t in taken_over.items() if t < orphaned[i]}
            assert not early, f"taken over before the lease ran out: {early}"
        # The victim's attempts were never recorded: every attempt of an orphaned delivery
        # started after the kill. A survivor may make more than one (3 s leases can lapse
        # on a loaded machine and a peer takes the delivery again: at least once).
        [(attempts, before)] = nodes[0].query(
            "SELECT COUNT(*), COUNT(*) FILTER (WHERE started_at < ?) FROM herald_attempts"
            " WHERE delivery_id = ANY(?)",
            (killed_at, list(orphaned)),
        )
        assert before == 0, f"{before} attempts of orphaned deliveries recorded by the victim"
        assert attempts >= len(orphaned)
        [(recorded,)] = nodes[0].query(
            "SELECT COUNT(*) FROM herald_attempts a JOIN herald_deliveries d"
            " ON d.id = a.delivery_id WHERE d.kind = 'event'"
        )
        arrivals = await wait_arrivals(nginx, events * DESTINATIONS)
        seen = {(p, w) for p, w in arrivals if w.startswith("evt_s")}
        assert len(seen) == events * DESTINATIONS  # every event, at least once
        duplicates = sum(n - 1 for (p, w), n in arrivals.items() if w.startswith("evt_s"))
        # At least once: what the victim sent and had not recorded is sent again, and so
        # is what a survivor sent twice (each recorded attempt arrives at most once).
        assert duplicates <= len(orphaned) + recorded - events * DESTINATIONS
        record_property("leased_right_before_kill", len(before_kill))
        record_property("orphaned", len(orphaned))
        record_property("duplicates", duplicates)
        record_property("attempts_of_orphaned", attempts)
        no_concurrent_attempts(nodes[0])
        for n in (nodes[0], nodes[2]):
            assert await n.astop() == 0
    finally:
        for n in nodes:
            if n.proc is not None and n.proc.poll() is None:
                n.kill()


async def test_the_rate_limit_is_one_budget_across_instances(tmp_path: Path, database: str) -> None:
    """Behind a load balancer a tenant's requests reach every instance: together they
    allow api.rate_limit_requests per window, not that many per instance."""
    key = base64.urlsafe_b64encode(os.urandom(32)).decode()
    overrides: dict[str, dict[str, Any]] = {
        "security": {"encryption_key": key},
        "api": {"rate_limit_requests": 10, "rate_limit_window_seconds": 30},
        "log": {"level": "warning"},
    }
    nodes = []
    for i in range(2):
        (tmp_path / f"node{i}").mkdir()
        nodes.append(Herald(tmp_path / f"node{i}", overrides, database_url=database))
    try:
        for node in nodes:
            await node.astart()
        api_key = await create_key(nodes[0], "acme")
        other_key = await create_key(nodes[1], "globex")
        async with (
            Api(base_url(nodes[0]), api_key) as first,
            Api(base_url(nodes[1]), api_key) as second,
            Api(base_url(nodes[1]), other_key) as other,
        ):
            await fresh_rate_window(30, need=10)
            statuses = []
            for _ in range(6):  # alternately, as a load balancer would send them
                for api in (first, second):
                    status, headers, _ = await api.get("/v2/event-destinations")
                    statuses.append(status)
            assert statuses == [200] * 10 + [429] * 2, statuses
            assert headers["RateLimit"] == f'"default";r=0;t={headers["Retry-After"]}'
            # Another tenant's budget is its own.
            assert (await other.get("/v2/event-destinations"))[0] == 200
    finally:
        for node in nodes:
            node.kill()
