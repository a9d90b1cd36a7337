"""Outbox sources' pure parts: the settings and their errors, the driver check, the
statements built from a table's names, values into raw rows, the producer's DDL and
the re-read check."""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import sqlite3
from pathlib import Path

import pytest

from herald.config import SourceSettings, load_settings, masked
from herald.errors import ConfigError
from herald.model import OutboxRow
from herald.outbox import publish
from herald.sourcedb import check_driver, open_source
from herald.sourcedb.base import raw
from herald.sourcedb.schema import outbox_ddl
from herald.store.sources import same_event


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "herald.toml"
    path.write_text(text)
    return path


def source(**kw: object) -> SourceSettings:
    values: dict[str, object] = {"name": "shop", "url": "mysql://app:secret@db:3306/shop"}
    values.update(kw)
    return SourceSettings.model_validate(values)


def test_sources_from_the_file_and_masked(tmp_path: Path) -> None:
    s = load_settings(
        write(
            tmp_path,
            '[[outbox.sources]]\nname = "shop"\nurl = "mysql://app:secret@db:3306/shop"\n'
            'columns = { id = "event_id", tenant_id = "" }\n'
            '[[outbox.sources]]\nname = "local"\nurl = "sqlite:///./producer.db"\n',
        )
    )
    [shop, local] = s.outbox.sources
    assert (shop.dialect, shop.table, shop.column("id"), shop.column("type")) == (
        "mysql",
        "herald_outbox",
        "event_id",
        "type",
    )
    assert local.dialect == "sqlite"
    # A source polls at its own pace, not at the relay's (a look at a file's version).
    assert (shop.poll_interval_seconds, s.relay.poll_interval_seconds) == (0.02, 0.005)
    shown = json.dumps(masked(s))
    assert "secret" not in shown
    assert "mysql://app:********@db:3306/shop" in shown


def test_sources_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "HERALD_OUTBOX__SOURCES",
        '[{"name": "shop", "url": "postgresql://app:pw@db/shop", "table": "app.outbox"}]',
    )
    [shop] = load_settings().outbox.sources
    assert (shop.dialect, shop.table) == ("postgresql", "app.outbox")


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"name": "Shop!"}, "expected 1 to 32 of a-z"),
        ({"name": "herald"}, "built-in outbox"),
        ({"url": "oracle://db/x"}, "unsupported source URL scheme 'oracle'"),
        ({"url": "mysql://db"}, "expected mysql://user:password@host[:port]/database"),
        ({"url": "sqlite://relative.db"}, "three slashes"),
        ({"table": "outbox; DROP TABLE x"}, "is not a plain SQL [schema.]name"),
        ({"columns": {"payload": "data"}}, "'payload' is not an outbox column"),
        ({"columns": {"id": ""}}, "the id column cannot be left out"),
        ({"columns": {"data": "pay load"}}, "is not a plain SQL name"),
        ({"poll_interval_seconds": 0}, "greater than 0"),
    ],
)
def test_a_wrong_source_is_refused_naming_the_key(
    tmp_path: Path, entry: dict[str, object], message: str
) -> None:
    values = {"name": "shop", "url": "mysql://app:secret@db:3306/shop", **entry}
    text = "[[outbox.sources]]\n" + "".join(
        f"{k} = {json.dumps(v) if not isinstance(v, dict) else _inline(v)}\n"
        for k, v in values.items()
    )
    with pytest.raises(ConfigError, match=r"outbox\.sources") as err:
        load_settings(write(tmp_path, text))
    assert message in err.value.message
    assert "secret" not in err.value.message


def _inline(table: dict[str, object]) -> str:
    return "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in table.items()) + " }"


def test_two_sources_of_one_name_are_refused(tmp_path: Path) -> None:
    entry = '[[outbox.sources]]\nname = "shop"\nurl = "sqlite:///a.db"\n'
    with pytest.raises(ConfigError, match="two sources are named 'shop'"):
        load_settings(write(tmp_path, entry * 2))


def test_a_mysql_source_without_its_driver_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "asyncmy" else real(name)
    )
    with pytest.raises(ConfigError) as err:
        check_driver(source())
    assert err.value.message == (
        "outbox source 'shop': a mysql:// source needs the asyncmy driver:"
        " pip install 'herald[mysql]'"
    )
    check_driver(source(url="sqlite:///x.db"))  # nothing to install


def test_statements_follow_the_tables_names() -> None:
    db = open_source(
        source(table="app.outbox", columns={"id": "event_id", "tenant_id": "", "data": "payload"})
    )
    assert db.select_sql == (
        "SELECT `seq`, `event_id`, NULL, `type`, `payload`, `created_at`, `traceparent`,"
        " `ordering_key` FROM `app`.`outbox` ORDER BY `seq` LIMIT %s"
    )
    assert db.delete_statement([9, 3, 4]) == (
        "DELETE FROM `app`.`outbox` WHERE `seq` IN (%s, %s, %s)",
        [3, 4, 9],
    )
    # Without a gap, one range: no other row can be in it.
    assert db.delete_statement([5, 3, 4]) == (
        "DELETE FROM `app`.`outbox` WHERE `seq` BETWEEN %s AND %s",
        [3, 5],
    )
    assert db.delete_statement([7]) == ("DELETE FROM `app`.`outbox` WHERE `seq` IN (%s)", [7])
    # The next batch is read while the last ones are relayed and deleted: their ranges
    # are left out, nothing else (no high-water mark).
    sql, args = db.select_statement(500, [(10, 19), (1, 9)])
    assert sql == (
        "SELECT `seq`, `event_id`, NULL, `type`, `payload`, `created_at`, `traceparent`,"
        " `ordering_key` FROM `app`.`outbox`"
        " WHERE (`seq` < %s OR `seq` > %s) AND (`seq` < %s OR `seq` > %s)"
        " ORDER BY `seq` LIMIT %s"
    )
    assert args == [10, 19, 1, 9, 500]
    assert db.select_statement(500) == (db.select_sql, [500])
    pg = open_source(source(url="postgresql://db/shop", columns={"created_at": ""}))
    assert pg.select_sql.endswith(
        'NULL, "traceparent", "ordering_key" FROM "herald_outbox" ORDER BY "seq" LIMIT $1'
    )
    assert pg.select_statement(100, [(3, 8)])[0].endswith(
        'WHERE ("seq" < $1 OR "seq" > $2) ORDER BY "seq" LIMIT $3'
    )
    [row] = pg.rows([(1, "evt_1", None, "a.b", '{"x": 1}', None, None, None)])
    assert row.created_at is not None  # read time stands in for a missing created_at


def test_driver_values_become_raw_row_bytes() -> None:
    assert raw(None) is None
    assert raw("évt") == "évt".encode()
    assert raw(b"\xff") == b"\xff"
    assert raw(dt.datetime(2026, 1, 2, 3, 4, 5, 6)) == b"2026-01-02T03:04:05.000006Z"
    east = dt.timezone(dt.timedelta(hours=2))
    assert raw(dt.datetime(2026, 1, 2, 5, 4, 5, tzinfo=east)) == b"2026-01-02T03:04:05.000000Z"
    assert raw({"a": 1}) == b'{"a":1}'
    assert raw(17) == b"17"


@pytest.mark.parametrize("dialect", ["postgresql", "mysql", "sqlite"])
def test_the_schema_names_every_column(dialect: str) -> None:
    ddl = outbox_ddl(dialect, "shop_outbox")
    for column in ("seq", "id", "tenant_id", "type", "data", "created_at", "traceparent"):
        assert column in ddl
    assert ("pg_notify" in ddl) == (dialect == "postgresql")
    with pytest.raises(ValueError, match="unknown dialect"):
        outbox_ddl("oracle")


def test_the_sqlite_schema_takes_what_publish_writes() -> None:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.executescript(outbox_ddl("sqlite", "events_out"))
    event_id = publish(conn, "order.placed", {"n": 1}, table="events_out")
    [(seq, got, tenant)] = conn.execute("SELECT seq, id, tenant_id FROM events_out").fetchall()
    assert (seq, got, tenant) == (1, event_id, "default")


def test_a_re_read_row_is_known_only_with_the_same_content() -> None:
    row = OutboxRow(1, b"evt_1", None, b"a.b", b' {"n": 1} ', b"2026-01-02T03:04:05Z")
    stored = {("default", "evt_1"): ("a.b", '{"n": 1}')}
    assert same_event(row, stored)
    assert not same_event(row, {("default", "evt_1"): ("a.b", '{"n": 2}')})
    assert not same_event(row, {("t2", "evt_1"): ("a.b", '{"n": 1}')})
    assert not same_event(row, {("default", "evt_1"): ("a.c", '{"n": 1}')})
    assert not same_event(OutboxRow(2, None, None, None, None, None), stored)
