"""A SQLite source: a producer's database file, through aiosqlite.

Woken as Herald's own SQLite outbox is (``store/fswatch.py``): an inotify watch on
the file's directory says when the database or its ``-wal`` was written; without
inotify the reader polls. A second connection deletes the batch relayed before while
the next is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import aiosqlite

from herald.sourcedb.base import SourceDB, SourceError
from herald.store.fswatch import FileWatch

BUSY_TIMEOUT_MS = 5000


class SQLiteSource(SourceDB[aiosqlite.Connection]):
    dialect = "sqlite"
    # Not SQLite's double quotes: a double-quoted name that is no column is read as a
    # string literal, so a misnamed column (or the ordering_key an older table lacks)
    # would read its own name on every row instead of failing at open.
    quote = "`"

    def __init__(self, settings: Any) -> None:
        super().__init__(settings)
        self.path = Path(settings.url.removeprefix("sqlite:///"))
        self._watch: asyncio.Task[None] | None = None

    @contextlib.asynccontextmanager
    async def _errors(self) -> AsyncIterator[None]:
        try:
            yield
        except (sqlite3.Error, OSError) as exc:
            await self.close()
            raise SourceError(str(exc) or type(exc).__name__) from exc

    async def open(self) -> None:
        if not self.path.exists():
            # Connecting would create an empty database where the producer's should be.
            raise SourceError(f"no database file at {self.path}")
        await super().open()

    async def _connect(self) -> aiosqlite.Connection:
        conn = await aiosqlite.connect(self.path, isolation_level=None)
        await conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        return conn

    async def _disconnect(self, conn: aiosqlite.Connection) -> None:
        with contextlib.suppress(Exception):
            await conn.close()

    async def _fetch(
        self, conn: aiosqlite.Connection, sql: str, args: Sequence[Any]
    ) -> Sequence[Sequence[Any]]:
        return list(await conn.execute_fetchall(sql, tuple(args)))

    async def _execute(self, conn: aiosqlite.Connection, sql: str, args: Sequence[Any]) -> None:
        await conn.execute(sql, tuple(args))

    async def shutdown(self) -> None:
        await self.close()
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch

    async def watch(self, callback: Callable[[], None]) -> bool:
        name = self.path.name
        watch = FileWatch.open(self.path.parent, (name, f"{name}-wal", f"{name}-journal"))
        if watch is None:
            return False
        self._watch = asyncio.create_task(
            _wake_on_writes(watch, callback), name="herald-source-watch"
        )
        return True


async def _wake_on_writes(watch: FileWatch, callback: Callable[[], None]) -> None:
    try:
        while await watch.written():
            callback()
    finally:
        watch.close()
