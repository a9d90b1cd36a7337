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
from herald.sourcedb.base import SourceDB, SourceError

CONNECT_TIMEOUT_SECONDS = 10


class MySQLSource(SourceDB[asyncmy.Connection]):
    dialect = "mysql"
    quote = "`"

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

    async def _disconnect(self, conn: asyncmy.Connection) -> None:
        conn.close()

    async def _fetch(
        self, conn: asyncmy.Connection, sql: str, args: Sequence[Any]
    ) -> Sequence[Sequence[Any]]:
        async with conn.cursor() as cur:
            await cur.execute(sql, tuple(args))
            return list(await cur.fetchall())

    async def _execute(self, conn: asyncmy.Connection, sql: str, args: Sequence[Any]) -> None:
        async with conn.cursor() as cur:
            await cur.execute(sql, tuple(args))


def _describe(exc: BaseException) -> str:
    if isinstance(exc, MySQLError) and len(exc.args) >= 2:
        return mask_secrets(f"MySQL error {exc.args[0]}: {exc.args[1]}")
    if isinstance(exc, TimeoutError):
        return "timed out"
    return mask_secrets(str(exc) or type(exc).__name__)
