"""A database outage, as Prometheus sees it: ``herald_database_up`` drops to 0, storage
errors count by component, ``herald_component_up`` drops, the database's counts leave
the scrape instead of freezing, ``/readyz`` fails — and when the database returns,
every event is delivered and every signal comes back.

PostgreSQL is stopped for real: a private server (tests/support/private_pg.py), since
the shared one on 5432 serves every other test. SQLite's turn, a disk that refuses
writes, is in tests/e2e/test_faults.py (a running root process keeps writing to a file
whose mode or directory says read-only, so a full disk is what refuses its writes)."""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import SECRET
from tests.e2e.test_delivery import rows, wait_active
from tests.support.daemon import Herald
from tests.support.private_pg import PrivatePostgres
from tests.support.receiver import Receiver

pytestmark = [pytest.mark.e2e, pytest.mark.backend_neutral]

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(h: Herald) -> Samples:
    """One /metrics scrape: (sample name, sorted labels) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{h.port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def api_status(h: Herald, path: str) -> int:
    status: int = h.get(path, key=h.api_key())[0]
    return status


def storage_errors(samples: Samples, component: str) -> float:
    return samples.get(("herald_storage_errors_total", (("component", component),)), 0.0)


def component_up(samples: Samples, component: str) -> float | None:
    return samples.get(("herald_component_up", (("component", component),)))


async def until(
    probe: Callable[[], bool], *, timeout: float, what: str, h: Herald | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(probe):
        if time.monotonic() > deadline:
            tail = f"\n{h.log()[-3000:]}" if h is not None else ""
            raise AssertionError(f"timed out after {timeout} s waiting for {what}{tail}")
        await asyncio.sleep(0.05)


@pytest.fixture
def private_pg() -> Iterator[PrivatePostgres]:
    pg = PrivatePostgres()
    try:
        yield pg.start()
    finally:
        pg.close()


async def test_postgres_stopped_under_load_is_seen_and_loses_nothing(
    private_pg: PrivatePostgres, tmp_path: Path
) -> None:
    n = 2000
    h = Herald(
        tmp_path,
        {"metrics": {"refresh_seconds": 0.2}},
        database_url=private_pg.url,
    )
    receiver = await Receiver(secrets=[SECRET]).start()
    try:
        await h.astart()
        dest = await h.acreate_webhook(receiver.url, secret=SECRET, events=["load.*"])
        await wait_active(h, dest["id"])

        def delivered() -> set[str]:
            return {r.event_id for r in receiver.received if r.type == "load.x"}

        await until(lambda: scrape(h).get(("herald_database_up", ())) == 1, timeout=10, what="up")
        h.insert_events(rows(n, prefix="evt_pg_", type_="load.x"))
        await until(lambda: len(delivered()) >= 50, timeout=30, what="deliveries flowing", h=h)

        await asyncio.to_thread(private_pg.stop)
        down_at = time.monotonic()
        await until(
            lambda: scrape(h).get(("herald_database_up", ())) == 0,
            timeout=15,
            what="herald_database_up 0",
            h=h,
        )
        first = await asyncio.to_thread(scrape, h)
        # Errors keep counting while it is away: the relay and the claims retry.
        await until(
            lambda: storage_errors(scrape(h), "relay") > storage_errors(first, "relay") + 1,
            timeout=15,
            what="relay storage errors counting",
            h=h,
        )
        samples = await asyncio.to_thread(scrape, h)
        assert storage_errors(samples, "claim") > 0 or storage_errors(samples, "recorder") > 0
        assert component_up(samples, "relay") == 0, samples
        # The database's counts are dropped, not frozen at their last values.
        await until(
            lambda: ("herald_outbox_pending", (("source", "herald"),)) not in scrape(h),
            timeout=10,
            what="the outbox count to leave the scrape",
            h=h,
        )
        status, body = await asyncio.to_thread(h.get, "/readyz")
        assert status == 503, body
        assert "database" in body["problems"], body
        assert (await asyncio.to_thread(h.get, "/healthz"))[0] == 200
        # An API call that needs the database fails in the spec's shape, and counts.
        status = await asyncio.to_thread(api_status, h, "/v2/event-destinations")
        assert status == 500  # StorageError: the spec's internal error
        assert storage_errors(await asyncio.to_thread(scrape, h), "api") >= 1
        away = time.monotonic() - down_at

        await asyncio.to_thread(private_pg.start)
        await until(lambda: len(delivered()) == n, timeout=60, what="every event", h=h)
        await until(lambda: h.get("/readyz")[0] == 200, timeout=15, what="ready again", h=h)
        await until(
            lambda: scrape(h).get(("herald_database_up", ())) == 1, timeout=15, what="up again"
        )
        samples = await asyncio.to_thread(scrape, h)
        assert component_up(samples, "relay") == component_up(samples, "dispatcher") == 1
        assert component_up(samples, "workers") == 1  # its old label, for one release
        # The gauges are a snapshot taken on an interval: one begun while the relay was
        # still catching up may land after the last delivery. The next one says 0.
        await until(
            lambda: scrape(h).get(("herald_outbox_pending", (("source", "herald"),))) == 0,
            timeout=15,
            what="the outbox count back to 0",
            h=h,
        )
        assert await h.astop() == 0
        assert h.query(
            "SELECT COUNT(*) FROM herald_deliveries WHERE kind = 'event' AND status = 'success'"
        ) == [(n,)]
        assert away < 30  # the signals came within seconds, not minutes
    finally:
        if h.proc is not None and h.proc.poll() is None:
            h.kill()
        await receiver.stop()
