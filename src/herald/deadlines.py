"""Attempt deadlines that share their timers: one timer per 10 ms of deadlines.

``asyncio.timeout`` arms a timer of the event loop per use; under uvloop that is a
libuv timer handle made and closed again, about 5 µs of the 20 µs an attempt costs
around its adapter's call (thousands a second per attempt process). A
:class:`Deadline` behaves as ``asyncio.timeout`` does (the task is cancelled at the
deadline and ``TimeoutError`` comes out of the block; a cancel from elsewhere stays
a cancel), but the deadlines of one loop are grouped by the 10 ms tick in which they
fall, and one timer a tick serves them all. A deadline may so end up to
:data:`TICK_SECONDS` late, never early.
"""

from __future__ import annotations

import asyncio
import math
import weakref
from types import TracebackType

TICK_SECONDS = 0.01
"""How finely deadlines are told apart: the most one may end late."""


class _Wheel:
    """The pending deadlines of one event loop, by the tick in which each falls."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._ticks: dict[int, set[Deadline]] = {}

    def add(self, deadline: Deadline, when: float) -> int:
        """Expire ``deadline`` at the end of ``when``'s tick; returns the tick."""
        tick = math.ceil(when / TICK_SECONDS)
        group = self._ticks.get(tick)
        if group is None:
            group = self._ticks[tick] = set()
            self._loop.call_at(tick * TICK_SECONDS, self._fire, tick)
        group.add(deadline)
        return tick

    def discard(self, deadline: Deadline, tick: int) -> None:
        group = self._ticks.get(tick)
        if group is not None:
            group.discard(deadline)

    def _fire(self, tick: int) -> None:
        for deadline in self._ticks.pop(tick, ()):
            deadline._expire()


_wheels: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Wheel] = weakref.WeakKeyDictionary()


def _wheel(loop: asyncio.AbstractEventLoop) -> _Wheel:
    wheel = _wheels.get(loop)
    if wheel is None:
        wheel = _wheels[loop] = _Wheel(loop)
    return wheel


class Deadline:
    """``async with Deadline.after(seconds)``: the block is cancelled once its time is
    up and raises ``TimeoutError``; :meth:`reschedule` moves the time while inside."""

    __slots__ = ("_cancelling", "_expired", "_soon", "_task", "_tick", "_wheel", "_when")

    def __init__(self, when: float | None) -> None:
        self._when = when
        """In the loop's time (``loop.time()``); None: no deadline."""
        self._tick: int | None = None
        self._soon: asyncio.Handle | None = None
        """The expiry of a deadline already past when set, due on the loop's next turn."""
        self._task: asyncio.Task[object] | None = None
        self._cancelling = 0
        self._expired = False
        self._wheel: _Wheel | None = None

    @classmethod
    def after(cls, seconds: float | None) -> Deadline:
        """A deadline ``seconds`` from now (None: none)."""
        if seconds is None:
            return cls(None)
        return cls(asyncio.get_running_loop().time() + seconds)

    def when(self) -> float | None:
        return self._when

    def expired(self) -> bool:
        return self._expired

    def reschedule(self, when: float | None) -> None:
        """Move the deadline (None: none) while inside the block."""
        if self._task is None or self._wheel is None:
            raise RuntimeError("a deadline is rescheduled inside its block only")
        if self._expired:
            raise RuntimeError("the deadline has expired already")
        self._when = when
        self._arm()

    def _arm(self) -> None:
        wheel = self._wheel
        assert wheel is not None
        self._disarm()
        when = self._when
        if when is None:
            return
        loop = wheel._loop
        if when <= loop.time():
            self._soon = loop.call_soon(self._expire)
        else:
            self._tick = wheel.add(self, when)

    def _disarm(self) -> None:
        if self._tick is not None and self._wheel is not None:
            self._wheel.discard(self, self._tick)
        self._tick = None
        if self._soon is not None:
            self._soon.cancel()
            self._soon = None

    def _expire(self) -> None:
        self._tick = self._soon = None
        if self._task is None or self._expired:
            return
        self._expired = True
        self._task.cancel()

    async def __aenter__(self) -> Deadline:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a deadline is used inside a task only")
        if self._task is not None:
            raise RuntimeError("a deadline is entered once")
        self._task = task
        self._cancelling = task.cancelling()
        self._wheel = _wheel(asyncio.get_running_loop())
        self._arm()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._disarm()
        task = self._task
        self._task = None
        # Our cancel, unless another came since we entered: that one stays a cancel.
        if (
            self._expired
            and task is not None
            and task.uncancel() <= self._cancelling
            and exc_type is asyncio.CancelledError
        ):
            raise TimeoutError from exc
