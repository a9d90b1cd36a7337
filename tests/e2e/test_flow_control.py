"""Flow control per destination (docs/flow-control.md), as a receiver sees it: a rate
limit no backlog, worker or instance exceeds, and a circuit breaker that turns a dead
receiver's storm of retries into one probe per cooldown.

The assertions are upper bounds on what the receivers saw (per one-second window, per
outage), never timings of Herald's own speed; every wait is for a condition."""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.e2e.conftest import SECRET, HeraldFactory
from tests.e2e.test_delivery import rows, wait_active
from tests.support.daemon import Herald
from tests.support.databases import create_postgres_database, drop_postgres_database
from tests.support.receiver import Received, Receiver, verification_ok_then

pytestmark = [pytest.mark.e2e, pytest.mark.backend_neutral]

RATE = 20
EVENTS = 120


def call(h: Herald, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """(status, JSON) of one API request with the default tenant's key."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{h.port}{path}",
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {h.api_key()}", "Content-Type": "application/json"},
        method=method,
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read() or b"null")


async def create(h: Herald, url: str, events: list[str], **fields: Any) -> dict[str, Any]:
    body = {
        "name": "flow",
        "type": "webhook",
        "webhook": {"url": url, "secret": SECRET},
        "events": events,
        **fields,
    }
    status, dest = await asyncio.to_thread(call, h, "POST", "/v2/event-destinations", body)
    assert status == 201, dest
    return dict(dest)


async def until(probe: Callable[[], bool], *, timeout: float, what: str, h: Herald) -> None:
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(probe):
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout} s waiting for {what}\n{h.log()[-3000:]}"
            )
        await asyncio.sleep(0.1)


def busiest_second(times: list[float]) -> int:
    """The most arrivals within any one-second window."""
    times = sorted(times)
    most, start = 0, 0
    for end, t in enumerate(times):
        while t - times[start] >= 1.0:
            start += 1
        most = max(most, end - start + 1)
    return most


def assert_within_rate(arrivals: list[Received]) -> None:
    times = [r.at for r in arrivals]
    # The bucket holds one second's worth: a window may see that burst plus a second of
    # the rate; a little slack for the network's jitter between start and arrival.
    assert busiest_second(times) <= 2 * RATE + 3, busiest_second(times)
    # After the first burst, the rest come at the rate at most.
    assert max(times) - min(times) >= (EVENTS - RATE - 3) / RATE


def deliveries_of(h: Herald, dest_id: str) -> list[tuple[str, int]]:
    return [
        (str(s), int(n))
        for s, n in h.query(
            "SELECT status, attempt_count FROM herald_deliveries"
            " WHERE destination_id = ? AND kind = 'event'",
            (dest_id,),
        )
    ]


@pytest.mark.parametrize("workers", [1, 2])
async def test_a_rate_limited_destination_gets_its_backlog_no_faster_than_the_rate(
    herald_factory: HeraldFactory, receiver: Receiver, workers: int
) -> None:
    h = herald_factory({"delivery": {"worker_processes": workers}})
    dest = await create(h, receiver.url, ["flow.*"], rate_limit_per_second=RATE)
    assert dest["rate_limit_per_second"] == RATE
    assert dest["circuit_breaker"] is False
    assert dest["circuit"] is None
    await wait_active(h, dest["id"])  # the verification ping passes the limit
    await asyncio.to_thread(h.insert_events, rows(EVENTS, prefix="evt_rate", type_="flow.x"))
    await receiver.wait_for(
        lambda: len(receiver.counts("flow.x")) == EVENTS, timeout=90, what="every event"
    )
    arrivals = receiver.events("flow.x")
    assert len(arrivals) == EVENTS  # one attempt each
    assert_within_rate(arrivals)
    await until(
        lambda: deliveries_of(h, dest["id"]) == [("success", 1)] * EVENTS,
        timeout=30,
        what="every delivery recorded a success at its first attempt",
        h=h,
    )
    # The CLI shows and changes them like the API.
    shown = (await h.acli("destinations", "show", dest["id"])).stdout
    assert f"rate limit   {RATE}/s" in shown
    assert "circuit      breaker off" in shown
    await h.acli("destinations", "update", dest["id"], "--data", '{"circuit_breaker": true}')
    shown = (await h.acli("destinations", "show", dest["id"])).stdout
    assert "circuit      closed" in shown
    # PATCH: null lifts the limit; read back.
    status, changed = await asyncio.to_thread(
        call, h, "PATCH", f"/v2/event-destinations/{dest['id']}", {"rate_limit_per_second": None}
    )
    assert status == 200, changed
    assert changed["rate_limit_per_second"] is None
    status, bad = await asyncio.to_thread(
        call, h, "PATCH", f"/v2/event-destinations/{dest['id']}", {"rate_limit_per_second": 0}
    )
    assert status == 422
    assert bad["errors"][0]["field"] == "rate_limit_per_second"


@pytest.fixture
async def postgres_url() -> AsyncIterator[str]:
    url = await create_postgres_database()
    try:
        yield url
    finally:
        await drop_postgres_database(url)


async def test_two_postgres_instances_share_one_destinations_rate(
    tmp_path: Path, postgres_url: str, receiver: Receiver
) -> None:
    key = base64.urlsafe_b64encode(os.urandom(32)).decode()
    nodes = []
    for i in range(2):
        workdir = tmp_path / f"node{i}"
        workdir.mkdir()
        nodes.append(
            Herald(workdir, {"security": {"encryption_key": key}}, database_url=postgres_url)
        )
    try:
        for node in nodes:
            await node.astart()
        a = nodes[0]
        dest = await create(a, receiver.url, ["flow.*"], rate_limit_per_second=RATE)
        await wait_active(a, dest["id"])
        await asyncio.to_thread(a.insert_events, rows(EVENTS, prefix="evt_pgr", type_="flow.x"))
        await receiver.wait_for(
            lambda: len(receiver.counts("flow.x")) == EVENTS, timeout=90, what="every event"
        )
        arrivals = receiver.events("flow.x")
        assert len(arrivals) == EVENTS
        assert_within_rate(arrivals)
        await until(
            lambda: deliveries_of(a, dest["id"]) == [("success", 1)] * EVENTS,
            timeout=30,
            what="every delivery a success at its first attempt",
            h=a,
        )
    finally:
        for node in nodes:
            if node.proc is not None and node.proc.poll() is None:
                await node.astop()


BREAKER = {"breaker_failures": 5, "breaker_cooldown_seconds": 1, "breaker_max_cooldown_seconds": 4}
OUTAGE = 20.0
BACKLOG = 500


class Outage:
    """A receiver that answers 503 to events while down (verification pings pass)."""

    def __init__(self) -> None:
        self.down = False
        self.failed: list[float] = []

    def __call__(self, item: Received) -> web.StreamResponse:
        if self.down:
            self.failed.append(item.at)
            return web.Response(status=503)
        return web.Response(status=204)


def probes_within(seconds: float) -> int:
    """The most probes an open circuit sends in ``seconds``: one per cooldown, the
    cooldown doubling from its base up to its most."""
    cooldown, elapsed, probes = float(BREAKER["breaker_cooldown_seconds"]), 0.0, 0
    while elapsed + cooldown <= seconds:
        elapsed += cooldown
        probes += 1
        cooldown = min(2 * cooldown, BREAKER["breaker_max_cooldown_seconds"])
    return probes


async def test_the_breaker_turns_an_outage_into_one_probe_per_cooldown(
    herald_factory: HeraldFactory,
) -> None:
    h = herald_factory(
        {
            "delivery": {
                **BREAKER,
                "backoff_base_seconds": 0.02,
                "max_retries": 14,
                "max_per_destination": 2,
            },
            "metrics": {"per_destination": True, "refresh_seconds": 0.2},
        }
    )
    guarded, control = Outage(), Outage()
    receivers = [
        await Receiver(secrets=[SECRET], behaviour=verification_ok_then(b)).start()
        for b in (guarded, control)
    ]
    signals = await Receiver(secrets=[SECRET]).start()
    try:
        on = await create(h, receivers[0].url, ["flow.*"], circuit_breaker=True)
        assert on["circuit"] == {"state": "closed", "opened_at": None, "next_probe_at": None}
        off = await create(h, receivers[1].url, ["flow.*"])
        watcher = await create(h, signals.url, ["herald.*"])
        for d in (on, off, watcher):
            await wait_active(h, d["id"])

        guarded.down = control.down = True
        await asyncio.to_thread(h.insert_events, rows(BACKLOG, prefix="evt_brk", type_="flow.x"))

        def circuit() -> dict[str, Any]:
            status, dest = call(h, "GET", f"/v2/event-destinations/{on['id']}")
            assert status == 200
            return dict(dest["circuit"])

        await until(lambda: circuit()["state"] != "closed", timeout=30, what="circuit open", h=h)
        opened = circuit()
        assert opened["opened_at"] is not None
        assert opened["next_probe_at"] is not None
        await until(
            lambda: b"herald_circuits_open 1.0" in metrics(h),
            timeout=10,
            what="herald_circuits_open 1",
            h=h,
        )
        assert f'herald_circuit_open{{destination="{on["id"]}"}} 1.0'.encode() in metrics(h)
        down_since = time.monotonic()
        while time.monotonic() - down_since < OUTAGE:
            await asyncio.sleep(0.2)
        guarded.down = control.down = False

        # During the outage: the failures that opened it, the attempts in flight then
        # (max_per_destination - 1 besides the fifth), and one probe per cooldown.
        bound = BREAKER["breaker_failures"] + 1 + probes_within(OUTAGE + 5) + 1
        assert len(guarded.failed) <= bound, (len(guarded.failed), bound)
        assert len(control.failed) > 10 * bound, len(control.failed)

        for r in receivers:
            try:
                await r.wait_for(functools.partial(got_all, r), timeout=120, what="every event")
            except AssertionError:
                raise AssertionError(
                    (
                        len(r.counts("flow.x")),
                        h.query("SELECT * FROM herald_flow"),
                        h.query(
                            "SELECT destination_id, status, held, lease_owner IS NULL, COUNT(*),"
                            " MIN(next_attempt_at), MAX(attempt_count) FROM herald_deliveries"
                            " GROUP BY 1, 2, 3, 4"
                        ),
                        time.time(),
                        h.log()[-4000:],
                    )
                ) from None
        for d in (on, off):
            await until(
                functools.partial(all_succeeded, h, d["id"]),
                timeout=30,
                what="every delivery a success",
                h=h,
            )
        await until(lambda: circuit()["state"] == "closed", timeout=10, what="closed", h=h)

        await signals.wait_for(
            lambda: bool(signals.events("herald.destination.circuit_closed")),
            timeout=30,
            what="circuit_closed",
        )
        (event,) = signals.events("herald.destination.circuit_opened")  # once, not per probe
        data = event.envelope["data"]
        assert data["destination_id"] == on["id"]
        assert data["consecutive_failures"] >= BREAKER["breaker_failures"]
        assert data["next_probe_at"]
        closed = signals.events("herald.destination.circuit_closed")[0].envelope["data"]
        assert closed["destination_id"] == on["id"]
        assert "consecutive_failures" in closed
        # The control has no circuit and sent no circuit event.
        status, plain = await asyncio.to_thread(
            call, h, "GET", f"/v2/event-destinations/{off['id']}"
        )
        assert status == 200
        assert plain["circuit"] is None
        assert all(
            e.envelope["data"]["destination_id"] == on["id"]
            for e in signals.received
            if e.type.startswith("herald.destination.circuit_")
        )
    finally:
        for r in (*receivers, signals):
            await r.stop()


def got_all(r: Receiver) -> bool:
    return len(r.counts("flow.x")) == BACKLOG


def all_succeeded(h: Herald, dest_id: str) -> bool:
    return {s for s, _ in deliveries_of(h, dest_id)} == {"success"}


def metrics(h: Herald) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{h.port}/metrics", timeout=5) as resp:
        body: bytes = resp.read()
    return body
