"""Plain SQL against Herald's database, the way a producer or an operator has it.

One small class over both backends, so a test written once runs on SQLite
(``sqlite3``) and on PostgreSQL (``psycopg``, autocommit). Tests write
SQLite-style ``?`` placeholders; for PostgreSQL they become ``%s``, and a value
bound to the outbox's ``data`` column is cast to ``jsonb``.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import psycopg

Backend = Literal["sqlite", "postgres"]
Params = Sequence[Any]

_OUTBOX_INSERT = re.compile(
    r"INSERT\s+INTO\s+herald_outbox\s*\((?P<columns>[^)]*)\)\s*VALUES\s*\((?P<values>.*)\)\s*$",
    re.IGNORECASE | re.DOTALL,
)


def backend_of(url: str) -> Backend:
    """Which engine a ``database.url`` names."""
    return "sqlite" if url.startswith("sqlite:") else "postgres"


def _split_top_level(text: str) -> list[str]:
    """Split on the commas that are not inside parentheses or quotes."""
    parts: list[str] = []
    depth, quote, start = 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return parts


def postgres_sql(sql: str) -> str:
    """``?`` placeholders as ``%s`` (literal ``%`` escaped); outbox ``data`` cast to jsonb."""
    sql = sql.replace("%", "%%").replace("?", "%s")
    m = _OUTBOX_INSERT.match(sql.strip())
    if m is None:
        return sql
    columns = [c.strip().lower() for c in m["columns"].split(",")]
    values = _split_top_level(m["values"])
    if len(columns) != len(values):
        return sql
    values = [
        f"{v}::jsonb" if c == "data" and v == "%s" else v
        for c, v in zip(columns, values, strict=True)
    ]
    return f"{sql.strip()[: m.start('values')]}{', '.join(values)})"


class Db:
    """The same few calls on SQLite and PostgreSQL; autocommit unless in :meth:`transaction`."""

    def __init__(self, url: str, *, timeout: float = 30.0) -> None:
        self.url = url
        self.backend: Backend = backend_of(url)
        self._sqlite: sqlite3.Connection | None = None
        self._pg: psycopg.Connection[Any] | None = None
        if self.backend == "sqlite":
            path = url.removeprefix("sqlite:///")
            conn = sqlite3.connect(path, timeout=timeout, isolation_level=None)
            conn.execute(f"PRAGMA busy_timeout={int(timeout * 1000)}")
            self._sqlite = conn
        else:
            import psycopg

            self._pg = psycopg.connect(url, autocommit=True, connect_timeout=int(timeout))

    @property
    def sqlite(self) -> sqlite3.Connection:
        """The underlying sqlite3 connection (SQLite only), e.g. for ``herald.outbox.publish``."""
        if self._sqlite is None:
            raise TypeError("not a SQLite database")
        return self._sqlite

    def execute(self, sql: str, params: Params = ()) -> list[tuple[Any, ...]]:
        """Run one statement; its result rows (none for a statement without a result)."""
        if self._sqlite is not None:
            return list(self._sqlite.execute(sql, tuple(params)).fetchall())
        assert self._pg is not None
        with self._pg.cursor() as cur:
            cur.execute(postgres_sql(sql), tuple(params))
            return list(cur.fetchall()) if cur.description else []

    def executemany(self, sql: str, rows: Sequence[Params]) -> None:
        if self._sqlite is not None:
            self._sqlite.executemany(sql, [tuple(r) for r in rows])
            return
        assert self._pg is not None
        with self._pg.cursor() as cur:
            cur.executemany(postgres_sql(sql), [tuple(r) for r in rows])

    def scalar(self, sql: str, params: Params = ()) -> Any:
        """The first column of the first row, or None."""
        rows = self.execute(sql, params)
        return rows[0][0] if rows else None

    @contextmanager
    def transaction(self) -> Iterator[Db]:
        """BEGIN … COMMIT, or ROLLBACK when the block raises."""
        self.execute("BEGIN")
        try:
            yield self
        except BaseException:
            self.execute("ROLLBACK")
            raise
        self.execute("COMMIT")

    def commit(self) -> None:
        """Nothing to do in autocommit mode; kept for DB-API-shaped callers."""

    def close(self) -> None:
        if self._sqlite is not None:
            self._sqlite.close()
            self._sqlite = None
        if self._pg is not None:
            self._pg.close()
            self._pg = None

    def __enter__(self) -> Db:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
