"""SQLite's writer connection (herald.store.sqlitethread): a whole transaction body run
in the connection's thread at one go, committed or rolled back as one, in call order."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from herald.store.sqlitethread import InThread, ThreadConnection, run_now


@pytest.fixture
async def writer(tmp_path: Path) -> AsyncIterator[ThreadConnection]:
    conn = await ThreadConnection.connect(
        tmp_path / "w.db", pragmas=("PRAGMA journal_mode=WAL", "PRAGMA busy_timeout=2000")
    )
    await conn.execute("CREATE TABLE t (n INTEGER PRIMARY KEY, thread TEXT)")
    yield conn
    await conn.close()


def rows(path: Path) -> list[int]:
    with sqlite3.connect(path) as other:
        return [n for (n,) in other.execute("SELECT n FROM t ORDER BY n")]


async def test_run_now_runs_a_coroutine_that_never_suspends() -> None:
    async def add(a: int, b: int) -> int:
        return a + b

    assert run_now(add(2, 3)) == 5


async def test_run_now_refuses_a_coroutine_that_suspends_and_closes_it() -> None:
    closed = []

    async def sleeps() -> None:
        try:
            await asyncio.sleep(0)
        finally:
            closed.append(True)

    with pytest.raises(RuntimeError, match="tried to suspend"):
        run_now(sleeps())
    assert closed == [True]


async def test_a_body_commits_in_the_connections_thread_at_one_go(
    writer: ThreadConnection, tmp_path: Path
) -> None:
    loop_thread = threading.current_thread().name

    async def body(c: InThread) -> int:
        for n in range(3):
            await c.execute("INSERT INTO t VALUES (?, ?)", (n, threading.current_thread().name))
        await c.executemany("INSERT INTO t VALUES (?, ?)", [(3, "x"), (4, "y")])
        return len(await c.execute_fetchall("SELECT n FROM t"))

    assert await writer.transaction(body) == 5
    assert rows(tmp_path / "w.db") == [0, 1, 2, 3, 4]
    [(thread,)] = await writer.execute_fetchall("SELECT DISTINCT thread FROM t WHERE n < 3")
    assert thread != loop_thread
    assert thread.startswith("herald-sqlite-writer")
    assert not writer.in_transaction


async def _raises(c: InThread) -> None:
    await c.execute("INSERT INTO t VALUES (1, 'a')")
    raise LookupError("the plan failed")


async def _suspends(c: InThread) -> None:
    await c.execute("INSERT INTO t VALUES (1, 'a')")
    await asyncio.sleep(0)  # not a statement: it would need the event loop


async def _breaks_a_key(c: InThread) -> None:
    await c.execute("INSERT INTO t VALUES (1, 'a')")
    await c.execute("INSERT INTO t VALUES (1, 'b')")  # the same key


@pytest.mark.parametrize(
    ("body", "error", "message"),
    [
        (_raises, LookupError, "the plan failed"),  # and the error comes back
        (_suspends, RuntimeError, "tried to suspend"),  # refused
        (_breaks_a_key, sqlite3.IntegrityError, "UNIQUE constraint failed"),
    ],
)
async def test_a_body_that_fails_leaves_nothing_and_no_open_transaction(
    writer: ThreadConnection,
    tmp_path: Path,
    body: Callable[[InThread], Coroutine[Any, Any, None]],
    error: type[Exception],
    message: str,
) -> None:
    with pytest.raises(error, match=message):
        await writer.transaction(body)
    assert rows(tmp_path / "w.db") == []
    assert not writer.in_transaction


async def test_a_cancelled_callers_body_ends_before_the_next_call_begins(
    writer: ThreadConnection, tmp_path: Path
) -> None:
    """The caller stops waiting; its body still commits, and in call order."""
    started = threading.Event()
    go_on = threading.Event()

    async def slow(c: InThread) -> None:
        started.set()
        go_on.wait(5)  # in the writer's thread: the event loop runs on meanwhile
        await c.execute("INSERT INTO t VALUES (1, 'slow')")

    first = asyncio.create_task(writer.transaction(slow))
    while not started.is_set():
        await asyncio.sleep(0.001)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first

    async def after(c: InThread) -> list[int]:
        await c.execute("INSERT INTO t VALUES (2, 'after')")
        return [n for (n,) in await c.execute_fetchall("SELECT n FROM t ORDER BY n")]

    second = asyncio.create_task(writer.transaction(after))
    go_on.set()
    assert await second == [1, 2]
    assert rows(tmp_path / "w.db") == [1, 2]


async def test_begin_rolls_back_a_transaction_nobody_owns(
    writer: ThreadConnection, tmp_path: Path
) -> None:
    await writer.execute("BEGIN IMMEDIATE")
    await writer.execute("INSERT INTO t VALUES (1, 'orphan')")
    await writer.begin()  # the orphan's insert goes; a new transaction begins
    await writer.execute("INSERT INTO t VALUES (2, 'mine')")
    await writer.execute("COMMIT")
    assert rows(tmp_path / "w.db") == [2]
