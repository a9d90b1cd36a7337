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
from herald.sourcedb.base import SourceDB, SourceError, connected

CHANNEL = "herald_outbox"
CONNECT_TIMEOUT_SECONDS = 10


class PostgresSource(SourceDB[asyncpg.Connection]):
    dialect = "postgresql"

    def __init__(self, settings: Any) -> None:
        super().__init__(settings)
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

    async def _connect(self) -> asyncpg.Connection:
        return await asyncpg.connect(
            self.settings.url, timeout=CONNECT_TIMEOUT_SECONDS, statement_cache_size=0
        )

    async def _disconnect(self, conn: asyncpg.Connection) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(conn.close(), 5)
        if not conn.is_closed():
            conn.terminate()

    async def _fetch(
        self, conn: asyncpg.Connection, sql: str, args: Sequence[Any]
    ) -> Sequence[Sequence[Any]]:
        return await conn.fetch(sql, *args)  # type: ignore[no-any-return]

    async def _execute(self, conn: asyncpg.Connection, sql: str, args: Sequence[Any]) -> None:
        await conn.execute(sql, *args)

    async def _opened(self, conn: asyncpg.Connection) -> None:
        if self._callback is not None:
            await self._listen(self._callback)

    async def _listen(self, callback: Callable[[], None]) -> None:
        await connected(self._conn).add_listener(CHANNEL, lambda *_: callback())

    async def watch(self, callback: Callable[[], None]) -> bool:
        self._callback = callback
        async with self._errors():
            await self._listen(callback)
        return True
