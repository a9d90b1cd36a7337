"""The named queries of ``store/sql/queries.sql`` (shared) and ``store/sql/<dialect>/queries.sql``
(written differently, or one dialect's only), and the code that runs them."""

from __future__ import annotations

import ast
import re
from dataclasses import fields
from pathlib import Path

import pytest

import herald.store
from herald.model import Attempt, Event
from herald.store import rows
from herald.store.base import load_migrations
from herald.store.postgres import PostgresDialect
from herald.store.queries import (
    dialect_blocks,
    load_queries,
    merge_blocks,
    parse_queries,
    shared_blocks,
    sqlite_placeholders,
)
from herald.store.sqlite import SQLiteDialect

STORE = Path(herald.store.__file__).parent
DIALECTS = ("sqlite", "postgres")
RUNNERS = {
    "read",
    "execute",
    "fetch",
    "fetchrow",
    "fetchval",
    "executemany",
    "insert_many",
    "_read_for",
}
NAME = re.compile(r"[a-z][a-z0-9_]*")
GUARDED = {"outbox_any": "idle_read", "event_exists": "shared"}
"""Dialect-only queries the shared code runs only when the dialect's flag is set."""


def used_names(module: Path) -> set[str]:
    """Query names a module passes to the dialect's runners or looks up in ``_q`` (raw
    statements sent to the driver itself, such as ``BEGIN IMMEDIATE``, are not names)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in RUNNERS:
                names.update(
                    a.value
                    for a in node.args[:2]
                    if isinstance(a, ast.Constant)
                    and isinstance(a.value, str)
                    and NAME.fullmatch(a.value)
                )
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "_q"
            and isinstance(node.slice, ast.Constant)
        ):
            names.add(str(node.slice.value))
    return names


def arity(sql: str) -> int:
    """Arguments a query takes: its highest numbered placeholder (SQLite's {ids} list
    is one argument, the last)."""
    numbers = [int(n) for n in re.findall(r"[?$](\d+)", sql)]
    return max(numbers, default=0) + ("{ids}" in sql)


def test_a_query_one_dialect_alone_defines_is_run_by_that_dialect_alone() -> None:
    """The shared code runs only names both dialects define (or a guarded one): a name in
    one dialect's file only is that dialect's own statement, never a forgotten twin."""
    shared_code = set().union(
        *(used_names(p) for p in STORE.glob("*.py") if p.stem not in DIALECTS)
    )
    for dialect, other in (DIALECTS, DIALECTS[::-1]):
        own = {n for n in set(dialect_blocks(dialect)) - set(dialect_blocks(other)) if n[0] != "_"}
        assert own, dialect
        assert own & shared_code <= set(GUARDED), dialect


def test_a_statement_both_dialects_write_alike_is_written_once() -> None:
    """A name in both dialects' files is one they really write differently: were the texts
    the same but for their placeholders, it would belong in the shared file."""
    sqlite, postgres = dialect_blocks("sqlite"), dialect_blocks("postgres")
    for name in sorted(set(sqlite) & set(postgres)):
        try:
            as_sqlite = sqlite_placeholders(postgres[name])
        except ValueError:  # a list that is not the last argument: SQLite's differs
            continue
        assert as_sqlite != sqlite[name], name
    assert not set(shared_blocks()) & (set(sqlite) | set(postgres))


@pytest.mark.parametrize("dialect", DIALECTS)
def test_every_query_the_code_runs_exists_and_every_query_is_run(dialect: str) -> None:
    # The shared parts of the store and this dialect's module; never the other dialect's.
    other = {"sqlite": "postgres", "postgres": "sqlite"}[dialect]
    used = set().union(*(used_names(p) for p in STORE.glob("*.py") if p.stem != other))
    defined = set(load_queries(dialect))
    missing = used - defined
    assert missing <= set(GUARDED)
    cls = {"sqlite": SQLiteDialect, "postgres": PostgresDialect}[dialect]
    assert [name for name in missing if getattr(cls, GUARDED[name])] == []
    assert defined - used == set()


def test_shared_queries_take_the_same_arguments_on_both() -> None:
    sqlite, postgres = load_queries("sqlite"), load_queries("postgres")
    # relay_delete: a seq range on SQLite, the claimed seqs on PostgreSQL (outbox_delete_args).
    for name in sorted((set(sqlite) & set(postgres)) - {"relay_delete"}):
        assert arity(sqlite[name]) == arity(postgres[name]), name


def test_queries_sql_is_not_a_migration() -> None:
    assert (STORE / "sql" / "queries.sql").is_file()
    for dialect in DIALECTS:
        assert (STORE / "sql" / dialect / "queries.sql").is_file()
        assert all(name[:4].isdigit() for _, name, _ in load_migrations(dialect))


def test_blocks_parse_into_one_line_statements_without_comments() -> None:
    text = (
        "-- preamble, not a query\n\n"
        "-- first --\n-- what it does\nSELECT 1\n  FROM t -- why\n  WHERE a = ?1;\n\n"
        "-- second --\nDELETE FROM t\n"
    )
    assert parse_queries(text) == {
        "first": "SELECT 1 FROM t WHERE a = ?1",
        "second": "DELETE FROM t",
    }


def test_a_fragment_is_written_into_the_queries_that_name_it_and_is_no_query() -> None:
    text = (
        "-- _cols --\n-- shared select list\na,\n  b\n\n"
        "-- one --\nSELECT {_cols} FROM t\n\n-- two --\nSELECT {_cols} FROM u WHERE {where}\n"
    )
    assert parse_queries(text) == {
        "one": "SELECT a, b FROM t",
        "two": "SELECT a, b FROM u WHERE {where}",
    }


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("-- a --\nSELECT 1\n-- a --\nSELECT 2\n", "twice"),
        ("-- a --\n-- nothing\n", "empty"),
        ("-- _f --\nx\n-- a --\nSELECT 1\n", "used by no query"),
    ],
)
def test_a_broken_file_is_refused(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_queries(text)


def test_sqlite_reads_a_shared_dollar_parameter_as_its_numbered_one() -> None:
    sql = "SELECT '$1', \"$2\", json_extract(x, '$.a'), 'it''s $3' FROM t WHERE a = $1 AND b = $12"
    assert sqlite_placeholders(sql) == (
        "SELECT '$1', \"$2\", json_extract(x, '$.a'), 'it''s $3' FROM t WHERE a = ?1 AND b = ?12"
    )


def test_sqlite_reads_a_shared_list_argument_as_its_in_list() -> None:
    sql = "SELECT a FROM t WHERE b >= $1 AND c = ANY($2::text[]) OR d = ANY($2)"
    assert sqlite_placeholders(sql) == (
        "SELECT a FROM t WHERE b >= ?1 AND c IN ({ids}) OR d IN ({ids})"
    )
    # SQLite binds the list's values after the other arguments: it must be the last.
    with pytest.raises(ValueError, match="list argument must be the last"):
        sqlite_placeholders("SELECT a FROM t WHERE c = ANY($1) AND b = $2")


def test_a_fragment_is_filled_in_across_the_shared_and_the_dialect_files() -> None:
    shared = {"q": "SELECT {_cols} FROM t WHERE a = $1", "_where": "b = $2"}
    own = {"_cols": "a, CAST(b AS BLOB)", "r": "SELECT 1 FROM u WHERE {_where}"}
    assert merge_blocks(shared, own, "sqlite") == {
        "q": "SELECT a, CAST(b AS BLOB) FROM t WHERE a = ?1",
        "r": "SELECT 1 FROM u WHERE b = ?2",
    }
    assert merge_blocks(shared, own, "postgres")["r"] == "SELECT 1 FROM u WHERE b = $2"


def test_a_name_in_the_shared_and_a_dialect_file_is_refused() -> None:
    with pytest.raises(ValueError, match="ping defined in the shared"):
        merge_blocks({"ping": "SELECT 1"}, {"ping": "SELECT 2"}, "postgres")


@pytest.mark.parametrize("dialect", DIALECTS)
def test_the_queries_read_and_write_the_columns_the_row_mappers_expect(dialect: str) -> None:
    queries = load_queries(dialect)
    expected = {
        rows.DELIVERY_COLUMNS: ("get_delivery", "list_deliveries"),
        rows.ATTEMPT_COLUMNS: ("attempts_of", "insert_attempts"),
        rows.DESTINATION_COLUMNS: (
            "all_destinations",
            "get_destination",
            "list_destinations",
            "create_destination",
        ),
        rows.EVENT_COLUMNS: ("events_by_id", "get_event"),
        rows.INSTANCE_COLUMNS: ("list_instances",),
        rows.NEW_DELIVERY_COLUMNS: ("insert_deliveries",),
        rows.REPLAY_COLUMNS: ("get_replay", "list_replays"),
    }
    for columns, names in expected.items():
        for name in names:
            assert columns in queries[name], name
    for name in ("all_destinations", "get_destination", "list_destinations"):
        read = f"{rows.DESTINATION_COLUMNS}, {rows.DESTINATION_STATE_COLUMNS}"
        assert read in queries[name], name


@pytest.mark.parametrize(
    ("columns", "record"), [(rows.ATTEMPT_COLUMNS, Attempt), (rows.EVENT_COLUMNS, Event)]
)
def test_the_columns_read_positionally_are_the_records_fields_in_order(
    columns: str, record: type
) -> None:
    """``attempt_from_row`` and ``event_from_row`` build their record from the row's
    values in column order."""
    assert columns.split(", ") == [f.name for f in fields(record)]
