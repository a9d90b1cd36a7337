"""``delivery.worker_processes``: attempts made by ``herald worker`` children.

The daemon keeps the database work and the limits; the children sign, send and read
the answers. Checked the way an operator would: the processes exist, every event
arrives once and verifies, the metrics count what the children did, SIGTERM stops
them all, and a child killed with ``kill -9`` stops the instance loudly (exit 1)
without losing an event.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest
from aiohttp import web

from herald.config import load_settings
from herald.workers import WorkerPool
from tests.e2e.conftest import SECRET, HeraldFactory
from tests.e2e.test_delivery import all_arrived, rows, wait_active, wait_deliveries
from tests.e2e.test_ops import scrape
from tests.support.receiver import Received, Receiver, verification_ok_then

pytestmark = pytest.mark.e2e

WORKERS = {"delivery": {"worker_processes": 2}}


def children(pid: int) -> list[int]:
    """Live child processes of ``pid`` that are attempt processes: forked by ``herald
    run`` and named ``herald worker`` (what ``top`` and ``pgrep`` show), or executed as
    ``herald worker``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            comm = (stat.parent / "comm").read_text().strip()
            cmdline = (stat.parent / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        worker = comm == "herald worker" or b"worker" in cmdline
        if int(fields[1]) == pid and fields[0] != "Z" and worker:
            found.append(int(stat.parent.name))
    return sorted(found)


def alive(pid: int) -> bool:
    """Running (a zombie, exited but not yet reaped, does not count)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


async def test_worker_processes_deliver_every_event_once_signed(
    herald_factory: HeraldFactory,
) -> None:
    h = herald_factory(WORKERS | {"metrics": {"refresh_seconds": 0.1}}, start=False)
    await h.astart()
    assert h.proc is not None
    workers = children(h.proc.pid)
    assert len(workers) == 2, workers
    # Forked (none of them spent its start importing Herald again), and named for `top`.
    titles = {Path(f"/proc/{pid}/comm").read_text().strip() for pid in workers}  # noqa: ASYNC240
    assert titles == {"herald worker"}
    # Ready means ready: the children had loaded before the daemon said it serves.
    names = [e.get("event") for e in h.log_events()]
    assert names.index("workers_started") < names.index("herald_started"), names
    receivers = [await Receiver(secrets=[SECRET]).start() for _ in range(2)]
    try:
        for i, r in enumerate(receivers):
            dest = await h.acreate_webhook(r.url, secret=SECRET, name=f"r{i}")
            await wait_active(h, dest["id"])
        n = 500
        h.insert_events(rows(n, prefix="evt_wp"))
        for r in receivers:
            await r.wait_for(all_arrived(r, n), timeout=60, what="every event")
        await wait_deliveries(h, "status = 'success' AND kind = 'event'", 2 * n)
        for r in receivers:
            counts = r.counts("task_run.completed")
            assert max(counts.values()) == 1, "a delivery arrived twice without a crash"
            assert all(x.verified for x in r.received), r.errors[:3]
        # The children's attempts are counted by the daemon's /metrics.
        completed = 'herald_deliveries_completed_total{destination_type="webhook",status="success"}'
        deadline = time.monotonic() + 10
        while scrape(h.port).get(completed) != 2 * n:
            assert time.monotonic() < deadline, scrape(h.port).get(completed)
            await asyncio.sleep(0.1)
        attempts = h.query("SELECT COUNT(*) FROM herald_attempts WHERE outcome = 'success'")
        assert attempts == [(2 * n + 2,)]  # and the two verifications
        assert await h.astop() == 0
        assert not [p for p in workers if alive(p)], "a worker outlived the daemon"
    finally:
        for r in receivers:
            await r.stop()


async def test_a_killed_worker_stops_the_instance_and_nothing_is_lost(
    herald_factory: HeraldFactory,
) -> None:
    h = herald_factory(WORKERS, start=False)
    await h.astart()
    assert h.proc is not None

    async def sluggish(_: Received) -> web.StreamResponse:
        await asyncio.sleep(0.02)
        return web.Response(status=204)

    r = await Receiver(secrets=[SECRET], behaviour=verification_ok_then(sluggish)).start()
    try:
        dest = await h.acreate_webhook(r.url, secret=SECRET)
        await wait_active(h, dest["id"])
        n = 600
        h.insert_events(rows(n, prefix="evt_wk"))
        await r.wait_for(
            lambda: len(r.counts("task_run.completed")) > 50, what="deliveries before the kill"
        )
        workers = children(h.proc.pid)
        victim = workers[0]
        os.kill(victim, signal.SIGKILL)
        code = await asyncio.to_thread(h.wait_exit, 30)
        assert code == 1, h.log()[-3000:]
        assert f"(pid {victim}) exited" in h.log(), h.log()[-3000:]
        assert len(r.counts("task_run.completed")) < n, "the kill came too late to prove anything"
        deadline = time.monotonic() + 10
        while [p for p in workers if alive(p)]:
            assert time.monotonic() < deadline, "the other worker outlived the daemon"
            await asyncio.sleep(0.1)
        await h.astart()  # as a supervisor would
        await r.wait_for(all_arrived(r, n), timeout=90, what="every event after the restart")
        await wait_deliveries(h, "status = 'success' AND kind = 'event'", n)
        assert await h.astop() == 0
    finally:
        await r.stop()


async def test_children_that_never_start_go_with_a_daemon_that_fails_first(
    herald_factory: HeraldFactory,
) -> None:
    """``herald run`` forks its children before anything else, and they wait for the
    database to be migrated. A daemon that gives up before (here: the schema is newer
    than this Herald) leaves none of them behind."""
    h = herald_factory(WORKERS, start=False)
    h.cli("migrate")
    h.query(
        "INSERT INTO herald_schema_migrations (version, name, applied_at)"
        " VALUES (999, 'from the future', 0)"
    )
    with pytest.raises(AssertionError, match="herald run exited with 1"):
        await h.astart()
    assert "newer than this Herald" in h.log()
    mine = str(h.config_path).encode()

    def left_behind() -> list[int]:
        found = []
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                if mine in cmdline.read_bytes() and alive(int(cmdline.parent.name)):
                    found.append(int(cmdline.parent.name))
            except (OSError, ValueError):
                continue
        return found

    deadline = time.monotonic() + 10
    while left_behind():
        assert time.monotonic() < deadline, f"children outlived the daemon: {left_behind()}"
        await asyncio.sleep(0.1)


async def test_a_worker_that_cannot_start_fails_the_start_loudly(tmp_path: Path) -> None:
    """A child that exits before it is ready (here: its config file is invalid) makes
    the start fail with its exit status, and leaves no child behind."""
    good = tmp_path / "good.toml"
    good.write_text(f'[database]\nurl = "sqlite:///{tmp_path}/h.db"\n')
    bad = tmp_path / "bad.toml"
    bad.write_text("[delivery]\nworker_processes = 'many'\n")
    pool = WorkerPool(load_settings(good).model_copy(), config_path=bad)
    with pytest.raises(
        RuntimeError, match=r"worker process \d \(pid \d+\) did not start: exited 2"
    ):
        await pool.start()
    assert pool.pids
    assert not [p for p in pool.pids if alive(p)]
