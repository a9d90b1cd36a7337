"""Celery and Dramatiq delivering the same signed webhooks, for the throughput benchmark.

Both run from ``bench/.venv-baselines`` (created on first use with
``python -m venv`` + pip; never the project's venv, so its dependencies stay
clean) with a Redis broker: the machine's on 127.0.0.1:6379 when it answers,
else a private ``redis-server`` (installed from Debian's packages when missing
and we are root) on a free port, without persistence, stopped by its PID.

Concurrency is what a user would pick on this machine's cores:

- Celery 5, prefork pool, ``-c 4×cores`` (8 on 2 cores): the workers block on
  HTTP, so more processes than cores; ``--prefetch-multiplier 32``, as Celery's
  docs advise for many short tasks (with the default 4 the pool starved for
  work here: about 80 deliveries/s against about 270/s with 32, tasks
  themselves taking 8 ms at the median);
- Dramatiq, ``cores`` processes × 8 threads (2 × 8 on 2 cores).

The clock runs from the first enqueue to the last 2xx the receiver logged
(nginx's ``$msec``), so enqueueing, broker round trips, task start-up and the
HTTP request all count, as Herald's relay, fan-out and delivery do. Every
event must arrive exactly once (counted in the access log); Redis keys are all
prefixed with the run's id and deleted afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench.common import (
    REPO_ROOT,
    BenchError,
    Child,
    Deadline,
    Row,
    free_port,
    log,
    nproc,
    run_cmd,
    wait_port,
)
from bench.receiver import AccessLog, Receiver, _apt

VENV = Path(__file__).resolve().parent / ".venv-baselines"
REQUIREMENTS = ("celery[redis]>=5,<6", "dramatiq[redis]>=1.15,<3", "requests>=2.31")
MARKER = VENV / ".bench-requirements"
INSTALL_TIMEOUT = 600.0
REDIS_PORT = 6379
REDIS_DB = 11
"""A database index of its own on a shared Redis; keys are prefixed per run as well."""


# --- the venv ------------------------------------------------------------------------
def ensure_venv() -> Path:
    """The baselines' interpreter, creating the venv and installing into it when needed."""
    python = VENV / "bin" / "python"
    wanted = "\n".join(REQUIREMENTS)
    if python.exists() and MARKER.exists() and MARKER.read_text() == wanted:
        return python
    base = getattr(sys, "_base_executable", sys.executable)
    if not python.exists():
        log(f"creating {VENV.relative_to(REPO_ROOT)} (python -m venv)")
        run_cmd([base, "-m", "venv", str(VENV)], timeout=120, what="python -m venv")
    log(f"installing {', '.join(REQUIREMENTS)} into {VENV.relative_to(REPO_ROOT)}")
    run_cmd(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            *REQUIREMENTS,
        ],
        timeout=INSTALL_TIMEOUT,
        what="pip install (baselines)",
    )
    MARKER.write_text(wanted)
    return python


# --- Redis ---------------------------------------------------------------------------
def redis_answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), 1.0) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def _redis_binary() -> str:
    found = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if os.access("/usr/bin/redis-server", os.X_OK) else None
    )
    if found:
        return found
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise BenchError("no Redis on 127.0.0.1:6379 and no redis-server; install Redis")
    log("redis-server not found; installing Debian's redis-server with apt-get")
    install = ["install", "-y", "-q", "--no-install-recommends", "redis-server"]
    if not _apt(install, 200) and not (_apt(["update", "-q"], 200) and _apt(install, 200)):
        raise BenchError("could not install redis-server with apt-get")
    found = shutil.which("redis-server")
    if not found:
        raise BenchError("redis-server still missing after apt-get install")
    return found


@contextlib.contextmanager
def redis(workdir: Path) -> Iterator[tuple[str, str]]:
    """(broker URL, note): the machine's Redis, or a private one stopped afterwards."""
    if redis_answers(REDIS_PORT):
        yield f"redis://127.0.0.1:{REDIS_PORT}/{REDIS_DB}", "machine's Redis on 127.0.0.1:6379"
        return
    binary = _redis_binary()
    port = free_port()
    argv = [binary, "--port", str(port), "--save", "", "--appendonly", "no"]
    argv += ["--bind", "127.0.0.1", "--dir", str(workdir)]
    child = Child("redis", argv, log_path=workdir / "redis.log")
    try:
        wait_port(port, timeout=15, alive=child.alive)
        yield f"redis://127.0.0.1:{port}/0", f"private redis-server on port {port}"
    finally:
        child.stop(timeout=10)


# --- one baseline --------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Plan:
    name: str
    label: str
    concurrency: str
    argv: list[str]


def plans(python: Path) -> list[Plan]:
    cores = nproc()
    bindir = python.parent
    celery_c = 4 * cores
    celery = [str(bindir / "celery"), "-A", "bench.baseline_workers", "worker"]
    celery += ["-P", "prefork", "-c", str(celery_c), "--prefetch-multiplier", "32"]
    celery += ["--loglevel", "WARNING"]
    celery += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
    dramatiq = [str(bindir / "dramatiq"), "bench.baseline_workers"]
    dramatiq += ["--processes", str(cores), "--threads", "8", "--queues", "bench"]
    return [
        Plan("celery", "celery 5 (redis, requests)", f"prefork -c {celery_c} prefetch x32", celery),
        Plan("dramatiq", "dramatiq (redis, requests)", f"{cores} processes x 8 threads", dramatiq),
    ]


def run_one(
    python: Path,
    plan: Plan,
    *,
    broker_url: str,
    recv: Receiver,
    secret: str,
    events: int,
    workdir: Path,
    timeout: float,
) -> Row:
    """Start the workers, enqueue ``events`` tasks, wait for the last 2xx, stop everything."""
    if recv.access_log is None:
        raise BenchError("the baselines need a receiver with an access log")
    prefix = f"herald-bench-{plan.name}-{uuid.uuid4().hex[:8]}"
    path = f"/{plan.name}"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("HERALD_", "VIRTUAL_ENV"))},
        "PYTHONPATH": str(REPO_ROOT),
        "BENCH_BASELINE": plan.name,
        "BENCH_BROKER_URL": broker_url,
        "BENCH_PREFIX": prefix,
        "BENCH_URL": recv.base + path,
        "BENCH_SECRET": secret,
        "PYTHONUNBUFFERED": "1",
    }
    accesses = AccessLog(recv.access_log)
    accesses.read_new()  # skip what earlier phases logged
    workers = Child(
        plan.name,
        plan.argv,
        log_path=workdir / f"{plan.name}.log",
        cwd=REPO_ROOT,
        env=env,
        group=True,
    )
    deadline = Deadline(plan.name, timeout)
    try:
        time.sleep(3.0)  # let the pool fork and connect to the broker before the clock starts
        if not workers.alive():
            raise BenchError(f"{plan.name} workers exited:\n{workers.log_tail()}")
        proc = subprocess.run(
            [str(python), "-m", "bench.baseline_workers", "enqueue", "--events", str(events)],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=REPO_ROOT,
            env=env,
            check=False,
        )
        if proc.returncode != 0:
            raise BenchError(f"{plan.name} enqueue exited {proc.returncode}: {proc.stderr[-2000:]}")
        marks = json.loads(proc.stdout.strip().splitlines()[-1])
        t0 = float(marks["t0"])
        log(f"{plan.name}: enqueued {events} in {float(marks['t1']) - t0:.2f} s")
        seen: set[str] = set()
        last = 0.0
        bad = 0
        duplicates = 0
        progress = time.monotonic()
        while len(seen) < events:
            if not workers.alive():
                raise BenchError(f"{plan.name} workers exited:\n{workers.log_tail()}")
            for hit in accesses.read_new():
                if hit.uri != path:
                    continue
                if not 200 <= hit.status < 300:
                    bad += 1
                    continue
                if hit.webhook_id in seen:
                    duplicates += 1
                seen.add(hit.webhook_id)
                last = max(last, hit.ts)
            if time.monotonic() - progress > 5:
                progress = time.monotonic()
                log(f"{plan.name}: {len(seen)}/{events} delivered")
            deadline.check(f"{len(seen)}/{events} delivered")
            time.sleep(0.25)
        if bad or duplicates:
            log(f"{plan.name}: {bad} non-2xx and {duplicates} duplicate requests")
    finally:
        workers.stop(timeout=20)
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            _cleanup(python, env)
    return Row(f"{plan.label}, {plan.concurrency}", events, last - t0)


def _cleanup(python: Path, env: dict[str, str]) -> None:
    subprocess.run(
        [str(python), "-m", "bench.baseline_workers", "cleanup"],
        capture_output=True,
        timeout=60,
        cwd=REPO_ROOT,
        env=env,
        check=False,
    )
