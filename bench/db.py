"""The database a benchmark runs Herald on: a SQLite file, or a fresh PostgreSQL database.

PostgreSQL comes from ``$HERALD_BENCH_POSTGRES``, else the DSN that
``scripts/test-services.sh`` wrote to ``.test-services/postgres.dsn``, else the
machine's server at 127.0.0.1:5432; every run creates its own database from it
(``herald_bench_<hex>``) and drops it afterwards, whatever happened.

Queries are written with ``?`` placeholders and translated for psycopg.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from bench.common import REPO_ROOT, BenchError

DSN_FILE = REPO_ROOT / ".test-services" / "postgres.dsn"
DEFAULT_ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/test"
CONNECT_TIMEOUT = 10
APPLICATION_NAME = "herald-bench"
"""The bench's own PostgreSQL connections, told apart from Herald's in pg_stat_activity."""

OutboxRowT = tuple[str, str, str, str, str]
"""(id, tenant_id, type, data JSON text, created_at ISO text)."""


def admin_dsn() -> str:
    env = os.environ.get("HERALD_BENCH_POSTGRES")
    if env:
        return env
    if DSN_FILE.exists():
        return DSN_FILE.read_text().strip()
    return DEFAULT_ADMIN_DSN


class Database:
    """One benchmark database; ``kind`` is ``sqlite`` or ``postgres``."""

    def __init__(self, kind: str, url: str, path: Path | None = None) -> None:
        self.kind = kind
        self.url = url
        self.path = path

    @classmethod
    def sqlite(cls, path: Path) -> Database:
        return cls("sqlite", f"sqlite:///{path}", path)

    @property
    def name(self) -> str:
        """The PostgreSQL database's name (the URL's last path segment)."""
        return self.url.rpartition("/")[2].partition("?")[0]

    # --- connections ---------------------------------------------------------
    def _sql(self, sql: str) -> str:
        return sql.replace("?", "%s") if self.kind == "postgres" else sql

    @contextlib.contextmanager
    def connect(self, *, readonly: bool = False) -> Iterator[Any]:
        """An autocommit connection (sqlite3 or psycopg), closed afterwards."""
        if self.kind == "sqlite":
            assert self.path is not None
            target = f"file:{self.path}?mode=ro" if readonly else f"file:{self.path}"
            conn = sqlite3.connect(target, uri=True, isolation_level=None, timeout=30)
            try:
                yield conn
            finally:
                conn.close()
            return
        import psycopg

        pg = psycopg.connect(
            self.url,
            autocommit=True,
            connect_timeout=CONNECT_TIMEOUT,
            application_name=APPLICATION_NAME,
        )
        try:
            yield pg
        finally:
            pg.close()

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self.connect(readonly=True) as conn:
            return [tuple(r) for r in conn.execute(self._sql(sql), tuple(params)).fetchall()]

    def scalar(self, sql: str, params: Sequence[Any] = ()) -> Any:
        rows = self.query(sql, params)
        return rows[0][0] if rows else None

    def count(self, sql: str, params: Sequence[Any] = ()) -> int:
        return int(self.scalar(sql, params) or 0)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        with self.connect() as conn:
            conn.execute(self._sql(sql), tuple(params))

    # --- the producer's side ------------------------------------------------------
    def insert_outbox(self, rows: Iterable[OutboxRowT]) -> float:
        """Insert outbox rows in one transaction; returns the seconds it took."""
        t0 = time.perf_counter()
        sql = self._sql(
            "INSERT INTO herald_outbox (id, tenant_id, type, data, created_at)"
            " VALUES (?, ?, ?, ?, ?)"
        )
        with self.connect() as conn:
            if self.kind == "sqlite":
                conn.execute("PRAGMA busy_timeout=10000")
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany(sql, rows)
                conn.execute("COMMIT")
            else:
                with conn.transaction(), conn.cursor() as cur:
                    cur.executemany(sql, list(rows))
        return time.perf_counter() - t0


@contextlib.contextmanager
def postgres_database(prefix: str = "herald_bench") -> Iterator[Database]:
    """A fresh, empty PostgreSQL database, dropped (WITH FORCE) at the end."""
    import psycopg

    admin = admin_dsn()
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    try:
        with psycopg.connect(admin, autocommit=True, connect_timeout=CONNECT_TIMEOUT) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.Error as exc:
        raise BenchError(
            f"PostgreSQL at {admin} is not usable ({exc}); start it (`make services`)"
            " or set HERALD_BENCH_POSTGRES"
        ) from exc
    base = admin.rpartition("/")[0]
    try:
        yield Database("postgres", f"{base}/{name}")
    finally:
        with psycopg.connect(admin, autocommit=True, connect_timeout=CONNECT_TIMEOUT) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def database(kind: str, workdir: Path) -> Iterator[Database]:
    """``sqlite`` (a file in ``workdir``) or ``postgres`` (a fresh database)."""
    if kind == "sqlite":
        yield Database.sqlite(workdir / "herald.db")
    elif kind == "postgres":
        with postgres_database() as db:
            yield db
    else:
        raise BenchError(f"unknown database kind {kind!r}")
