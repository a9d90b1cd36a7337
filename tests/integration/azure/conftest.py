"""The Service Bus test broker and a reader that receives with the real SDK."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from azure.servicebus import ServiceBusReceivedMessage, ServiceBusReceiveMode
from azure.servicebus.aio import ServiceBusClient, ServiceBusReceiver

from tests.integration.azure.broker import Broker

ENTITY = "orders"


@pytest.fixture
def broker() -> Iterator[Broker]:
    b = Broker(entities=[ENTITY]).start()
    try:
        yield b
    finally:
        b.stop()


@dataclass(frozen=True)
class Received:
    """One message as the SDK's receiver hands it over (properties decoded from bytes)."""

    body: bytes
    application_properties: dict[str, str]
    message_id: str | None
    subject: str | None
    content_type: str | None
    session_id: str | None = None


def _decode(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


async def receive(
    connection_string: str,
    entity: str,
    count: int,
    *,
    subscription: str | None = None,
    timeout: float = 15.0,
) -> list[Received]:
    """Receive (peek-lock, then complete) ``count`` messages with the SDK's receiver: from
    queue ``entity``, or from ``subscription`` of topic ``entity`` when one is named."""
    got: list[Received] = []
    deadline = time.monotonic() + timeout
    async with ServiceBusClient.from_connection_string(connection_string, retry_total=0) as client:
        mode = ServiceBusReceiveMode.PEEK_LOCK
        if subscription is None:
            receiver = client.get_queue_receiver(entity, receive_mode=mode)
        else:
            receiver = client.get_subscription_receiver(entity, subscription, receive_mode=mode)
        async with receiver as rx:
            await _receive_into(got, rx, entity, count, deadline)
    return got


async def _receive_into(
    got: list[Received], rx: ServiceBusReceiver, entity: str, count: int, deadline: float
) -> None:
    while len(got) < count:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"received {len(got)} of {count} messages from {entity}")
        async with asyncio.timeout(left + 5):
            batch: list[ServiceBusReceivedMessage] = await rx.receive_messages(
                max_message_count=min(count - len(got), 100), max_wait_time=min(left, 1.0)
            )
            for message in batch:
                got.append(
                    Received(
                        body=b"".join(message.body),
                        application_properties={
                            _decode(k): _decode(v)
                            for k, v in (message.application_properties or {}).items()
                        },
                        message_id=message.message_id,
                        subject=message.subject,
                        content_type=message.content_type,
                        session_id=message.session_id,
                    )
                )
                await rx.complete_message(message)
