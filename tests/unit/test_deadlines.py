"""Attempt deadlines (herald.deadlines): asyncio.timeout's behaviour, one timer a tick."""

from __future__ import annotations

import asyncio

import pytest

from herald import deadlines
from herald.deadlines import TICK_SECONDS, Deadline


async def sleep_within(
    deadline: Deadline, ended: list[float] | None = None, *, move_to: float | None = None
) -> None:
    """Sleep long inside ``deadline`` (moved to ``move_to`` once inside, if given);
    ``ended`` gets the loop's time when the sleep ended."""
    loop = asyncio.get_running_loop()
    async with deadline:
        if move_to is not None:
            deadline.reschedule(move_to)
        try:
            await asyncio.sleep(5)
        finally:
            if ended is not None:
                ended.append(loop.time())


async def test_the_block_is_cancelled_at_its_deadline_never_before() -> None:
    deadline = Deadline.after(0.05)
    ended: list[float] = []
    with pytest.raises(TimeoutError):
        await sleep_within(deadline, ended)
    when = deadline.when()
    assert when is not None
    assert ended[0] >= when
    assert deadline.expired()


async def test_a_block_that_ends_in_time_is_not_touched() -> None:
    async with Deadline.after(5) as deadline:
        await asyncio.sleep(0)
    assert not deadline.expired()
    await asyncio.sleep(0)  # no cancel left pending on the task
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_no_deadline_never_cancels() -> None:
    async with Deadline.after(None) as deadline:
        await asyncio.sleep(0.02)
    assert deadline.when() is None
    assert not deadline.expired()


async def test_a_deadline_already_past_cancels_at_the_first_await() -> None:
    with pytest.raises(TimeoutError):
        async with Deadline.after(-1):
            await asyncio.sleep(5)


async def test_a_cancel_from_elsewhere_stays_a_cancel() -> None:
    entered = asyncio.Event()

    async def attempt() -> None:
        async with Deadline.after(5):
            entered.set()
            await asyncio.sleep(10)

    task = asyncio.create_task(attempt())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_rescheduled_deadline_moves_and_a_sooner_one_wins() -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    later = Deadline.after(0.02)
    with pytest.raises(TimeoutError):
        await sleep_within(later, move_to=start + 0.1)  # the pacing's wait moves it on
    assert loop.time() - start >= 0.1
    assert later.when() == start + 0.1
    sooner = Deadline.after(5)
    with pytest.raises(TimeoutError):
        await sleep_within(sooner, move_to=loop.time() + 0.01)
    assert sooner.expired()


async def test_reschedule_outside_the_block_or_after_expiry_is_refused() -> None:
    deadline = Deadline.after(1)
    with pytest.raises(RuntimeError, match="inside its block"):
        deadline.reschedule(2.0)
    with pytest.raises(TimeoutError):
        async with Deadline.after(0.01) as expired:
            await asyncio.sleep(5)
    with pytest.raises(RuntimeError):
        expired.reschedule(1.0)


async def test_an_inner_deadline_times_out_alone_inside_an_outer_one() -> None:
    async with Deadline.after(5) as outer:
        with pytest.raises(TimeoutError):
            async with Deadline.after(0.01):
                await asyncio.sleep(5)
        await asyncio.sleep(0)
    assert not outer.expired()


async def test_many_deadlines_share_a_timer_per_tick() -> None:
    """A thousand attempts begun within one tick arm one timer, not a thousand."""
    loop = asyncio.get_running_loop()
    armed = []
    real = loop.call_at

    def counting(when: float, callback: object, *args: object) -> asyncio.TimerHandle:
        armed.append(when)
        return real(when, callback, *args)  # type: ignore[arg-type]

    when = loop.time() + 5
    loop.call_at = counting  # type: ignore[method-assign,assignment]
    try:
        for _ in range(1000):
            async with Deadline(when):
                pass
    finally:
        del loop.call_at
    assert len(armed) == 1
    assert armed[0] >= when
    assert armed[0] - when <= TICK_SECONDS
    # What ended is forgotten: the tick fires later over an empty group.
    wheel = deadlines._wheels[loop]
    assert all(not group for group in wheel._ticks.values())
