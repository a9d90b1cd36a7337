"""Operational events end to end: Herald tells the tenant's own destinations when one
of them fails, gives up on a delivery, recovers, or cannot be verified.

`herald run` in a subprocess with a short retry schedule; receivers on 127.0.0.1,
one of them killed and brought back on its port.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request

import pytest
from aiohttp import web

from tests.e2e.conftest import SECRET, HeraldFactory
from tests.e2e.test_delivery import wait_active
from tests.support.api import error_of, open_api
from tests.support.daemon import Herald
from tests.support.receiver import Receiver

pytestmark = [pytest.mark.e2e, pytest.mark.backend_neutral]

SIGNALS = (
    "herald.destination.failing",
    "herald.delivery.exhausted",
    "herald.destination.recovered",
)


def metric(h: Herald, name: str) -> float | None:
    """The value of one sample of ``/metrics`` (labels included in ``name``), if shown."""
    with urllib.request.urlopen(f"http://127.0.0.1:{h.port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    for line in text.splitlines():
        sample, _, value = line.rpartition(" ")
        if sample == name:
            return float(value)
    return None


async def wait_metric(h: Herald, name: str, value: float, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while (got := await asyncio.to_thread(metric, h, name)) != value:
        if time.monotonic() > deadline:
            raise AssertionError(f"{name} is {got}, not {value}")
        await asyncio.sleep(0.05)


async def test_a_failing_destination_is_reported_to_the_tenant_s_monitor(
    herald_factory: HeraldFactory,
) -> None:
    h = herald_factory(
        {
            # 5 attempts, 0.75 s from the first to the last; failing after 3 in a row.
            "delivery": {"backoff_base_seconds": 0.05, "max_retries": 4},
            "signals": {"failing_after_attempts": 3},
            "metrics": {"refresh_seconds": 0.1},
        }
    )
    flaky, monitor, everything = (
        await Receiver(secrets=[SECRET]).start(),
        await Receiver(secrets=[SECRET]).start(),
        await Receiver(secrets=[SECRET]).start(),
    )
    try:
        # The failing destination names herald.* too: it must never get its own signals.
        dest = await h.acreate_webhook(
            flaky.url, secret=SECRET, events=["task_run.*", "herald.*"], name="flaky"
        )
        mon = await h.acreate_webhook(monitor.url, secret=SECRET, events=["herald.*"])
        every = await h.acreate_webhook(everything.url, secret=SECRET, events=["*"])
        for d in (dest, mon, every):
            await wait_active(h, d["id"])

        await flaky.stop()  # the receiver dies
        h.insert_events(
            [
                ("evt_lost1", "default", "task_run.completed", '{"n": 1}'),
                ("evt_lost2", "default", "task_run.completed", '{"n": 2}'),
            ]
        )
        await monitor.wait_for(
            lambda: len(monitor.events("herald.delivery.exhausted")) == 2,
            what="two exhausted deliveries",
        )
        [failing] = monitor.events("herald.destination.failing")
        exhausted = monitor.events("herald.delivery.exhausted")
        assert failing.verified, monitor.errors
        assert failing.at < min(e.at for e in exhausted)
        assert failing.envelope["data"]["destination_id"] == dest["id"]
        assert failing.envelope["data"]["consecutive_failures"] == 3
        assert "connect" in failing.envelope["data"]["last_error"].lower()
        by_event = {e.envelope["data"]["event_id"]: e.envelope["data"] for e in exhausted}
        assert set(by_event) == {"evt_lost1", "evt_lost2"}
        lost1 = by_event["evt_lost1"]
        assert lost1["destination_id"] == dest["id"]
        assert lost1["event_type"] == "task_run.completed"
        assert lost1["attempts"] == 5
        assert lost1["last_error"]
        assert h.query(
            "SELECT event_id, status, attempt_count FROM herald_deliveries WHERE id = ?",
            (lost1["delivery_id"],),
        ) == [("evt_lost1", "failure", 5)]
        await wait_metric(h, "herald_destinations_failing", 1)
        assert metric(h, 'herald_deliveries_exhausted_total{type="webhook"}') == 2

        await flaky.start(flaky.port)  # the receiver returns
        h.insert_events([("evt_back", "default", "task_run.completed", "{}")])
        await monitor.wait_for(
            lambda: len(monitor.events("herald.destination.recovered")) == 1, what="recovery"
        )
        [recovered] = monitor.events("herald.destination.recovered")
        assert recovered.envelope["data"]["destination_id"] == dest["id"]
        assert (
            recovered.envelope["data"]["failing_since"]
            == (failing.envelope["data"]["failing_since"])
        )
        assert [r.event_id for r in flaky.events("task_run.completed")] == ["evt_back"]
        await wait_metric(h, "herald_destinations_failing", 0)

        # Exactly once each, to the monitor only: "*" matches none of them, and the
        # destination they are about gets none of its own.
        assert [monitor.counts(t).total() for t in SIGNALS] == [1, 2, 1]
        await asyncio.sleep(0.3)
        assert [r.type for r in everything.events() if r.type.startswith("herald.")] == []
        assert [r.type for r in flaky.events() if r.type.startswith("herald.")] == []
        assert h.query("SELECT COUNT(*) FROM herald_outbox_rejected")[0][0] == 0
        assert await h.astop() == 0
    finally:
        for r in (flaky, monitor, everything):
            await r.stop()


async def test_a_verification_that_runs_out_is_shown_and_signalled(
    herald_factory: HeraldFactory, receiver: Receiver
) -> None:
    h = herald_factory({"delivery": {"backoff_base_seconds": 0.02, "max_retries": 2}})
    mon = await h.acreate_webhook(
        receiver.url, secret=SECRET, events=["herald.destination.verification_failed"]
    )
    await wait_active(h, mon["id"])
    never = await Receiver(behaviour=lambda _: web.Response(status=503)).start()
    try:
        dest = await h.acreate_webhook(never.url, events=["a.b"], name="never")
        await receiver.wait_for(
            lambda: len(receiver.events("herald.destination.verification_failed")) == 1,
            what="verification_failed",
        )
    finally:
        await never.stop()
    [signal] = receiver.events("herald.destination.verification_failed")
    data = signal.envelope["data"]
    assert data["destination_id"] == dest["id"]
    assert (data["attempts"], data["last_response_status"]) == (3, 503)
    async with open_api(h) as api:
        status, _, shown = await api.get(f"/v2/event-destinations/{dest['id']}")
        assert status == 200
        assert shown["status"] == "pending_verification"
        assert shown["verification"] == {
            "state": "failed",
            "failed_at": shown["verification"]["failed_at"],
            "last_error": data["last_error"],
            "reverify": f"POST /v2/event-destinations/{dest['id']}/verify",
            # The ping's last attempt, why it is pending (issue 30, additive).
            "last_attempt": {
                "error": "HTTP 503",
                "outcome": "failure_retryable",
                "response_status": 503,
                "started_at": shown["verification"]["last_attempt"]["started_at"],
            },
        }
        # Nobody but Herald publishes its operational events.
        status, _, body = await api.post(
            "/v2/events", json={"type": "herald.destination.failing", "data": {}}
        )
        assert status == 422
        assert error_of(body)["code"] == "event_type_reserved"
    table = (await h.acli("destinations", "show", dest["id"])).stdout
    assert "verification: failed" in table
    assert f"herald destinations verify {dest['id']}" in table
    assert await h.astop() == 0
