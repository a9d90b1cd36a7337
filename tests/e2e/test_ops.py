"""Operating the daemon: metrics after real deliveries, readiness, systemd notify, replay."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import sqlite3
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from aiohttp import web

from tests.e2e.conftest import SECRET, HeraldFactory
from tests.e2e.test_delivery import rows, wait_active, wait_deliveries
from tests.support.daemon import Herald, free_port
from tests.support.databases import ADMIN_DSN
from tests.support.receiver import Receiver, verification_ok_then

pytestmark = pytest.mark.e2e


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, value = line.rpartition(" ")
        samples[name] = float(value)
    return samples


async def wait_metric(
    port: int, name: str, value: float, timeout: float = 15, **also: float
) -> dict[str, float]:
    """Scrape until ``name`` (and every ``also`` sample, given as keyword-safe
    aliases in ``GAUGES``) has the wanted value; gauges refresh on an interval."""
    wanted = {name: value, **{GAUGES[k]: v for k, v in also.items()}}
    deadline = time.monotonic() + timeout
    samples: dict[str, float] = {}
    while time.monotonic() < deadline:
        samples = await asyncio.to_thread(scrape, port)
        if all(samples.get(k) == v for k, v in wanted.items()):
            return samples
        await asyncio.sleep(0.1)
    got = {k: samples.get(k) for k in wanted}
    raise AssertionError(f"after {timeout} s: {got}, wanted {wanted}")


GAUGES = {
    "due": 'herald_deliveries_pending{state="due"}',
    "scheduled": 'herald_deliveries_pending{state="scheduled_retry"}',
    "held": 'herald_deliveries_pending{state="held"}',
    "outbox": 'herald_outbox_pending{source="herald"}',
    "failing": "herald_destinations_failing",
}


async def test_metrics_count_exactly_what_happened(herald_factory: HeraldFactory) -> None:
    h = herald_factory(
        {
            "delivery": {"max_retries": 1, "backoff_base_seconds": 0.05},
            "metrics": {"refresh_seconds": 0.1},
        }
    )
    ok = await Receiver(secrets=[SECRET]).start()
    bad = await Receiver(
        secrets=[SECRET], behaviour=verification_ok_then(lambda _: web.Response(status=500))
    ).start()
    try:
        for r, name in ((ok, "ok"), (bad, "bad")):
            dest = await h.acreate_webhook(
                r.url, secret=SECRET, name=name, events=[f"probe.{name}"]
            )
            await wait_active(h, dest["id"])
        base = await asyncio.to_thread(scrape, h.port)
        ok_key = 'herald_delivery_attempts_total{destination_type="webhook",outcome="success"}'
        bad_key = (
            'herald_delivery_attempts_total{destination_type="webhook",outcome="failure_retryable"}'
        )
        # Verification pings count as attempts too: two successes so far.
        assert base[ok_key] == 2
        assert base.get(bad_key, 0) == 0
        h.insert_events(rows(7, prefix="evt_ok", type_="probe.ok"))
        h.insert_events(rows(3, prefix="evt_bad", type_="probe.bad"))
        h.insert_events([("evt_poison", "default", "a.b", "[1]")])
        await wait_deliveries(h, "status = 'failure' AND kind = 'event'", 3)
        await wait_deliveries(h, "status = 'success' AND kind = 'event'", 7)
        # And Herald's own: three herald.delivery.exhausted, and the bad destination's
        # herald.destination.failing (its fifth failure in a row).
        m = await wait_metric(h.port, "herald_events_ingested_total", 10 + 4)
        assert m['herald_deliveries_exhausted_total{type="webhook"}'] == 3
        assert m[ok_key] == 2 + 7
        assert m[bad_key] == 3 * 2  # first attempt and one retry each
        completed = 'herald_deliveries_completed_total{destination_type="webhook",status="%s"}'
        assert m[completed % "success"] == 7
        assert m[completed % "failure"] == 3
        assert m['herald_outbox_rejected_total{reason="invalid_data"}'] == 1
        assert m['herald_event_delivery_latency_seconds_count{destination_type="webhook"}'] == 7
        assert m['herald_delivery_attempt_duration_seconds_count{destination_type="webhook"}'] == 15
        assert m['herald_build_info{version="0.1.0"}'] == 1
        assert m["herald_inflight_attempts"] == 0
        # Each attempt began with its delivery taken, by the hand-over or a claim; the
        # pings and the retries only by a claim.
        taken = {
            via: m.get(f'herald_deliveries_taken_total{{via="{via}"}}', 0)
            for via in ("handover", "claim")
        }
        assert sum(taken.values()) == 15
        assert taken["claim"] >= 2 + 3
        # Gauges come from a periodic refresh: wait for one taken after the work settled
        # (Herald's own events reach the outbox after the deliveries they are about end,
        # so a refresh between the two sees no delivery pending and rows in the outbox).
        m = await wait_metric(
            h.port,
            'herald_destinations{status="active",type="webhook"}',
            2,
            due=0,
            scheduled=0,
            held=0,
            outbox=0,
            failing=1,
        )
        assert m['herald_outbox_lag_seconds{source="herald"}'] == 0
        assert m["herald_destinations_failing"] == 1
        assert "process_resident_memory_bytes" in m
    finally:
        await ok.stop()
        await bad.stop()


async def test_outbox_gauges_show_a_backlog(herald_factory: HeraldFactory) -> None:
    # A row an hour old that the relay does not take yet: it polls only every 60 s
    # (and on PostgreSQL the insert trigger that would wake it is switched off).
    h = herald_factory(
        {"metrics": {"refresh_seconds": 0.1}, "relay": {"poll_interval_seconds": 60}}
    )
    await asyncio.sleep(0.3)  # past the relay's first, immediate pass
    if h.backend == "postgres":
        h.query("ALTER TABLE herald_outbox DISABLE TRIGGER herald_outbox_notify")
    hour_ago = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 3600))
    h.query(
        "INSERT INTO herald_outbox (id, type, data, created_at) VALUES (?, ?, ?, ?)",
        ("evt_waiting", "a.b", "{}", hour_ago),
    )
    m = await wait_metric(h.port, 'herald_outbox_pending{source="herald"}', 1)
    deadline = time.monotonic() + 5
    while m['herald_outbox_lag_seconds{source="herald"}'] < 3599 and time.monotonic() < deadline:
        m = await asyncio.to_thread(scrape, h.port)
    assert 3599 <= m['herald_outbox_lag_seconds{source="herald"}'] < 3700


async def test_readyz_follows_the_database(herald_factory: HeraldFactory) -> None:
    h = herald_factory({"database": {"busy_timeout_seconds": 0.3}})
    assert h.get("/readyz") == (200, {"status": "ready"})
    assert h.get("/healthz") == (200, {"status": "ok"})
    away, back = database_outage(h)
    away()
    try:
        deadline = time.monotonic() + 15
        status, body = h.get("/readyz")
        while status == 200 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            status, body = h.get("/readyz")
        assert status == 503
        assert body["status"] == "unready"
        assert "database" in body["problems"]
        assert h.get("/healthz")[0] == 200  # alive, just not ready
    finally:
        back()
    deadline = time.monotonic() + 15
    while h.get("/readyz")[0] != 200 and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert h.get("/readyz") == (200, {"status": "ready"})
    # And it still works: the relay and workers survived the outage.
    r = await Receiver(secrets=[SECRET]).start()
    try:
        dest = await h.acreate_webhook(r.url, secret=SECRET)
        await wait_active(h, dest["id"])
        h.insert_events([("evt_after", "default", "a.b", "{}")])
        await r.wait_for(lambda: "evt_after" in r.counts(), what="delivery after the outage")
    finally:
        await r.stop()


async def test_readyz_names_a_schema_behind_this_herald(herald_factory: HeraldFactory) -> None:
    """A database restored from before the last migration (while Herald runs) is unready
    with a `migrations` problem, and ready again once the schema is back."""
    h = herald_factory()
    assert h.get("/readyz") == (200, {"status": "ready"})
    [(latest, *rest)] = h.query(
        "SELECT * FROM herald_schema_migrations ORDER BY version DESC LIMIT 1"
    )
    h.query("DELETE FROM herald_schema_migrations WHERE version = ?", (latest,))
    status, body = h.get("/readyz")
    assert status == 503, body
    assert body["problems"] == {"migrations": "schema is behind this Herald"}
    marks = ", ".join("?" * (1 + len(rest)))
    h.query(f"INSERT INTO herald_schema_migrations VALUES ({marks})", (latest, *rest))
    assert h.get("/readyz") == (200, {"status": "ready"})


def database_outage(h: Herald) -> tuple[Callable[[], None], Callable[[], None]]:
    """Make the database unusable for Herald, and bring it back.

    SQLite: another process holds the write lock. PostgreSQL: the database stops
    accepting connections and Herald's are terminated, as in a restart."""
    if h.backend == "sqlite":
        locker = sqlite3.connect(h.db_path, isolation_level=None)

        def lock() -> None:
            locker.execute("BEGIN EXCLUSIVE")

        def unlock() -> None:
            locker.execute("ROLLBACK")
            locker.close()

        return lock, unlock
    import psycopg

    name = h.database_url.rpartition("/")[2]

    def admin(sql: str) -> None:
        with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
            conn.execute(sql.encode())

    def stop() -> None:
        admin(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false')
        admin(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            f" WHERE datname = '{name}' AND pid <> pg_backend_pid()"
        )

    def start() -> None:
        admin(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS true')

    return stop, start


class NotifyListener:
    """A tiny stand-in for systemd: a Unix datagram socket set as NOTIFY_SOCKET."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="herald-notify-")
        self.path = os.path.join(self.dir, "notify.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.2)
        self.messages: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.messages.append(self.sock.recv(4096).decode())
            except TimeoutError:
                continue
            except OSError:
                return

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.sock.close()


@pytest.mark.backend_neutral
async def test_sd_notify_ready_watchdog_stopping(
    herald_factory: HeraldFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    listener = NotifyListener()
    try:
        monkeypatch.setenv("NOTIFY_SOCKET", listener.path)
        monkeypatch.setenv("WATCHDOG_USEC", "200000")  # ping every 0.1 s
        h = herald_factory()
        await asyncio.sleep(0.8)
        assert await h.astop() == 0
        await asyncio.sleep(0.3)
        msgs = listener.messages
        assert msgs, "no notification at all"
        assert msgs[0].startswith("READY=1")
        assert sum(m == "WATCHDOG=1" for m in msgs) >= 3
        assert "STOPPING=1" in msgs
        assert msgs.index("STOPPING=1") > 0
    finally:
        listener.close()


@pytest.mark.backend_neutral
async def test_sighup_rereads_the_log_level(herald_factory: HeraldFactory) -> None:
    h = herald_factory()
    text = h.config_path.read_text().replace('level = "info"', 'level = "debug"')
    h.config_path.write_text(text)
    assert h.proc is not None
    h.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if any(
            e.get("event") == "reloaded" and e.get("log_level") == "debug" for e in h.log_events()
        ):
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError(h.log())
    assert h.get("/healthz")[0] == 200


def test_unit_file_is_type_notify_and_hardened() -> None:
    unit = (Path(__file__).resolve().parents[2] / "deploy/systemd/herald.service").read_text()
    assert re.search(r"^Type=notify$", unit, re.M)
    assert re.search(r"^WatchdogSec=", unit, re.M)
    for directive in (
        "ProtectSystem=strict",
        "NoNewPrivileges=yes",
        "StateDirectory=herald",
        "ExecReload=/bin/kill -HUP $MAINPID",
    ):
        assert directive in unit


@pytest.mark.backend_neutral
async def test_metrics_can_have_a_listener_of_their_own(herald_factory: HeraldFactory) -> None:
    """metrics.listen: the scrape (and the probes) on another port, off the API's."""
    port = free_port()
    h = herald_factory({"metrics": {"listen": f"127.0.0.1:{port}"}})
    samples = await asyncio.to_thread(scrape, port)
    assert samples["herald_database_up"] == 1, "the metrics port answers /metrics"
    assert h.get("/readyz")[0] == 200
    with pytest.raises(urllib.error.HTTPError) as caught:
        await asyncio.to_thread(
            urllib.request.urlopen, f"http://127.0.0.1:{h.port}/metrics", timeout=5
        )
    caught.value.close()
    assert caught.value.code == 404
    assert h.get("/healthz")[0] == 200  # the API port keeps its probes
