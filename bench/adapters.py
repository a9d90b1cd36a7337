"""Messages/s through ``herald run`` to SQS and Kinesis (moto) and RabbitMQ (confirms).

One fresh SQLite Herald per type with one destination of that type; N events
pre-loaded; the clock runs from spawning ``herald run`` to the last delivery's
``updated_at``, as in ``throughput``. Targets:

- ``aws_sqs`` and ``aws_kinesis``: moto's server (``moto_server``, a
  subprocess on 127.0.0.1, from the dev extras), ``endpoint_url`` pointing at
  it; a standard queue, a 4-shard stream;
- ``rabbitmq``: the broker on 127.0.0.1:5672 (guest/guest, ``make services``
  starts it), a topic exchange of the run's own with one bound queue;
  publisher confirms (success = the broker confirmed).

Each row is checked against the target (SQS/RabbitMQ queue depth) and has a
ceiling measured in the same run: a bare uvloop loop with the same library
and Herald's per-destination concurrency (64) against the same target
(``bench/adapter_ceiling.py``). With moto, the ceiling is mostly moto itself,
and moto's SQS gets slower as its queue fills (measured here: about 84
messages/s into an empty queue, 36/s at 500 deep, 15/s at 1,500), so SQS
runs 1,000 events, Kinesis 2,000 and RabbitMQ 30,000 (at 5,000 the daemon's
start-up, about a second with its worker processes, was half the run); Herald
and its ceiling each start from an empty queue/stream of the same size, so
their ratio is fair.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.adapter_ceiling import ACCESS_KEY, REGION, SECRET_KEY
from bench.common import (
    DEFAULT_PHASE_TIMEOUT,
    REPO_ROOT,
    BenchError,
    Child,
    Deadline,
    free_port,
    grid,
    iso_now,
    load_avg,
    log,
    machine,
    run_cmd,
    wait_port,
    write_named,
)
from bench.daemon import HeraldInstance
from bench.runs import Burst, burst

NAME = "adapters"
HELP = "messages/s to SQS and Kinesis (moto) and RabbitMQ (confirms) through herald run"
EVENTS = {"aws_sqs": 1_000, "aws_kinesis": 2_000, "rabbitmq": 30_000}
QUICK_EVENTS = 300
KINDS = ("aws_sqs", "aws_kinesis", "rabbitmq")
AMQP_URL = os.environ.get("HERALD_BENCH_AMQP", "amqp://guest:guest@127.0.0.1:5672/")
CONCURRENCY = 64


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--events", type=int, default=None, help=f"events per type (default {EVENTS})"
    )
    parser.add_argument("--types", default=",".join(KINDS), help="comma-separated (%(default)s)")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_EVENTS} events per type")
    parser.add_argument("--timeout", type=float, default=DEFAULT_PHASE_TIMEOUT)


@contextlib.contextmanager
def moto_server(workdir: Path) -> Iterator[str]:
    binary = Path(sys.executable).parent / "moto_server"
    if not binary.exists():
        raise BenchError("moto_server not found: install the dev extras (make dev)")
    port = free_port()
    child = Child(
        "moto", [str(binary), "-H", "127.0.0.1", "-p", str(port)], log_path=workdir / "moto.log"
    )
    try:
        wait_port(port, timeout=30, alive=child.alive)
        yield f"http://127.0.0.1:{port}"
    finally:
        child.stop(timeout=10)


def _boto(service: str, endpoint: str) -> Any:
    import boto3

    return boto3.client(
        service,
        region_name=REGION,
        endpoint_url=endpoint,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
    )


async def _amqp(action: str, exchange: str) -> int:
    """``setup`` (exchange + bound queue), ``count`` (queue depth) or ``teardown``."""
    import aio_pika

    connection = await aio_pika.connect(AMQP_URL, timeout=10)
    try:
        channel = await connection.channel()
        if action == "setup":
            ex = await channel.declare_exchange(exchange, aio_pika.ExchangeType.TOPIC)
            queue = await channel.declare_queue(exchange, durable=True)
            await queue.bind(ex, "#")
            return 0
        if action == "count":
            queue = await channel.declare_queue(exchange, passive=True)
            return int(queue.declaration_result.message_count or 0)
        await channel.queue_delete(exchange)
        await channel.exchange_delete(exchange)
        return 0
    finally:
        await connection.close()


def _ceiling(kind: str, endpoint: str, target: str, events: int, timeout: float) -> float:
    argv = [sys.executable, "-m", "bench.adapter_ceiling", "--kind", kind, "--endpoint", endpoint]
    argv += ["--target", target, "--events", str(events), "--concurrency", str(CONCURRENCY)]
    argv += ["--timeout", str(timeout)]
    out = run_cmd(argv, timeout=timeout + 30, what=f"{kind} ceiling", cwd=REPO_ROOT)
    result = json.loads(out.strip().splitlines()[-1])
    if result["errors"]:
        raise BenchError(f"{kind} ceiling: {result['errors']} errors, first {result['first']}")
    return float(result["events"]) / float(result["seconds"])


def _herald(workdir: Path, body: dict[str, Any], events: int, timeout: float) -> Burst:
    inst = HeraldInstance(workdir)
    inst.migrate()
    dest = inst.create_destination(body)
    inst.activate(dest, Deadline("setup", timeout))
    inst.preload(events)
    return burst([inst], deliveries=events, events=events, deadline=Deadline("deliver", timeout))


def run(args: argparse.Namespace) -> int:
    kinds = [k.strip() for k in args.types.split(",") if k.strip()]
    load_before = load_avg()
    rows: dict[str, dict[str, Any]] = {}
    run_id = uuid.uuid4().hex[:8]
    with tempfile.TemporaryDirectory(prefix="herald-bench-") as scratch:
        workdir = Path(scratch)
        with moto_server(workdir) as moto:
            creds = {"key": ACCESS_KEY, "secret": SECRET_KEY, "endpoint_url": moto}
            for kind in kinds:
                events = args.events or (QUICK_EVENTS if args.quick else EVENTS.get(kind, 1000))
                sub = workdir / kind
                sub.mkdir()
                check: Callable[[], int]
                if kind == "aws_sqs":
                    sqs = _boto("sqs", moto)
                    queue_url = sqs.create_queue(QueueName=f"bench-{run_id}")["QueueUrl"]
                    ceiling_q = sqs.create_queue(QueueName=f"bench-{run_id}-ceiling")["QueueUrl"]
                    body = {"queue_url": queue_url, **creds}

                    def check(sqs: Any = sqs, url: str = queue_url) -> int:
                        attrs = sqs.get_queue_attributes(
                            QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"]
                        )
                        return int(attrs["Attributes"]["ApproximateNumberOfMessages"])

                    ceiling = ("sqs", moto, ceiling_q)
                elif kind == "aws_kinesis":
                    kinesis = _boto("kinesis", moto)
                    for name in (f"bench-{run_id}", f"bench-{run_id}-ceiling"):
                        kinesis.create_stream(StreamName=name, ShardCount=4)
                    body = {"stream_name": f"bench-{run_id}", "region": REGION, **creds}

                    def check() -> int:
                        return -1  # moto's records are not counted (reading them back is slow)

                    ceiling = ("kinesis", moto, f"bench-{run_id}-ceiling")
                elif kind == "rabbitmq":
                    exchange = f"herald-bench-{run_id}"
                    try:
                        asyncio.run(_amqp("setup", exchange))
                        asyncio.run(_amqp("setup", exchange + "-ceiling"))
                    except Exception as exc:
                        raise BenchError(
                            f"RabbitMQ at {AMQP_URL} is not usable ({exc!r}); `make services`"
                        ) from exc
                    body = {
                        "server_url": "127.0.0.1:5672",
                        "exchange": exchange,
                        "username": "guest",
                        "password": "guest",
                    }

                    def check(exchange: str = exchange) -> int:
                        return asyncio.run(_amqp("count", exchange))

                    ceiling = ("rabbitmq", AMQP_URL, exchange + "-ceiling")
                else:
                    raise BenchError(f"unknown type {kind}")
                try:
                    dest = {"name": f"bench {kind}", "type": kind, "events": ["*"], kind: body}
                    log(f"{kind}: {events} events through herald run")
                    result = _herald(sub, dest, events, args.timeout)
                    found = check()
                    if found != -1 and found < events:
                        raise BenchError(
                            f"{kind}: {found} messages at the target, expected {events}"
                        )
                    log(f"{kind}: herald {result.per_s:,.0f}/s; ceiling loop")
                    top = _ceiling(*ceiling, events, args.timeout)
                finally:
                    if kind == "rabbitmq":
                        for ex in (exchange, exchange + "-ceiling"):
                            with contextlib.suppress(Exception):
                                asyncio.run(_amqp("teardown", ex))
                rows[kind] = {
                    "events": events,
                    "per_s": round(result.per_s, 1),
                    "seconds": round(result.seconds, 3),
                    "ceiling_per_s": round(top, 1),
                    "ratio_to_ceiling": round(result.per_s / top, 3),
                    "at_target": found if found != -1 else None,
                    "rss_peak_mb": result.rss_mb[0],
                }
    load_after = load_avg()
    print(f"\nadapters, SQLite, one destination per type; {machine()}")
    print(f"load average (1 min) before/after: {load_before}/{load_after}")
    print(
        grid(
            ["type", "events", "seconds", "herald msg/s", "ceiling msg/s", "ratio"],
            [
                [
                    k,
                    r["events"],
                    r["seconds"],
                    r["per_s"],
                    r["ceiling_per_s"],
                    r["ratio_to_ceiling"],
                ]
                for k, r in rows.items()
            ],
        )
    )
    out: dict[str, Any] = {
        "types": rows,
        "targets": "moto_server (SQS, Kinesis) on 127.0.0.1; RabbitMQ 127.0.0.1:5672 with confirms",
        "ceiling": f"bare uvloop loop, same library, concurrency {CONCURRENCY}",
        "date": iso_now(),
        "machine": machine(),
        "load_avg_1m": [load_before, load_after],
    }
    if args.quick:
        out["quick"] = True
    write_named(NAME, out, quick=args.quick)
    return 0
