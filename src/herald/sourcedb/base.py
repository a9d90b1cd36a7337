"""What every source dialect shares: the statements (built once from the table and
its column names) and the conversion of driver values into raw outbox rows."""

from __future__ import annotations

import datetime as dt
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Generic, TypeVar

import orjson

from herald.config import SOURCE_COLUMNS, SourceSettings
from herald.model import OutboxRow
from herald.timeutil import format_epoch, now, parse_timestamp

# The columns read are the source columns, in OutboxRow's order (``about`` is Herald's
# own, never a source's).
READ_COLUMNS = SOURCE_COLUMNS


class SourceError(Exception):
    """A source's database cannot be read or written (down, refused, no such table or
    column, bad password): ``message`` says which, in one line, password masked."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


C = TypeVar("C")


def connected(conn: C | None) -> C:
    """A dialect's connection, or SourceError when there is none (never opened, or
    closed by an error: the reader opens the source again)."""
    if conn is None:
        raise SourceError("not connected")
    return conn


def raw(value: Any) -> bytes | None:
    """A driver's value as the bytes an outbox row holds (``ingest.parse_row`` checks
    them): text as UTF-8, an instant as RFC 3339 UTC (a naive one taken as UTC)."""
    kind = type(value)
    if kind is str:  # the usual value first: this runs for every column of every row
        return value.encode("utf-8", "surrogateescape")  # type: ignore[no-any-return]
    if value is None or kind is bytes:
        return value  # type: ignore[no-any-return]
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    if isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if isinstance(value, dt.datetime):
        instant: dt.datetime = value
        if instant.tzinfo is not None:
            instant = instant.astimezone(dt.UTC).replace(tzinfo=None)
        return (instant.isoformat(timespec="microseconds") + "Z").encode()
    if isinstance(value, dict | list):
        return orjson.dumps(value)
    return str(value).encode()


class SourceDB(ABC, Generic[C]):
    """One source's database: connect, read a batch, delete what was relayed.

    Two connections of the driver's (``C``): one reads, the other deletes the batch
    relayed before while the next is read. The statements and the connections' life
    are here; a driver says how to connect, run a statement and turn its errors into
    :class:`SourceError`."""

    dialect: str
    quote = '"'

    def __init__(self, settings: SourceSettings) -> None:
        self.settings = settings
        self.name = settings.name
        q = self.quote
        table = ".".join(f"{q}{part}{q}" for part in settings.table.split("."))
        cols = []
        for name in READ_COLUMNS:
            column = settings.column(name)
            cols.append(f"{q}{column}{q}" if column else "NULL")
        self._created_missing = not settings.column("created_at")
        seq = f"{q}{settings.column('seq')}{q}"
        self._seq = seq
        self._select_head = f"SELECT {', '.join(cols)} FROM {table}"
        # A table made before ordering existed has no ordering_key: read NULL for it
        # (found at open) unless the settings name the column.
        self._keyless_head = (
            f"SELECT {', '.join(cols[:-1])}, NULL FROM {table}"
            if "ordering_key" not in settings.columns and cols[-1] != "NULL"
            else None
        )
        self._selects: dict[int, str] = {}
        self.select_sql = self._select(0)
        self.delete_sql = f"DELETE FROM {table} WHERE {seq} IN ({{seqs}})"
        self.range_delete_sql = (
            f"DELETE FROM {table} WHERE {seq} BETWEEN {self.param(1)} AND {self.param(2)}"
        )
        created = settings.column("created_at")
        oldest = f"MIN({q}{created}{q})" if created else "NULL"
        self.stats_sql = f"SELECT COUNT(*), {oldest} FROM {table}"
        self._conn: C | None = None
        self._deleter: C | None = None

    def keyless(self, exc: BaseException) -> bool:
        """After the first read at open failed with ``exc``: whether it was for the
        ``ordering_key`` column the table lacks (then reads leave it out from now on)."""
        keyless = self._keyless_head
        if keyless is None or self._select_head == keyless or "ordering_key" not in str(exc):
            return False
        self._select_head = keyless
        self._selects.clear()
        self.select_sql = self._select(0)
        return True

    @staticmethod
    def param(n: int) -> str:
        """The dialect's ``n``-th placeholder."""
        return "?"

    def _select(self, spans: int) -> str:
        """The read, leaving out ``spans`` ranges of ``seq`` (2 arguments each, then
        the limit)."""
        sql = self._selects.get(spans)
        if sql is None:
            seq, p = self._seq, self.param
            where = " AND ".join(
                f"({seq} < {p(2 * i + 1)} OR {seq} > {p(2 * i + 2)})" for i in range(spans)
            )
            sql = (
                f"{self._select_head}{' WHERE ' + where if where else ''}"
                f" ORDER BY {seq} LIMIT {p(2 * spans + 1)}"
            )
            self._selects[spans] = sql
        return sql

    def select_statement(
        self, limit: int, exclude: Sequence[tuple[int, int]] = ()
    ) -> tuple[str, list[int]]:
        """The statement that reads up to ``limit`` rows in ``seq`` order, none of the
        ``exclude`` ranges (inclusive: batches still being relayed or deleted), and its
        arguments. A range is left out only while its batch is in flight: a row in it
        that was not in the batch (committed late) is read once the batch is gone, so
        nothing is skipped for good, and no high-water mark is kept."""
        args = [bound for span in exclude for bound in span]
        return self._select(len(exclude)), [*args, limit]

    def rows(self, records: Sequence[Sequence[Any]]) -> list[OutboxRow]:
        """Driver records of ``select_sql`` as raw outbox rows."""
        stamp = format_epoch(now()).encode() if self._created_missing else None
        return [
            OutboxRow(
                seq=int(r[0]),
                id=raw(r[1]),
                tenant_id=raw(r[2]),
                type=raw(r[3]),
                data=raw(r[4]),
                created_at=raw(r[5]) if stamp is None else stamp,
                traceparent=raw(r[6]),
                ordering_key=raw(r[7]),
            )
            for r in records
        ]

    def delete_statement(self, seqs: Sequence[int]) -> tuple[str, list[int]]:
        """The statement that deletes exactly the rows ``seqs`` and its arguments. Seqs
        without a gap (the usual batch) are one range: no other row can be in it, and
        a range costs the server one index scan instead of a probe per row."""
        ordered = sorted(seqs)
        if ordered and ordered[-1] - ordered[0] + 1 == len(ordered) > 1:
            return self.range_delete_sql, [ordered[0], ordered[-1]]
        marks = ", ".join(self.param(i) for i in range(1, len(ordered) + 1))
        return self.delete_sql.replace("{seqs}", marks), ordered

    @staticmethod
    def oldest_epoch(value: Any) -> float | None:
        """``stats_sql``'s oldest ``created_at`` as an epoch, if it can be read as one."""
        if value is None:
            return None
        if isinstance(value, dt.datetime):
            if value.tzinfo is None:
                value = value.replace(tzinfo=dt.UTC)
            return float(value.timestamp())
        try:
            return parse_timestamp(str(value)).epoch
        except ValueError:
            return None

    # --- what a driver provides ---------------------------------------------------
    @abstractmethod
    def _errors(self) -> AbstractAsyncContextManager[None]:
        """Around each use: the driver's errors become :class:`SourceError` (one line,
        password masked), the connections closed first (the reader opens again)."""

    @abstractmethod
    async def _connect(self) -> C:
        """A new connection, in autocommit: each read sees every commit before it."""

    @abstractmethod
    async def _disconnect(self, conn: C) -> None:
        """Close ``conn``, whatever state it is in; never raises."""

    @abstractmethod
    async def _fetch(self, conn: C, sql: str, args: Sequence[Any]) -> Sequence[Sequence[Any]]:
        """The rows of one statement."""

    @abstractmethod
    async def _execute(self, conn: C, sql: str, args: Sequence[Any]) -> None:
        """One statement whose rows do not matter."""

    async def _opened(self, conn: C) -> None:
        """The reading connection is open and the table checked (PostgreSQL listens)."""

    # --- the source -------------------------------------------------------------
    async def open(self) -> None:
        """Connect and check that the table and its columns are there."""
        async with self._errors():
            self._conn = conn = await self._connect()
            try:
                await self._fetch(conn, self.select_sql, (0,))
            except Exception as exc:
                if not self.keyless(exc):
                    raise
                await self._fetch(conn, self.select_sql, (0,))
            await self._opened(conn)
            self._deleter = await self._connect()

    async def close(self) -> None:
        """Drop the connections (``open`` makes new ones)."""
        conns = (self._conn, self._deleter)
        self._conn = self._deleter = None
        for conn in conns:
            if conn is not None:
                await self._disconnect(conn)

    async def shutdown(self) -> None:
        """Close for good: the connections and any watch."""
        await self.close()

    async def read(self, limit: int, exclude: Sequence[tuple[int, int]] = ()) -> list[OutboxRow]:
        """Up to ``limit`` rows in ``seq`` order: every committed row still there but
        those in the ``exclude`` ranges of ``seq`` (see :meth:`select_statement`)."""
        async with self._errors():
            sql, args = self.select_statement(limit, exclude)
            return self.rows(await self._fetch(connected(self._conn), sql, args))

    async def delete(self, seqs: Sequence[int]) -> None:
        """Remove the rows relayed (committed in Herald's database), on a connection of
        its own: it runs while the next batch is read."""
        async with self._errors():
            sql, args = self.delete_statement(seqs)
            await self._execute(connected(self._deleter), sql, args)

    async def stats(self) -> tuple[int, float | None]:
        """Rows waiting and the ``created_at`` epoch of the oldest."""
        async with self._errors():
            [(count, oldest)] = await self._fetch(connected(self._conn), self.stats_sql, ())
        return int(count), self.oldest_epoch(oldest)

    async def watch(self, callback: Callable[[], None]) -> bool:
        """Call ``callback`` when rows may have been committed; False when the
        dialect cannot tell (the reader polls)."""
        return False
