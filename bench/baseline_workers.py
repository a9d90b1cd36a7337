"""The Celery and Dramatiq side of the throughput baselines (runs in ``bench/.venv-baselines``).

Imported by ``celery -A bench.baseline_workers worker`` and by
``dramatiq bench.baseline_workers`` in that venv, and run as
``python -m bench.baseline_workers enqueue|cleanup`` there. It uses the
standard library plus what that venv has (celery, dramatiq, redis, requests),
imported dynamically so the project's type checker does not need them; it
must not import the rest of ``bench`` (whose dependencies live in the
project's venv).

Configuration comes from the environment: ``BENCH_BASELINE`` (``celery`` or
``dramatiq``), ``BENCH_BROKER_URL``, ``BENCH_PREFIX`` (the queue name and
Dramatiq's key namespace), ``BENCH_URL`` and ``BENCH_SECRET``.

Each task does what a user's webhook task would: build the envelope, compute
the Standard Webhooks signature, POST with ``requests`` (one keep-alive
session per process or thread), and raise unless the answer is 2xx.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import importlib
import json
import os
import threading
import time
from typing import Any

EVENT_TYPE = "task_run.completed"
KIND = os.environ.get("BENCH_BASELINE", "")
BROKER_URL = os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/0")
PREFIX = os.environ.get("BENCH_PREFIX", "herald-bench")
URL = os.environ.get("BENCH_URL", "")
SECRET = os.environ.get("BENCH_SECRET", "")
REQUEST_TIMEOUT = 5.0


# --- the workload (byte-identical to bench.common.payload / envelope) ----------------
def event_id(i: int) -> str:
    return f"evt_bench{i:010d}"


def payload(i: int) -> str:
    secs = 30 + i % 90
    return json.dumps(
        {
            "task_run_id": f"tr_{i:010d}",
            "workflow": "nightly-invoice-sync",
            "status": "completed",
            "attempt": 1 + i % 3,
            "duration_ms": secs * 1000 + i % 1000,
            "finished_at": f"2025-06-01T02:{secs % 60:02d}:{i % 60:02d}.000Z",
            "records": {"read": 1800 + i % 97, "written": 1790 + i % 89, "skipped": i % 7},
        },
        separators=(",", ":"),
    )


def envelope(evt_id: str, type_: str, created_at: str, data: str) -> bytes:
    head = json.dumps(
        {"id": evt_id, "type": type_, "created_at": created_at}, separators=(",", ":")
    )
    return (head[:-1] + ',"data":' + data + "}").encode()


# --- the task body ----------------------------------------------------------------
_local = threading.local()


def _session() -> Any:
    session = getattr(_local, "session", None)
    if session is None:
        session = importlib.import_module("requests").Session()
        _local.session = session
    return session


def _key() -> bytes:
    return base64.b64decode(SECRET.removeprefix("whsec_"))


def deliver(evt_id: str, type_: str, created_at: str, data: str) -> int:
    """Sign and POST one event; raise unless the receiver answered 2xx."""
    body = envelope(evt_id, type_, created_at, data)
    ts = str(int(time.time()))
    mac = hmac.new(_key(), f"{evt_id}.{ts}.".encode() + body, hashlib.sha256).digest()
    headers = {
        "content-type": "application/json",
        "webhook-id": evt_id,
        "webhook-timestamp": ts,
        "webhook-signature": "v1," + base64.b64encode(mac).decode(),
    }
    resp = _session().post(
        URL, data=body, headers=headers, timeout=REQUEST_TIMEOUT, allow_redirects=False
    )
    if not 200 <= resp.status_code < 300:
        raise RuntimeError(f"HTTP {resp.status_code} for {evt_id}")
    return int(resp.status_code)


# --- Celery ---------------------------------------------------------------------
def _celery_app() -> tuple[Any, Any]:
    celery = importlib.import_module("celery")
    application = celery.Celery("herald_bench", broker=BROKER_URL)
    application.conf.update(
        task_default_queue=PREFIX,
        task_ignore_result=True,
        broker_connection_retry_on_startup=True,
        worker_enable_remote_control=False,
        worker_hijack_root_logger=False,
    )
    task = application.task(name="herald_bench.deliver")(deliver)
    return application, task


# --- Dramatiq --------------------------------------------------------------------
def _dramatiq_actor() -> Any:
    dramatiq = importlib.import_module("dramatiq")
    redis_broker = importlib.import_module("dramatiq.brokers.redis")
    broker = redis_broker.RedisBroker(url=BROKER_URL, namespace=PREFIX)
    dramatiq.set_broker(broker)
    return dramatiq.actor(deliver, actor_name="deliver", queue_name="bench", max_retries=0)


app: Any = None
celery_task: Any = None
dramatiq_actor: Any = None
if KIND == "celery":
    app, celery_task = _celery_app()
elif KIND == "dramatiq":
    dramatiq_actor = _dramatiq_actor()


# --- commands ----------------------------------------------------------------------
def enqueue(events: int) -> dict[str, float]:
    """Enqueue ``events`` tasks one by one, as a producer would; the wall times around it."""
    created_at = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())
    datas = [payload(i) for i in range(events)]
    if KIND == "celery":
        send = celery_task.delay
    elif KIND == "dramatiq":
        send = dramatiq_actor.send
    else:
        raise SystemExit("BENCH_BASELINE must be celery or dramatiq")
    t0 = time.time()
    for i in range(events):
        send(event_id(i), EVENT_TYPE, created_at, datas[i])
    return {"t0": t0, "t1": time.time()}


def cleanup() -> int:
    """Delete the Redis keys this run created (the queue and Dramatiq's namespace start with
    ``BENCH_PREFIX``; kombu adds ``_kombu.binding*.<queue>``)."""
    redis = importlib.import_module("redis")
    client = redis.Redis.from_url(BROKER_URL)
    keys = [
        key
        for pattern in (f"{PREFIX}*", f"_kombu.binding*.{PREFIX}*")
        for key in client.scan_iter(match=pattern, count=1000)
    ]
    if keys:
        client.delete(*keys)
    return len(keys)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.baseline_workers")
    parser.add_argument("command", choices=("enqueue", "cleanup"))
    parser.add_argument("--events", type=int, default=0)
    args = parser.parse_args()
    if args.command == "enqueue":
        print(json.dumps(enqueue(args.events)))
    else:
        print(json.dumps({"deleted": cleanup()}))


if __name__ == "__main__":
    main()
