"""A MySQL 8.0+ or MariaDB 10.6+ source, through asyncmy (the ``mysql`` extra).

Polled: MySQL has no notification a client can wait on. The connections run in
autocommit mode, so that each read sees every commit made before it (a transaction
kept open would read the same snapshot for ever under REPEATABLE READ). Two of them:
one reads, the other deletes the batch relayed before while the next is read.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

import asyncmy
from asyncmy.errors import MySQLError

from herald.config import mask_secrets
from herald.model import OutboxRow
from herald.sourcedb.base import SourceDB, SourceError, connected

CONNECT_TIMEOUT_SECONDS = 10


class MySQLSource(SourceDB):
    dialect = "mysql"
    quote = "`"

    def __init__(self, settings: Any) -> None:
        super().__init__(settings)
        self._conn: asyncmy.Connection | None = None
        self._deleter: asyncmy.Connection | None = None

    @staticmethod
    def param(n: int) -> str:
        return "%s"

    @contextlib.asynccontextmanager
    async def _errors(self) -> AsyncIterator[None]:
        try:
            yield
        except (MySQLError, OSError, TimeoutError) as exc:
            await self.close()
            raise SourceError(_describe(exc)) from exc

    async def _connect(self) -> asyncmy.Connection:
        parts = urlsplit(self.settings.url)
        return await asyncio.wait_for(
            asyncmy.connect(
                host=parts.hostname or "localhost",
                port=parts.port or 3306,
                user=unquote(parts.username or "root"),
                password=unquote(parts.password or ""),
                database=unquote(parts.path.lstrip("/")),
                autocommit=True,
                charset="utf8mb4",
                connect_timeout=CONNECT_TIMEOUT_SECONDS,
            ),
            CONNECT_TIMEOUT_SECONDS,
        )

    async def open(self) -> None:
        async with self._errors():
            self._conn = await self._connect()
            try:
                await _query(self._conn, self.select_sql, (0,))
            except Exception as exc:
                if not self.keyless(exc):
                    raise
                await _query(self._conn, self.select_sql, (0,))
            self._deleter = await self._connect()

    async def close(self) -> None:
        for conn in (self._conn, self._deleter):
            if conn is not None:
                conn.close()
        self._conn = self._deleter = None

    async def read(self, limit: int, exclude: Sequence[tuple[int, int]] = ()) -> list[OutboxRow]:
        async with self._errors():
            return self.rows(await _query(self._conn, *self.select_statement(limit, exclude)))

    async def delete(self, seqs: Sequence[int]) -> None:
        async with self._errors():
            await _query(self._deleter, *self.delete_statement(seqs))

    async def stats(self) -> tuple[int, float | None]:
        async with self._errors():
            [(count, oldest)] = await _query(self._conn, self.stats_sql, ())
        return int(count), self.oldest_epoch(oldest)


async def _query(
    conn: asyncmy.Connection | None, sql: str, args: Sequence[Any]
) -> list[Sequence[Any]]:
    async with connected(conn).cursor() as cur:
        await cur.execute(sql, tuple(args))
        return list(await cur.fetchall())


def _describe(exc: BaseException) -> str:
    if isinstance(exc, MySQLError) and len(exc.args) >= 2:
        return mask_secrets(f"MySQL error {exc.args[0]}: {exc.args[1]}")
    if isinstance(exc, TimeoutError):
        return "timed out"
    return mask_secrets(str(exc) or type(exc).__name__)
