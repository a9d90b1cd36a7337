"""A PostgreSQL source, through asyncpg.

Woken by ``NOTIFY``: the trigger ``herald outbox schema --dialect postgresql``
prints notifies ``herald_outbox`` on every insert statement, and this source
listens on its connection. A second connection deletes the batch relayed before
while the next is read.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import asyncpg

from herald.config import mask_secrets
from herald.model import OutboxRow
from herald.sourcedb.base import SourceDB, SourceError, connected

CHANNEL = "herald_outbox"
CONNECT_TIMEOUT_SECONDS = 10


class PostgresSource(SourceDB):
    dialect = "postgresql"

    def __init__(self, settings: Any) -> None:
        super().__init__(settings)
        self._conn: asyncpg.Connection | None = None
        self._deleter: asyncpg.Connection | None = None
        self._callback: Callable[[], None] | None = None

    @staticmethod
    def param(n: int) -> str:
        return f"${n}"

    @contextlib.asynccontextmanager
    async def _errors(self) -> AsyncIterator[None]:
        try:
            yield
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError) as exc:
            await self.close()
            text = "timed out" if isinstance(exc, TimeoutError) else str(exc) or type(exc).__name__
            raise SourceError(mask_secrets(text.splitlines()[0])) from exc

    async def open(self) -> None:
        async with self._errors():
            self._conn = await asyncpg.connect(
                self.settings.url, timeout=CONNECT_TIMEOUT_SECONDS, statement_cache_size=0
            )
            try:
                await self._conn.fetch(self.select_sql, 0)
            except asyncpg.UndefinedColumnError as exc:
                if not self.keyless(exc):
                    raise
                await self._conn.fetch(self.select_sql, 0)
            if self._callback is not None:
                await self._listen(self._callback)
            self._deleter = await asyncpg.connect(
                self.settings.url, timeout=CONNECT_TIMEOUT_SECONDS, statement_cache_size=0
            )

    async def close(self) -> None:
        conns = (self._conn, self._deleter)
        self._conn = self._deleter = None
        for conn in conns:
            if conn is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(conn.close(), 5)
                if not conn.is_closed():
                    conn.terminate()

    async def read(self, limit: int, exclude: Sequence[tuple[int, int]] = ()) -> list[OutboxRow]:
        async with self._errors():
            sql, args = self.select_statement(limit, exclude)
            return self.rows(await connected(self._conn).fetch(sql, *args))

    async def delete(self, seqs: Sequence[int]) -> None:
        async with self._errors():
            sql, args = self.delete_statement(seqs)
            await connected(self._deleter).execute(sql, *args)

    async def stats(self) -> tuple[int, float | None]:
        async with self._errors():
            count, oldest = await connected(self._conn).fetchrow(self.stats_sql)
        return int(count), self.oldest_epoch(oldest)

    async def _listen(self, callback: Callable[[], None]) -> None:
        await connected(self._conn).add_listener(CHANNEL, lambda *_: callback())

    async def watch(self, callback: Callable[[], None]) -> bool:
        self._callback = callback
        async with self._errors():
            await self._listen(callback)
        return True
