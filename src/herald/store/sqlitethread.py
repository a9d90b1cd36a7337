"""SQLite's writer connection: one sqlite3 connection used by one thread of its own,
a statement at a time or a whole transaction in one call.

A statement through a driver thread costs two thread switches, and the second waits
for the event loop, busy with everything else the daemon does. A write transaction
of the engine (a relay batch, a claim, a recording) has eight to a dozen statements
and holds SQLite's one write lock across all of those waits. :meth:`transaction`
runs the transaction's body in the thread instead, from ``BEGIN`` to ``COMMIT``: the
body is an ``async def`` written against the same statement methods (``execute``,
``execute_fetchall``, ``executemany``), which in the thread finish without
suspending, so the coroutine is run to its end in one go (:func:`run_now`).
"""

from __future__ import annotations

import asyncio
import functools
import sqlite3
from collections.abc import Callable, Coroutine, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


class InThread:
    """The writer connection as a transaction body run in its thread sees it: each
    statement runs at once (the coroutine never suspends)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        return _execute(self._conn, sql, params)

    async def execute_fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return _fetchall(self._conn, sql, params)

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        _executemany(self._conn, sql, rows)


class ThreadConnection:
    """The writer connection as the event loop sees it: every call runs in its thread,
    one after the other in the order made."""

    def __init__(self, conn: sqlite3.Connection, pool: ThreadPoolExecutor) -> None:
        self._conn = conn
        self._pool = pool

    @classmethod
    async def connect(cls, path: Path, *, pragmas: Sequence[str] = ()) -> ThreadConnection:
        """Open ``path`` in a new thread of its own and apply ``pragmas`` there."""
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="herald-sqlite-writer")

        def open_() -> sqlite3.Connection:
            conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            try:
                for pragma in pragmas:
                    conn.execute(pragma).close()
            except BaseException:
                conn.close()
                raise
            return conn

        try:
            conn = await asyncio.get_running_loop().run_in_executor(pool, open_)
        except BaseException:
            pool.shutdown(wait=False)
            raise
        return cls(conn, pool)

    @property
    def in_transaction(self) -> bool:
        """Whether a transaction is open (as of the thread's last statement)."""
        return self._conn.in_transaction

    async def call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn(connection)`` in the connection's thread. A cancelled caller stops
        waiting, but ``fn`` runs to its end before any later call begins."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, self._conn)

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement; the rows it changed."""
        return await self.call(functools.partial(_execute, sql=sql, params=params))

    async def execute_fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return await self.call(functools.partial(_fetchall, sql=sql, params=params))

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        await self.call(functools.partial(_executemany, sql=sql, rows=rows))

    async def begin(self) -> None:
        """``BEGIN IMMEDIATE``, after rolling back a transaction nobody owns (one a
        cancelled caller left open)."""
        await self.call(_begin)

    async def transaction(self, body: Callable[[InThread], Coroutine[Any, Any, T]]) -> T:
        """Run ``body`` in one ``BEGIN IMMEDIATE`` … ``COMMIT`` in the thread, in one
        call; rolled back if it raises. ``body`` must await nothing but the
        statements of the :class:`InThread` it is given."""
        return await self.call(functools.partial(_transaction, body))

    async def close(self) -> None:
        try:
            await self.call(lambda c: c.close())
        finally:
            self._pool.shutdown(wait=False)


def run_now(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends to its end, here and now; RuntimeError if
    it tries to suspend (it is closed, so its ``finally`` blocks run)."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError("a transaction body run in SQLite's writer thread tried to suspend")


def _execute(conn: sqlite3.Connection, sql: str, params: Sequence[Any]) -> int:
    # Closed at once: a statement with rows left (a PRAGMA's answer) keeps a lock.
    cursor = conn.execute(sql, params)
    try:
        return cursor.rowcount
    finally:
        cursor.close()


def _executemany(conn: sqlite3.Connection, sql: str, rows: Iterable[Sequence[Any]]) -> None:
    conn.executemany(sql, rows).close()


def _fetchall(conn: sqlite3.Connection, sql: str, params: Sequence[Any]) -> list[Any]:
    # Stepped, fetched and finalised in one go: a statement left open would keep its
    # read snapshot for the connection's next statements.
    cursor = conn.execute(sql, params)
    try:
        return cursor.fetchall()
    finally:
        cursor.close()


def _begin(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        conn.execute("ROLLBACK")
    conn.execute("BEGIN IMMEDIATE")


def _transaction(body: Callable[[InThread], Coroutine[Any, Any, T]], conn: sqlite3.Connection) -> T:
    _begin(conn)
    try:
        result = run_now(body(InThread(conn)))
    except BaseException:
        with suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        raise
    try:
        conn.execute("COMMIT")
    except sqlite3.Error:
        # SQLite may already have rolled back (SQLITE_FULL does): keep its error.
        with suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        raise
    return result
