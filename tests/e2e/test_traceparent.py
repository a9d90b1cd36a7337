"""A producer's ``traceparent`` (W3C Trace Context) reaches its webhook receivers, from an
outbox row or from ``POST /v2/events``, with tracing off: passed on unchanged, the
signature still verifying (``standardwebhooks``); in the daemon and in attempt
processes. An invalid one costs the event nothing but the header, with a warning
naming the outbox row. (With tracing on: tests/e2e/test_tracing.py.)"""

from __future__ import annotations

import aiohttp
import pytest
from multidict import CIMultiDict

from tests.e2e.conftest import SECRET, HeraldFactory
from tests.e2e.test_delivery import wait_active
from tests.support.api import open_api
from tests.support.daemon import Herald
from tests.support.receiver import Receiver

pytestmark = [pytest.mark.e2e, pytest.mark.backend_neutral]

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
OTHER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
INVALID = "00-00000000000000000000000000000000-00f067aa0ba902b7-01"  # all-zero trace id


def insert_traced(h: Herald, rows: list[tuple[str, str, str | None]]) -> None:
    """(id, type, traceparent) outbox rows, written as a producer writes them."""
    db = h.connect()
    try:
        db.executemany(
            "INSERT INTO herald_outbox (id, type, data, traceparent) VALUES (?, ?, '{}', ?)",
            rows,
        )
    finally:
        db.close()


@pytest.mark.parametrize("processes", [1, 2])
async def test_the_producers_traceparent_reaches_the_webhook_unchanged(
    herald_factory: HeraldFactory, processes: int
) -> None:
    h = herald_factory({"delivery": {"worker_processes": processes}}, start=False)
    await h.astart()
    receiver = await Receiver(secrets=[SECRET]).start()
    try:
        dest = await h.acreate_webhook(receiver.url, secret=SECRET, events=["trace.*"])
        await wait_active(h, dest["id"])
        insert_traced(
            h,
            [
                ("evt_tp1", "trace.x", TRACEPARENT),
                ("evt_tp2", "trace.x", INVALID),
                ("evt_tp3", "trace.x", None),
            ],
        )
        async with open_api(h) as api:
            status, _, _ = await api.post(
                "/v2/events",
                json={"id": "evt_tp4", "type": "trace.x", "data": {}},
                headers={"traceparent": OTHER},
            )
            assert status == 202
            status, _, _ = await api.post(
                "/v2/events",
                json={"id": "evt_tp5", "type": "trace.x", "data": {}},
                headers={"traceparent": "garbage"},
            )
            assert status == 202
            # Two headers are one too many (W3C): the event goes, the header does not.
            headers = CIMultiDict(
                [
                    ("Authorization", f"Bearer {api.key}"),
                    ("Content-Type", "application/json"),
                    ("traceparent", OTHER),
                    ("traceparent", TRACEPARENT),
                ]
            )
            async with (
                aiohttp.ClientSession() as session,
                session.post(
                    f"{api.base_url}/v2/events",
                    data=b'{"id": "evt_tp7", "type": "trace.x", "data": {}}',
                    headers=headers,
                ) as resp,
            ):
                assert resp.status == 202
        await h.acli("emit", "trace.x", "--data", "{}", "--id", "evt_tp6", "--traceparent", OTHER)
        await receiver.wait_for(lambda: len(receiver.counts("trace.x")) == 7, what="events")
    finally:
        await receiver.stop()
    assert receiver.errors == []
    got = {r.event_id: r for r in receiver.events("trace.x")}
    assert all(r.verified for r in got.values())
    assert {i: r.headers.get("traceparent") for i, r in got.items()} == {
        "evt_tp1": TRACEPARENT,
        "evt_tp2": None,
        "evt_tp3": None,
        "evt_tp4": OTHER,
        "evt_tp5": None,
        "evt_tp6": OTHER,
        "evt_tp7": None,
    }
    ignored = {e["event_id"]: e for e in h.log_events() if e.get("event") == "traceparent_ignored"}
    assert set(ignored) == {"evt_tp2", "evt_tp5", "evt_tp7"}
    assert ignored["evt_tp2"]["level"] == "warning"
    assert isinstance(ignored["evt_tp2"]["seq"], int)
    assert "all-zero trace id" in ignored["evt_tp2"]["reason"]
    assert h.query("SELECT COUNT(*) FROM herald_outbox_rejected")[0][0] == 0
