"""The shared-client pool the cloud adapters use (``herald.adapters.pool``)."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from herald.adapters.base import ShuttingDown
from herald.adapters.pool import ClientPool


class Client:
    ids = itertools.count(1)

    def __init__(self) -> None:
        self.id = next(self.ids)
        self.closed = False


class Harness:
    def __init__(self, *, open_delay: float = 0.0, fail: bool = False) -> None:
        self.opened: list[Client] = []
        self.open_delay = open_delay
        self.fail = fail
        self.hang_on_close = False
        self.pool: ClientPool[str, Client] = ClientPool(
            name="test", close=self.close, close_timeout=0.2, idle_seconds=60
        )

    async def open(self) -> Client:
        await asyncio.sleep(self.open_delay)
        if self.fail:
            raise ConnectionError("refused")
        client = Client()
        self.opened.append(client)
        return client

    async def close(self, client: Client) -> None:
        if self.hang_on_close:
            await asyncio.sleep(10)
        client.closed = True


async def borrow(h: Harness, key: str = "k", hold: float = 0.0, user: str | None = None) -> Client:
    async with h.pool.use(key, h.open, user=user) as client:
        await asyncio.sleep(hold)
        return client


async def test_concurrent_users_share_one_opening() -> None:
    h = Harness(open_delay=0.05)
    clients = await asyncio.gather(*(borrow(h) for _ in range(20)))
    assert len(h.opened) == 1
    assert {c.id for c in clients} == {h.opened[0].id}
    assert len(h.pool) == 1


async def test_a_failed_opening_is_shared_then_retried() -> None:
    h = Harness(open_delay=0.02, fail=True)
    results = await asyncio.gather(*(borrow(h) for _ in range(5)), return_exceptions=True)
    assert all(isinstance(r, ConnectionError) for r in results)
    h.fail = False
    assert (await borrow(h)).id == h.opened[0].id


async def test_a_waiter_giving_up_does_not_abort_the_opening() -> None:
    h = Harness(open_delay=0.1)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.02):
            await borrow(h)
    await asyncio.sleep(0.15)
    assert len(h.opened) == 1  # it finished for the next caller
    assert (await borrow(h)).id == h.opened[0].id


async def test_retired_client_closes_after_its_last_user() -> None:
    h = Harness()
    first = await borrow(h)
    holder = asyncio.create_task(borrow(h, hold=0.1))
    await asyncio.sleep(0.01)
    h.pool.retire("k", first)
    h.pool.retire("k", first)  # a second attempt seeing the same failure: no-op
    second = await borrow(h)
    assert second.id != first.id  # new attempts get a fresh client at once
    assert not first.closed  # still in use by the holder
    await holder
    await asyncio.sleep(0.01)
    assert first.closed


async def test_idle_clients_are_closed_not_reused() -> None:
    h = Harness()
    first = await borrow(h)
    for slot in h.pool._slots.values():
        slot.last_used -= 61  # as if unused for longer than idle_seconds
    second = await borrow(h)
    await asyncio.sleep(0.01)
    assert second.id != first.id
    assert first.closed


async def test_close_is_bounded_and_the_pool_reopens() -> None:
    h = Harness()
    await borrow(h)
    h.hang_on_close = True
    async with asyncio.timeout(2):
        await h.pool.close()  # the hanging close is abandoned after 0.2 s
    assert len(h.pool) == 0
    h.hang_on_close = False
    await borrow(h)
    assert len(h.opened) == 2
    await h.pool.close()
    await h.pool.close()
    assert h.opened[1].closed


async def test_a_client_goes_once_no_destination_uses_it() -> None:
    h = Harness()
    shared = await borrow(h, "old", user="a")
    assert await borrow(h, "old", user="b") is shared
    assert (await borrow(h, "new", user="a")) is not shared  # a's key changed
    await asyncio.sleep(0.01)
    assert [c.closed for c in h.opened] == [False, False]  # b still uses the old one
    h.pool.release("b")
    await asyncio.sleep(0.01)
    assert [c.closed for c in h.opened] == [True, False]
    assert len(h.pool) == 1


async def test_a_client_released_mid_attempt_closes_after_it() -> None:
    h = Harness()
    holder = asyncio.create_task(borrow(h, user="a", hold=0.1))
    await asyncio.sleep(0.01)
    h.pool.release("a")  # the destination was deleted while its attempt ran
    client = h.opened[0]
    assert len(h.pool) == 0
    assert not client.closed
    await holder
    await asyncio.sleep(0.01)
    assert client.closed


async def test_close_during_an_opening_is_a_shutdown_not_a_cancellation() -> None:
    h = Harness(open_delay=0.2)
    waiter = asyncio.create_task(borrow(h))
    await asyncio.sleep(0.01)
    await h.pool.close()
    with pytest.raises(ShuttingDown):
        await waiter
