"""An adapter's ceiling: a bare uvloop loop publishing the same envelopes, same library.

``python -m bench.adapter_ceiling --kind sqs|kinesis|rabbitmq …`` runs
``--concurrency`` workers (Herald's ``delivery.max_per_destination``, 64) over
one client: aiobotocore ``SendMessage`` (with the four metadata attributes) /
``PutRecord`` (partition key = event id), or aio-pika publishing persistent
messages on a publisher-confirm channel. Nothing is persisted; the clock runs
from the first call to the last answer. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from bench.common import EVENT_TYPE, TENANT, envelope, event_id, iso_ms, payload

ACCESS_KEY = "AKIAHERALDBENCH00001"
SECRET_KEY = "herald-bench-secret-key"
REGION = "us-east-1"


async def _workers(
    events: int, concurrency: int, send: Callable[[int, bytes], Awaitable[None]]
) -> tuple[float, int, str]:
    created_at = iso_ms(time.time())
    bodies = [envelope(event_id(i), EVENT_TYPE, created_at, payload(i)) for i in range(events)]
    next_index = 0
    errors = 0
    first = ""

    async def worker() -> None:
        nonlocal next_index, errors, first
        while next_index < events:
            i = next_index
            next_index += 1
            try:
                await send(i, bodies[i])
            except Exception as exc:
                errors += 1
                first = first or repr(exc)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - t0, errors, first


async def _aws(args: argparse.Namespace) -> tuple[float, int, str]:
    from aiobotocore.config import AioConfig
    from aiobotocore.session import get_session

    service = "sqs" if args.kind == "sqs" else "kinesis"
    config = AioConfig(max_pool_connections=args.concurrency, retries={"max_attempts": 0})
    async with get_session().create_client(
        service,
        region_name=REGION,
        endpoint_url=args.endpoint,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        config=config,
    ) as client:

        async def send(i: int, body: bytes) -> None:
            evt = event_id(i)
            if service == "sqs":
                attrs: dict[str, Any] = {
                    name: {"DataType": "String", "StringValue": value}
                    for name, value in (
                        ("event-id", evt),
                        ("event-type", EVENT_TYPE),
                        ("event-created-at", "2025-06-01T00:00:00Z"),
                        ("tenant-id", TENANT),
                    )
                }
                await client.send_message(
                    QueueUrl=args.target, MessageBody=body.decode(), MessageAttributes=attrs
                )
            else:
                await client.put_record(StreamName=args.target, Data=body, PartitionKey=evt)

        return await _workers(args.events, args.concurrency, send)


async def _rabbitmq(args: argparse.Namespace) -> tuple[float, int, str]:
    import aio_pika

    connection = await aio_pika.connect(args.endpoint)
    try:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.get_exchange(args.target, ensure=True)

        async def send(i: int, body: bytes) -> None:
            message = aio_pika.Message(
                body,
                content_type="application/json",
                message_id=event_id(i),
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                headers={"event-id": event_id(i), "event-type": EVENT_TYPE, "tenant-id": TENANT},
            )
            await exchange.publish(message, EVENT_TYPE)

        return await _workers(args.events, args.concurrency, send)
    finally:
        await connection.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.adapter_ceiling")
    parser.add_argument("--kind", choices=("sqs", "kinesis", "rabbitmq"), required=True)
    parser.add_argument("--endpoint", required=True, help="moto URL or amqp:// URL")
    parser.add_argument("--target", required=True, help="queue URL, stream or exchange")
    parser.add_argument("--events", type=int, required=True)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args()

    import uvloop

    async def bounded() -> tuple[float, int, str]:
        async with asyncio.timeout(args.timeout):
            if args.kind == "rabbitmq":
                return await _rabbitmq(args)
            return await _aws(args)

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        seconds, errors, first = runner.run(bounded())
    print(json.dumps({"events": args.events, "seconds": seconds, "errors": errors, "first": first}))


if __name__ == "__main__":
    main()
