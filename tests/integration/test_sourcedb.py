"""The outbox-source drivers against the real databases (SQLite, MariaDB, PostgreSQL):
open, read, delete and count through ``SourceDB``; a table made before ordering keys;
errors as ``SourceError``, and a source that opens again after them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from herald.config import SourceSettings
from herald.outbox import publish
from herald.sourcedb import SourceError, open_source
from tests.support.sources import DIALECTS, Producer, producer_database


@pytest.fixture(params=DIALECTS)
async def producer(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Producer]:
    async with producer_database(request.param, tmp_path) as p:
        yield p


def settings(p: Producer) -> SourceSettings:
    return SourceSettings.model_validate({"name": "shop", "url": p.url})


def write(p: Producer, count: int, *, key: str | None = None) -> list[str]:
    with p.transaction() as conn:
        return [publish(conn, "order.placed", {"n": i}, ordering_key=key) for i in range(count)]


async def test_read_delete_and_count_in_seq_order(producer: Producer) -> None:
    ids = write(producer, 5, key="cart-1")
    db = open_source(settings(producer))
    await db.open()
    try:
        count, oldest = await db.stats()
        assert count == 5
        assert oldest is not None
        rows = await db.read(3)
        assert [r.id.decode() for r in rows if r.id] == ids[:3]
        assert {r.ordering_key for r in rows} == {b"cart-1"}
        seqs = [r.seq for r in rows]
        # A batch still being relayed is left out of the next read.
        rest = await db.read(10, exclude=[(seqs[0], seqs[-1])])
        assert [r.id.decode() for r in rest if r.id] == ids[3:]
        await db.delete(seqs)
        assert (await db.stats())[0] == 2
        assert producer.count() == 2
    finally:
        await db.shutdown()


async def test_a_table_made_before_ordering_keys_reads_none(producer: Producer) -> None:
    """A source table without ``ordering_key`` (made before Herald had it) is read
    with NULL in its place: found once, at open, and never asked for again."""
    producer.run("DROP TABLE herald_outbox")
    seq = {
        "sqlite": "seq INTEGER PRIMARY KEY AUTOINCREMENT",
        "mysql": "seq BIGINT PRIMARY KEY AUTO_INCREMENT",
        "postgresql": "seq bigserial PRIMARY KEY",
    }[producer.dialect]
    producer.run(
        f"CREATE TABLE herald_outbox ({seq}, id VARCHAR(255) NOT NULL,"
        " tenant_id VARCHAR(255) NOT NULL, type VARCHAR(255) NOT NULL, data TEXT NOT NULL,"
        " created_at VARCHAR(64) NOT NULL, traceparent VARCHAR(64))"
    )
    producer.run(
        "INSERT INTO herald_outbox (id, tenant_id, type, data, created_at)"
        " VALUES ('evt_old1', 'default', 'order.placed', '{}', '2026-11-29T00:00:00Z')"
    )
    db = open_source(settings(producer))
    await db.open()
    try:
        [row] = await db.read(10)
        assert (row.id, row.ordering_key) == (b"evt_old1", None)
        assert "ordering_key" not in db.select_sql
    finally:
        await db.shutdown()


async def test_a_misnamed_column_fails_at_open(producer: Producer) -> None:
    """Never a value made up: SQLite reads a double-quoted name that is no column as a
    string, which would have been every row's ``type``."""
    write(producer, 1)
    s = SourceSettings.model_validate(
        {"name": "shop", "url": producer.url, "columns": {"type": "kind"}}
    )
    db = open_source(s)
    with pytest.raises(SourceError, match="kind"):
        await db.open()
    await db.shutdown()


async def test_an_error_is_a_source_error_and_the_source_opens_again(
    producer: Producer,
) -> None:
    write(producer, 1)
    db = open_source(settings(producer))
    await db.open()
    try:
        producer.run("ALTER TABLE herald_outbox RENAME TO herald_outbox_away")
        with pytest.raises(SourceError):
            await db.read(10)
        # The error closed the connections: a read now says so until opened again.
        with pytest.raises(SourceError, match="not connected"):
            await db.read(10)
        with pytest.raises(SourceError):
            await db.open()  # the table is still away
        producer.run("ALTER TABLE herald_outbox_away RENAME TO herald_outbox")
        await db.open()
        assert len(await db.read(10)) == 1
    finally:
        await db.shutdown()
