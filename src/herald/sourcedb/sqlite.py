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

from herald.model import OutboxRow
from herald.sourcedb.base import SourceDB, SourceError, connected
from herald.store.fswatch import FileWatch

BUSY_TIMEOUT_MS = 5000


class SQLiteSource(SourceDB):
    dialect = "sqlite"

    def __init__(self, settings: Any) -> None:
        super().__init__(settings)
        self.path = Path(settings.url.removeprefix("sqlite:///"))
        self._conn: aiosqlite.Connection | None = None
        self._deleter: aiosqlite.Connection | None = None
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
        async with self._errors():
            self._conn = await _connect(self.path)
            try:
                await self._conn.execute_fetchall(self.select_sql, (0,))
            except Exception as exc:
                if not self.keyless(exc):
                    raise
                await self._conn.execute_fetchall(self.select_sql, (0,))
            self._deleter = await _connect(self.path)

    async def close(self) -> None:
        conns = (self._conn, self._deleter)
        self._conn = self._deleter = None
        for conn in conns:
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.close()

    async def shutdown(self) -> None:
        await self.close()
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch

    async def read(self, limit: int, exclude: Sequence[tuple[int, int]] = ()) -> list[OutboxRow]:
        async with self._errors():
            sql, args = self.select_statement(limit, exclude)
            return self.rows(list(await connected(self._conn).execute_fetchall(sql, tuple(args))))

    async def delete(self, seqs: Sequence[int]) -> None:
        async with self._errors():
            sql, args = self.delete_statement(seqs)
            await connected(self._deleter).execute(sql, tuple(args))

    async def stats(self) -> tuple[int, float | None]:
        async with self._errors():
            [(count, oldest)] = list(await connected(self._conn).execute_fetchall(self.stats_sql))
        return int(count), self.oldest_epoch(oldest)

    async def watch(self, callback: Callable[[], None]) -> bool:
        name = self.path.name
        watch = FileWatch.open(self.path.parent, (name, f"{name}-wal", f"{name}-journal"))
        if watch is None:
            return False
        self._watch = asyncio.create_task(
            _wake_on_writes(watch, callback), name="herald-source-watch"
        )
        return True


async def _connect(path: Path) -> aiosqlite.Connection:
    conn = await aiosqlite.connect(path, isolation_level=None)
    await conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    return conn


async def _wake_on_writes(watch: FileWatch, callback: Callable[[], None]) -> None:
    try:
        while await watch.written():
            callback()
    finally:
        watch.close()
