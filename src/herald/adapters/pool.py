"""Long-lived SDK clients shared by an adapter's attempts, one per key.

Cloud SDK clients are expensive to open (a TCP + TLS handshake, an auth
exchange, a link attach) and cheap to reuse, so an adapter keeps one per
(credentials fingerprint, target) and every attempt borrows it. Every SDK
family (AWS, Pub/Sub, Service Bus, RabbitMQ) uses this one pool, which makes
that safe under concurrency:

- a client is opened once per key even when many attempts ask at once (they
  share the one opening; if it fails, they all see the failure and the next
  attempt opens afresh);
- a client that misbehaved is *retired*: new attempts get a fresh one at once,
  and the old one is closed as soon as its last in-flight attempt is done;
- when attempts name the destination they serve (``user``), a client is
  retired once no destination uses it any more: a destination whose key
  changed (rotated credentials, another endpoint) or that was forgotten does
  not leave its old client open;
- with ``idle_seconds``, clients unused for that long are closed (checked
  whenever the pool is used) rather than reused: credentials rotated away,
  destinations deleted, and peers that drop idle connections;
- every close is bounded by ``close_timeout`` and never raises: a close that
  hangs or fails is logged and abandoned.

Opening is *not* bounded here: the adapter's ``open`` callable bounds its own
SDK calls, because it knows which of them can hang.
"""

from __future__ import annotations

import asyncio
import time
from abc import abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import ClassVar, Generic, TypeVar

import structlog

from herald.adapters.base import Adapter, AdapterContext, ShuttingDown

log = structlog.get_logger("herald.adapters.pool")

K = TypeVar("K", bound=Hashable)
C = TypeVar("C")


@dataclass(eq=False)
class _Slot(Generic[C]):
    client: C
    in_use: int = 0
    last_used: float = field(default_factory=time.monotonic)
    retired: bool = False
    users: set[Hashable] = field(default_factory=set)


class ClientPool(Generic[K, C]):
    """Keyed, shared, lazily opened clients; see the module docstring."""

    def __init__(
        self,
        *,
        name: str,
        close: Callable[[C], Awaitable[None]],
        close_timeout: float = 5.0,
        idle_seconds: float | None = 300.0,
    ) -> None:
        self._name = name
        self._close_client = close
        self._close_timeout = close_timeout
        self._idle_seconds = idle_seconds
        self._slots: dict[K, _Slot[C]] = {}
        self._opening: dict[K, asyncio.Task[_Slot[C]]] = {}
        self._closing: set[asyncio.Task[None]] = set()
        self._used_by: dict[Hashable, K] = {}

    def __len__(self) -> int:
        return len(self._slots)

    @asynccontextmanager
    async def use(
        self, key: K, open: Callable[[], Awaitable[C]], *, user: Hashable | None = None
    ) -> AsyncIterator[C]:
        """Borrow the client for ``key``, opening it with ``open()`` if there is none.

        ``user`` (a destination id) ties the client to that destination until
        :meth:`release` or until the destination borrows for another key.
        """
        self._sweep()
        if user is not None and self._used_by.get(user) != key:
            self.release(user)
            self._used_by[user] = key
        slot = self._slots.get(key)
        if slot is None:
            slot = await self._open(key, open)
        # release() may have run while the client was being opened.
        if user is not None and self._used_by.get(user) == key:
            slot.users.add(user)
        slot.in_use += 1
        try:
            yield slot.client
        finally:
            slot.in_use -= 1
            slot.last_used = time.monotonic()
            if user is not None and not slot.users and not slot.retired:
                self.retire(key, slot.client)  # its destinations moved on meanwhile
            elif slot.retired and slot.in_use == 0:
                self._close_later(slot.client)

    def release(self, user: Hashable) -> None:
        """``user`` no longer uses its client; the client goes once nobody does."""
        key = self._used_by.pop(user, None)
        slot = self._slots.get(key) if key is not None else None
        if slot is not None and key is not None:
            slot.users.discard(user)
            if not slot.users:
                self.retire(key, slot.client)

    def retire(self, key: K, client: C) -> None:
        """Stop handing out ``client``; close it once no attempt uses it any more."""
        slot = self._slots.get(key)
        if slot is None or slot.client is not client:
            return  # already retired (another attempt saw the same failure)
        del self._slots[key]
        slot.retired = True
        if slot.in_use == 0:
            self._close_later(slot.client)

    async def close(self) -> None:
        """Close every client (bounded); the pool stays usable and reopens on demand."""
        for task in list(self._opening.values()):
            task.cancel()
        if self._opening:
            await asyncio.wait(list(self._opening.values()))
        slots, self._slots, self._used_by = list(self._slots.values()), {}, {}
        for slot in slots:
            slot.retired = True
            self._close_later(slot.client)
        if self._closing:
            await asyncio.wait(set(self._closing))

    # --- internals ---------------------------------------------------------------
    async def _open(self, key: K, open: Callable[[], Awaitable[C]]) -> _Slot[C]:
        task = self._opening.get(key)
        if task is None:
            task = asyncio.create_task(self._opened(key, open), name=f"{self._name}-open")
            # A failure nobody awaits any more (all waiters timed out) must not be
            # reported as "never retrieved".
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            self._opening[key] = task
        # Shielded: one waiter giving up (its attempt timed out) must not abort the
        # opening the others are waiting for.
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # this attempt was cancelled (its deadline)
            # The shared opening was cancelled by close(), not this attempt: a
            # failure to report, not a cancellation to pass on.
            raise ShuttingDown("the adapter is shutting down") from None

    async def _opened(self, key: K, open: Callable[[], Awaitable[C]]) -> _Slot[C]:
        try:
            client = await open()
            slot = _Slot(client)
            self._slots[key] = slot
            return slot
        finally:
            self._opening.pop(key, None)

    def _sweep(self) -> None:
        if self._idle_seconds is None:
            return
        now = time.monotonic()
        for key, slot in list(self._slots.items()):
            if slot.in_use == 0 and now - slot.last_used > self._idle_seconds:
                self.retire(key, slot.client)

    def _close_later(self, client: C) -> None:
        task = asyncio.create_task(self._close_one(client), name=f"{self._name}-close")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _close_one(self, client: C) -> None:
        try:
            async with asyncio.timeout(self._close_timeout):
                await self._close_client(client)
        except TimeoutError:
            log.warning("client_close_timed_out", pool=self._name, seconds=self._close_timeout)
        except Exception as exc:  # a failing close must not take anything else down
            log.warning("client_close_failed", pool=self._name, error=type(exc).__name__)


class PooledAdapter(Adapter, Generic[K, C]):
    """A type whose attempts borrow long-lived SDK clients from one :class:`ClientPool`."""

    idle_seconds: ClassVar[float | None] = 300.0
    """A client no attempt used for this long is closed (None: kept while in use)."""
    close_timeout: ClassVar[float] = 5.0

    def __init__(self, ctx: AdapterContext) -> None:
        super().__init__(ctx)
        self.clients: ClientPool[K, C] = ClientPool(
            name=self.type_id,
            close=self.close_client,
            close_timeout=self.close_timeout,
            idle_seconds=self.idle_seconds,
        )

    @abstractmethod
    async def close_client(self, client: C) -> None:
        """Close one client the pool no longer hands out (bounded by the pool)."""

    async def close(self) -> None:
        await self.clients.close()
