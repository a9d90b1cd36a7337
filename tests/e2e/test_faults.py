"""Faults, each bounded in time: crashes and graceful stops in a loop, dead, slow and
hostile receivers beside healthy ones, the database going away, filling up or turning
read-only. Deliveries land in nginx (tests/support/nginx.py), which logs every
``webhook-id`` it receives, so arrivals and duplicates are counted exactly."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import sqlite3
import subprocess
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from herald.dispatch import UNWRITTEN_FACTOR
from tests.e2e.conftest import SECRET, HeraldFactory
from tests.e2e.test_delivery import rows, wait_active, wait_deliveries
from tests.e2e.test_ops import database_outage
from tests.e2e.test_outage_signals import component_up, scrape, storage_errors
from tests.support.daemon import Herald
from tests.support.databases import ADMIN_DSN
from tests.support.hostile import BEHAVIOURS, Hostile
from tests.support.nginx import Nginx

pytestmark = pytest.mark.e2e

N_EVENTS = 2000
CYCLES = 3
PATHS = ("/a", "/b", "/c")
# The interrupted runs' receiver answers this many requests per second, so that on a
# fast machine the run still lasts long enough to be interrupted CYCLES times.
PACE_PER_SECOND = 2000


@pytest.fixture
def nginx() -> Iterator[Nginx]:
    n = Nginx()
    yield n
    n.stop()


@pytest.fixture
def paced_nginx() -> Iterator[Nginx]:
    n = Nginx(per_second=PACE_PER_SECOND)
    yield n
    n.stop()


def arrived(ng: Nginx, prefix: str) -> Counter[tuple[str, str]]:
    """(path, event id) → how often it reached nginx, for events whose id has ``prefix``."""
    return Counter({k: v for k, v in ng.arrivals().items() if k[1].startswith(prefix)})


async def eventually(
    probe: Callable[[], bool], *, timeout: float, what: str, h: Herald | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            tail = f"\n{h.log()[-3000:]}" if h is not None else ""
            raise AssertionError(f"timed out after {timeout} s waiting for {what}{tail}")
        await asyncio.sleep(0.05)


async def add_destinations(h: Herald, urls: dict[str, str], events: list[str]) -> dict[str, str]:
    """Create and verify one webhook per URL; name → destination id."""
    ids = {}
    for name, url in urls.items():
        dest = await h.acreate_webhook(url, secret=SECRET, name=name, events=events)
        ids[name] = dest["id"]
    for dest_id in ids.values():
        await wait_active(h, dest_id, timeout=30)
    return ids


async def interrupted_run(
    h: Herald, ng: Nginx, interrupt: Callable[[], Awaitable[None]], *, prefix: str
) -> Counter[tuple[str, str]]:
    """2,000 events to three destinations; ``interrupt`` the daemon at a random moment
    of the run and restart it, CYCLES times; then let it finish. Returns the arrivals.

    Each interrupt comes after a random 5-25 % of the run more has arrived, so at
    least a quarter of it is still to come at the last one (half a second or more
    at the receiver's pace: the arrivals are read every 50 ms, logged every 100)."""
    await add_destinations(h, {p: ng.url(p) for p in PATHS}, ["load.*"])
    total = N_EVENTS * len(PATHS)
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    h.insert_events(rows(N_EVENTS, prefix=prefix, type_="load.run"))
    for cycle in range(CYCLES):
        done = len(arrived(ng, prefix))
        target = done + rng.uniform(0.05, 0.25) * total
        await eventually(
            lambda t=target: len(arrived(ng, prefix)) >= t,  # type: ignore[misc]
            timeout=60,
            what=f"cycle {cycle} (seed {seed})",
            h=h,
        )
        assert len(arrived(ng, prefix)) < total, f"cycle {cycle} came too late (seed {seed})"
        await interrupt()
        await h.astart()
    await eventually(
        lambda: len(arrived(ng, prefix)) == total, timeout=90, what=f"all (seed {seed})", h=h
    )
    await wait_deliveries(h, "status = 'success' AND kind = 'event'", total, timeout=30)
    await asyncio.sleep(0.3)  # nginx flushes its log every 100 ms
    got = arrived(ng, prefix)
    expected = {(p, f"{prefix}{i:05d}") for p in PATHS for i in range(N_EVENTS)}
    assert set(got) == expected, f"missing {len(expected - set(got))} (seed {seed})"
    # The database agrees: one delivery per (event, destination), each a success
    # whose attempts include the arrival, nothing left leased.
    assert h.query(
        "SELECT status, COUNT(*) FROM herald_deliveries WHERE kind = 'event' GROUP BY status"
    ) == [("success", total)]
    assert h.query(
        "SELECT COUNT(*) FROM herald_deliveries WHERE lease_owner IS NOT NULL OR attempt_count < 1"
    ) == [(0,)]
    return got


# One process, and the attempts in `herald worker` children (the default on more
# than one core): a crash or a stop must lose nothing either way. The one-process
# run is the same store's: it runs on SQLite alone, the attempt processes on both.
PROCESSES = pytest.mark.parametrize(
    "processes",
    [
        pytest.param(1, id="1proc", marks=pytest.mark.backend_neutral),
        pytest.param(2, id="2workers"),
    ],
)


@PROCESSES
async def test_kill_9_loop_delivers_everything_at_least_once(
    herald_factory: HeraldFactory,
    paced_nginx: Nginx,
    record_property: Callable[[str, object], None],
    processes: int,
) -> None:
    h = herald_factory({"delivery": {"worker_processes": processes}}, start=False)
    await h.astart()

    async def crash() -> None:
        h.kill()

    got = await interrupted_run(h, paced_nginx, crash, prefix="evt_k9_")
    duplicates = sum(got.values()) - len(got)
    record_property("duplicates", duplicates)
    print(f"kill -9 x{CYCLES} on {h.backend}: {duplicates} duplicate arrivals of {len(got)}")
    # At least once: a crash resends what was sent but not yet recorded, never the
    # whole run. That is at most the attempts in flight (delivery.max_concurrency,
    # 256) and four times as many finished ones waiting to be written
    # (herald.dispatch.UNWRITTEN_FACTOR).
    assert duplicates <= CYCLES * (1 + UNWRITTEN_FACTOR) * 256, duplicates
    attempts = h.query(
        "SELECT COUNT(*) FROM herald_attempts a JOIN herald_deliveries d"
        " ON d.id = a.delivery_id WHERE d.kind = 'event'"
    )[0][0]
    assert attempts <= sum(got.values())  # no attempt recorded that did not happen


@PROCESSES
async def test_sigterm_loop_delivers_everything_exactly_once(
    herald_factory: HeraldFactory, paced_nginx: Nginx, processes: int
) -> None:
    h = herald_factory({"delivery": {"worker_processes": processes}}, start=False)
    await h.astart()
    codes: list[int] = []

    async def graceful() -> None:
        codes.append(await h.astop())

    got = await interrupted_run(h, paced_nginx, graceful, prefix="evt_term_")
    assert codes == [0] * CYCLES
    assert max(got.values()) == 1, [k for k, v in got.items() if v > 1][:5]
    # Every arrival is exactly one recorded attempt.
    attempts = h.query(
        "SELECT COUNT(*) FROM herald_attempts a JOIN herald_deliveries d"
        " ON d.id = a.delivery_id WHERE d.kind = 'event'"
    )[0][0]
    assert attempts == len(got)


# --- dead, slow and hostile receivers --------------------------------------------------


@pytest.fixture
def hostile() -> Iterator[Hostile]:
    server = Hostile(slow_seconds=10).start()
    yield server
    server.stop()


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.backend_neutral
async def test_hostile_receivers_do_not_starve_healthy_ones(
    herald_factory: HeraldFactory, nginx: Nginx, hostile: Hostile, request: pytest.FixtureRequest
) -> None:
    """A black hole, a 10 s answer, 500s, resets, an endless and a 1 GiB body beside two
    healthy destinations: the healthy ones keep most of their throughput, and reading
    the hostile bodies costs no memory (only the first KiB is read).

    Retries run at a realistic pace (1 s, 2 s, 4 s …): with the suite's 0.05 s base a
    failing destination would retry nine times within the measurement, which measures
    CPU sharing in one process, not isolation."""
    h = herald_factory({"delivery": {"backoff_base_seconds": 1.0}}, start=False)
    await h.astart()
    assert h.proc is not None
    # Stop the daemon before the hostile server: no connection arrives while it closes.
    request.addfinalizer(h.kill)
    await add_destinations(h, {"ok1": nginx.url("/ok1"), "ok2": nginx.url("/ok2")}, ["load.*"])
    n = 5000

    async def healthy_throughput(prefix: str) -> float:
        start = time.monotonic()
        h.insert_events(rows(n, prefix=prefix, type_="load.x"))
        await eventually(lambda: len(arrived(nginx, prefix)) == 2 * n, timeout=60, what=prefix, h=h)
        return 2 * n / (time.monotonic() - start)

    alone = await healthy_throughput("evt_alone_")
    bad = await add_destinations(h, {b: hostile.url(b) for b in BEHAVIOURS}, ["hostile.*"])
    baseline = rss_bytes(h.proc.pid)
    peak = baseline
    sampling = True

    async def sample() -> None:
        nonlocal peak
        assert h.proc is not None
        while sampling:
            peak = max(peak, rss_bytes(h.proc.pid))
            await asyncio.sleep(0.05)

    sampler = asyncio.create_task(sample())
    try:
        # Enough to hold the dead and slow ones at their concurrency limit (64 each) for
        # the whole measurement, and to keep the fast-failing ones busy.
        h.insert_events(rows(200, prefix="evt_hostile_", type_="hostile.x"))
        await eventually(
            lambda: all(hostile.requests[b] > 64 for b in BEHAVIOURS),
            timeout=30,
            what=f"hostile load ({hostile.requests})",
        )
        beside = await healthy_throughput("evt_beside_")
        # Let the slow and dead ones time out (5 s) at least once, with more bodies read.
        await asyncio.sleep(5.5)
    finally:
        sampling = False
        await sampler
    ratio = beside / alone
    print(f"healthy throughput alone {alone:.0f}/s, beside hostile {beside:.0f}/s ({ratio:.0%})")
    print(f"RSS {baseline / 2**20:.0f} MiB, peak {peak / 2**20:.0f} MiB, {hostile.requests}")
    # Loosely: each window here lasts 1-4 s (2 x 5,000 deliveries), this process also
    # runs the hostile server and the polling, and the 2 cores are shared (in `make test`
    # with the other test worker: with windows of 2 x 2,000 one such run measured 0.27
    # on PostgreSQL, the same code 0.60-0.71 alone). Five runs each on
    # 2026-11-24 (load 1.4-3.6) measured 0.49-0.87 on SQLite and 0.41-0.80 on PostgreSQL;
    # without the per-destination limit it was 0.2, so 0.3 sits between the two. Issue 9's
    # 90 % is bench/isolation.py's hostile_ratio (hostile server in its own process,
    # 45,000 healthy deliveries, CPU per process): 1.24, and Herald spent the same CPU on
    # the healthy deliveries beside the hostile set as alone (6.9 vs 7.1 s).
    assert ratio >= 0.3, (alone, beside)
    assert peak - baseline < 100 * 2**20, (baseline, peak)
    outcomes: dict[str, set[str]] = {}
    for dest_id, outcome in h.query(
        "SELECT DISTINCT d.destination_id, a.outcome FROM herald_attempts a"
        " JOIN herald_deliveries d ON d.id = a.delivery_id WHERE d.kind = 'event'"
    ):
        outcomes.setdefault(dest_id, set()).add(outcome)
    assert outcomes[bad["blackhole"]] == {"timeout"}
    assert outcomes[bad["slow"]] == {"timeout"}
    assert outcomes[bad["error"]] == {"failure_retryable"}
    assert outcomes[bad["reset"]] == {"failure_retryable"}
    # The endless and the huge body: 200 within the deadline is a success; the excerpt
    # stops at 1 KiB.
    for name in ("endless", "huge"):
        assert outcomes[bad[name]] == {"success"}
        longest = h.query(
            "SELECT MAX(LENGTH(a.response_excerpt)) FROM herald_attempts a JOIN herald_deliveries"
            " d ON d.id = a.delivery_id WHERE d.destination_id = ? AND d.kind = 'event'",
            (bad[name],),
        )[0][0]
        assert longest == 1024, (name, longest)


# --- the database in trouble -----------------------------------------------------------


async def readyz_problems(h: Herald) -> dict[str, str] | None:
    status, body = await asyncio.to_thread(h.get, "/readyz")
    return None if status == 200 else dict(body["problems"])


# Killing PostgreSQL's sessions can leave the test's own client streams to be
# collected after their loop closed; that noise is not what this test checks.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_database_outage_mid_run_loses_no_attempt_outcome(
    herald_factory: HeraldFactory, nginx: Nginx
) -> None:
    """SQLite locked by another process, or PostgreSQL refusing connections and dropping
    Herald's (a restart): /readyz says so, outcomes of attempts that finish meanwhile
    are kept and written later, and every delivery completes when the database is back.

    Beside two fast destinations, one answers after a second, so attempts are
    certainly in flight when the database goes and finish while it is away."""
    slow = Hostile(slow_seconds=1.0).start()
    try:
        h = herald_factory({"database": {"busy_timeout_seconds": 0.3}}, start=False)
        await h.astart()
        await add_destinations(h, {"a": nginx.url("/a"), "b": nginx.url("/b")}, ["load.*"])
        slow_id = (await add_destinations(h, {"slow": slow.url("slow")}, ["slow.*"]))["slow"]
        n, n_slow = 3000, 200
        h.insert_events(rows(n_slow, prefix="evt_slow_", type_="slow.x"))
        h.insert_events(rows(n, prefix="evt_out_", type_="load.x"))
        await eventually(
            lambda: len(arrived(nginx, "evt_out_")) >= n // 4 and slow.requests["slow"] > 64,
            timeout=60,
            what="a quarter, and the slow one busy",
            h=h,
        )
        away, back = database_outage(h)
        away()
        try:
            problems: dict[str, str] | None = None
            deadline = time.monotonic() + 15
            while problems is None and time.monotonic() < deadline:
                problems = await readyz_problems(h)
                await asyncio.sleep(0.1)
            assert problems is not None
            assert "database" in problems, problems
            assert (await asyncio.to_thread(h.get, "/healthz"))[0] == 200
            await asyncio.sleep(2)  # the slow attempts finish while nothing can be written
        finally:
            back()
        await eventually(
            lambda: len(arrived(nginx, "evt_out_")) == 2 * n, timeout=90, what="all", h=h
        )
        total = 2 * n + n_slow
        await wait_deliveries(h, "status = 'success' AND kind = 'event'", total, timeout=60)
        await eventually(lambda: h.get("/readyz")[0] == 200, timeout=15, what="ready again")
        assert await h.astop() == 0
    finally:
        slow.stop()
    got = arrived(nginx, "evt_out_")
    fast_attempts, slow_attempts = (
        h.query(
            "SELECT COUNT(*) FROM herald_attempts a JOIN herald_deliveries d"
            f" ON d.id = a.delivery_id WHERE d.destination_id {op} ?",
            (slow_id,),
        )[0][0]
        for op in ("<>", "=")
    )
    # Every request that reached a receiver is one recorded attempt: none was dropped.
    # (The fast ones' count includes their verification pings; so does nginx's log.)
    verifications = 2
    assert fast_attempts == sum(got.values()) + verifications, (fast_attempts, got.total())
    assert slow_attempts == slow.requests["slow"], (slow_attempts, slow.requests)
    events = h.log_events()
    assert any(e.get("event") == "record_attempts_failed" for e in events), "no outcome waited"
    assert any(e.get("event") in ("relay_storage_error", "claim_storage_error") for e in events)
    # Deliveries claimed again after their leases ran out during the outage started no
    # second attempt, and every slot came back: the stop did not wait out its grace.
    for unwanted in ("attempt_outcome_unexpected", "attempts_cancelled_at_shutdown"):
        assert not [e for e in events if e.get("event") == unwanted], unwanted
    # ... nor were they sent twice: no delivery has two attempts of the same number.
    twice = h.query(
        "SELECT delivery_id, number FROM herald_attempts"
        " GROUP BY delivery_id, number HAVING COUNT(*) > 1"
    )
    assert not twice, twice[:5]


@contextlib.contextmanager
def small_filesystem(directory: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` at ``directory`` (needs root; skips the test otherwise)."""
    directory.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=False)


def remount(directory: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(directory)], check=True)


def fill(directory: Path, leave: int) -> Path:
    """Take all but ``leave`` bytes of the filesystem at ``directory``."""
    st = os.statvfs(directory)
    free = st.f_bavail * st.f_frsize
    filler = directory / "filler"
    with filler.open("wb") as fh:
        fh.write(b"\0" * max(free - leave, 0))
    return filler


def pg_admin(sql: str) -> None:
    import psycopg

    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        conn.execute(sql.encode())


async def test_a_database_that_refuses_writes_makes_herald_unready_and_loses_nothing(
    herald_factory: HeraldFactory, nginx: Nginx, tmp_path: Path
) -> None:
    """SQLite: the disk fills up (a small tmpfs). PostgreSQL: the database turns read-only
    (as after a failover to a replica). Reads still work, so only the failing writes can
    tell: /readyz names them, the outbox keeps every row, nothing is corrupted, and all
    of it is delivered once writes work again."""
    n = 1000
    payload = json.dumps({"pad": "p" * 1000})
    with contextlib.ExitStack() as stack:
        h = herald_factory({"relay": {"batch_size": 2 * n}}, start=False)
        disk: Path | None = None
        if h.backend == "sqlite":
            disk = stack.enter_context(small_filesystem(tmp_path / "disk", "16m"))
            url = f"sqlite:///{disk}/herald.db"
            h.config_path.write_text(h.config_path.read_text().replace(h.database_url, url))
            h.db_path, h.database_url = disk / "herald.db", url
        await h.astart()
        await add_destinations(h, {"a": nginx.url("/a")}, ["load.*"])
        name = h.database_url.rpartition("/")[2]
        rows_ = [(f"evt_full_{i:05d}", "default", "load.x", payload) for i in range(n)]
        conn = h.connect()
        try:
            if disk is not None:
                # The rows go in as one transaction; just before it commits, the disk
                # fills up to leave room for the commit but not for the relay's copy.
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany(
                    "INSERT INTO herald_outbox (id, tenant_id, type, data) VALUES (?, ?, ?, ?)",
                    rows_,
                )
                filler = fill(disk, leave=1_600_000)
                conn.execute("COMMIT")
                cause = "disk is full"
            else:
                pg_admin(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
                pg_admin(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    f" WHERE datname = '{name}' AND pid <> pg_backend_pid()"
                )
                conn.close()
                conn = h.connect()  # the producer itself may still write
                conn.execute("SET default_transaction_read_only = off")
                conn.executemany(
                    "INSERT INTO herald_outbox (id, tenant_id, type, data) VALUES (?, ?, ?, ?)",
                    rows_,
                )
                cause = "read-only transaction"
        finally:
            conn.close()
        problems: dict[str, str] | None = None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            problems = await readyz_problems(h)
            if problems and cause in problems.get("relay", ""):
                break
            await asyncio.sleep(0.1)
        assert problems is not None
        assert cause in problems.get("relay", ""), problems
        assert "cannot write to the database" in problems["relay"]
        assert (await asyncio.to_thread(h.get, "/healthz"))[0] == 200
        assert h.proc is not None
        assert h.proc.poll() is None
        assert h.query("SELECT COUNT(*) FROM herald_outbox") == [(n,)]  # all still there
        assert any(
            e.get("event") == "relay_storage_error" and cause in e.get("error", "")
            for e in h.log_events()
        )
        # Prometheus sees it too: reads work, yet the database is down for Herald.
        samples = await asyncio.to_thread(scrape, h)
        assert samples[("herald_database_up", ())] == 0, samples
        assert storage_errors(samples, "relay") > 0
        assert component_up(samples, "relay") == 0
        # Writes work again: everything flows, and /readyz says so.
        if disk is not None:
            filler.unlink()
        else:
            pg_admin(f'ALTER DATABASE "{name}" SET default_transaction_read_only = off')
            pg_admin(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                f" WHERE datname = '{name}' AND pid <> pg_backend_pid()"
            )
        await eventually(lambda: len(arrived(nginx, "evt_full_")) == n, timeout=60, what="all", h=h)
        await eventually(lambda: h.get("/readyz")[0] == 200, timeout=15, what="ready again")
        await eventually(
            lambda: scrape(h).get(("herald_database_up", ())) == 1, timeout=40, what="up again"
        )
        assert await h.astop() == 0
        assert h.query("SELECT COUNT(*) FROM herald_outbox") == [(0,)]
        assert h.query(
            "SELECT COUNT(*) FROM herald_deliveries WHERE kind = 'event' AND status = 'success'"
        ) == [(n,)]
        if disk is not None:
            with contextlib.closing(sqlite3.connect(disk / "herald.db")) as db:
                assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_an_idle_daemon_whose_database_refuses_writes_is_unready(
    herald_factory: HeraldFactory, tmp_path: Path
) -> None:
    """Issue 31: with nothing in flight no component of the pipeline writes, and /readyz
    answered ready while every write failed. It follows the heartbeat (a write every
    delivery.heartbeat_seconds, idle or not) now."""
    with contextlib.ExitStack() as stack:
        h = herald_factory({"delivery": {"heartbeat_seconds": 1.0}}, start=False)
        disk: Path | None = None
        if h.backend == "sqlite":
            disk = stack.enter_context(small_filesystem(tmp_path / "disk", "16m"))
            url = f"sqlite:///{disk}/herald.db"
            h.config_path.write_text(h.config_path.read_text().replace(h.database_url, url))
            h.db_path, h.database_url = disk / "herald.db", url
        await h.astart()
        await eventually(lambda: h.get("/readyz")[0] == 200, timeout=15, what="ready")
        name = h.database_url.rpartition("/")[2]
        if disk is not None:
            filler = fill(disk, leave=0)
            cause = "disk is full"
        else:
            pg_admin(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
            pg_admin(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                f" WHERE datname = '{name}' AND pid <> pg_backend_pid()"
            )
            cause = "read-only transaction"
        try:
            problems: dict[str, str] | None = None
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                problems = await readyz_problems(h)
                if problems and "cannot write" in problems.get("database", ""):
                    break
                await asyncio.sleep(0.1)
            assert problems is not None, "ready while the database refuses every write"
            assert "cannot write to the database" in problems["database"], problems
            assert cause in problems["database"], problems
            assert (await asyncio.to_thread(h.get, "/healthz"))[0] == 200
        finally:
            if disk is not None:
                filler.unlink()
            else:
                pg_admin(f'ALTER DATABASE "{name}" SET default_transaction_read_only = off')
                pg_admin(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    f" WHERE datname = '{name}' AND pid <> pg_backend_pid()"
                )
        await eventually(lambda: h.get("/readyz")[0] == 200, timeout=15, what="ready again")
        assert await h.astop() == 0


async def test_a_read_only_database_at_start_is_a_clear_error(
    herald_factory: HeraldFactory, tmp_path: Path
) -> None:
    """SQLite on a read-only filesystem, or a read-only PostgreSQL database: `herald run`
    and `herald migrate` exit 1 with one line saying why; the data is untouched."""
    with contextlib.ExitStack() as stack:
        h = herald_factory(start=False)
        disk: Path | None = None
        if h.backend == "sqlite":
            disk = stack.enter_context(small_filesystem(tmp_path / "disk", "8m"))
            url = f"sqlite:///{disk}/herald.db"
            h.config_path.write_text(h.config_path.read_text().replace(h.database_url, url))
            h.db_path, h.database_url = disk / "herald.db", url
        await h.astart()
        dest = await h.acreate_webhook("http://127.0.0.1:9/hook", secret=SECRET)
        assert await h.astop() == 0
        name = h.database_url.rpartition("/")[2]
        if disk is not None:
            remount(disk, "ro")
            cause = "read-only"  # "Read-only file system", "mounted read-only"
        else:
            pg_admin(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
            cause = "read-only transaction"
        try:
            for command in ("run", "migrate"):
                proc = await h.acli(command, check=False)
                assert proc.returncode == 1, (command, proc.stderr)
                lines = proc.stderr.strip().splitlines()
                if command == "run":  # a daemon logging JSON (log.format): its last line too
                    assert len(lines) == 1, (command, proc.stderr)
                    last = json.loads(lines[0])
                    assert (last["event"], last["exit_code"]) == ("herald_failed", 1), last
                    assert cause in last["error"].lower(), last
                    assert last["hint"], last
                else:
                    assert len(lines) == 2, (command, proc.stderr)  # the error and a hint
                    assert lines[0].startswith("herald: error: "), lines
                    assert lines[1].startswith("herald: hint: "), lines
                    assert cause in lines[0].lower(), lines
        finally:
            if disk is not None:
                remount(disk, "rw")
            else:
                pg_admin(f'ALTER DATABASE "{name}" SET default_transaction_read_only = off')
        if disk is not None:
            with contextlib.closing(sqlite3.connect(disk / "herald.db")) as db:
                assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        # Readable and writable again, nothing lost.
        shown = await h.acli_json("destinations", "show", dest["id"])
        assert (shown["name"], shown["webhook"]["secret"]) == ("test hook", "********")
