"""Each statement of the shared ``store/sql/queries.sql`` runs on both databases.

Every shared query is executed, with a NULL for each of its arguments, on Herald's
schema: SQLite in memory, PostgreSQL in a fresh migrated database; each inside a
savepoint rolled back afterwards, so nothing is written. A query refused by a NOT NULL
or another constraint has run up to its writes, which is all this asks: its text parses,
every table, column and function it names exists, and it takes exactly the arguments
the other dialect's does (SQLite refuses a wrong count of bindings; PostgreSQL's
prepared statement counts its parameters).
"""

from __future__ import annotations

import contextlib
import re
import sqlite3

import asyncpg
import pytest

from herald.store.queries import load_queries, shared_blocks
from herald.store.sqlite import migrations as sqlite_migrations
from tests.support.pg_template import MigratedDatabases

PARTS = {"{where}": "1 = 1", "{limit}": "10"}
"""The parts some queries take per call (``parts=`` of the dialect's runners)."""


def arity(sql: str) -> int:
    """The highest ``$n`` of a shared statement: the arguments both dialects take."""
    return max((int(n) for n in re.findall(r"[?$](\d+)", sql)), default=0)


def runnable(sql: str) -> str:
    for slot, text in PARTS.items():
        sql = sql.replace(slot, text)
    return sql


def test_there_are_shared_queries_and_a_list_argument_is_written_once() -> None:
    shared = [n for n in shared_blocks() if not n.startswith("_")]
    assert len(shared) > 50
    # A list is PostgreSQL's array parameter in the shared file; SQLite's {ids} is made
    # from it (herald.store.queries), never written there.
    assert not [n for n in shared if "{ids}" in shared_blocks()[n]]
    listed = [n for n in shared if "{ids}" in load_queries("sqlite")[n]]
    assert listed
    assert all("= ANY($" in load_queries("postgres")[n] for n in listed)


def test_every_shared_query_runs_on_sqlite() -> None:
    queries = load_queries("sqlite")
    postgres = load_queries("postgres")
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        conn.execute(queries["migrations_table"])  # as the store makes it before migrating
        for _, _, script in sqlite_migrations():
            conn.executescript(script)
        ran, failed = 0, []
        for name in sorted(n for n in shared_blocks() if not n.startswith("_")):
            args = [None] * arity(runnable(postgres[name]))
            # A list argument (the last): one value, bound where the list's start.
            sql = runnable(queries[name]).replace("{ids}", f"?{len(args)}")
            conn.execute("SAVEPOINT q")
            try:
                conn.execute(sql, args).fetchall()
                ran += 1
            except sqlite3.IntegrityError:
                ran += 1
            except sqlite3.Error as exc:
                failed.append(f"{name}: {exc}")
            finally:
                conn.execute("ROLLBACK TO q")
                conn.execute("RELEASE q")
        assert failed == []
        assert ran == len([n for n in shared_blocks() if not n.startswith("_")])
    finally:
        conn.close()


@pytest.mark.postgres
async def test_every_shared_query_runs_on_postgres(pg_databases: MigratedDatabases) -> None:
    queries = load_queries("postgres")
    url = await pg_databases.take()
    failed = []
    try:
        conn = await asyncpg.connect(url)
        try:
            for name in sorted(n for n in shared_blocks() if not n.startswith("_")):
                sql = runnable(queries[name])
                try:
                    await _run_and_undo(conn, sql)
                except asyncpg.PostgresError as exc:
                    failed.append(f"{name}: {type(exc).__name__}: {exc}")
                except AssertionError as exc:
                    failed.append(f"{name}: {exc}")
        finally:
            await conn.close()
    finally:
        pg_databases.give_back(url)
    assert failed == []


async def _run_and_undo(conn: asyncpg.Connection, sql: str) -> None:
    """Prepare ``sql``, check its parameter count and run it with NULLs, in a
    transaction rolled back afterwards."""
    transaction = conn.transaction()
    await transaction.start()
    try:
        statement = await conn.prepare(sql)
        params = len(statement.get_parameters())
        assert params == arity(sql), f"{params} parameters, not {arity(sql)}"
        with contextlib.suppress(asyncpg.IntegrityConstraintViolationError):
            await statement.fetch(*[None] * params)
    finally:
        await transaction.rollback()
