"""Named SQL queries: ``store/sql/queries.sql`` for the statements both dialects run as
written, ``store/sql/<dialect>/queries.sql`` for those a dialect writes its own way.

The blocks follow procrastinate's ``queries.sql``: a line ``-- name --`` opens a
query, optional ``-- …`` comment lines describe it, and the SQL runs to the next
block. A block whose name starts with ``_`` is a fragment, not a query: the queries
that say ``{_name}`` get its text, so a select list two queries share is written once.
A fragment may be defined in the shared file or a dialect's and used by the queries of
either. The shared file numbers its parameters ``$1, $2 …`` as PostgreSQL does; SQLite
reads each ``$n`` outside quotes as ``?n``, without the casts PostgreSQL may need to type
it (``$2::text IS NULL`` is ``?2 IS NULL``). A list argument is written as PostgreSQL
takes it, ``col = ANY($n)`` with ``$n`` the last parameter; SQLite, which has no array
parameter, reads it as ``col IN ({ids})``, the list's values bound from ``?n`` on
(``herald.store.sqlite``). A name is defined in the shared file or in a
dialect's, never both; a name only one dialect's file defines is a query only that dialect
runs. Files are parsed once per process; callers look queries up by name.
"""

from __future__ import annotations

import functools
import re
from importlib import resources

_HEADER = re.compile(r"^-- (_?[a-z][a-z0-9_]*) --[ \t]*$", re.MULTILINE)
_PLACEHOLDER = re.compile(
    r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|\$(\d+)(?:::[A-Za-z][A-Za-z0-9_]*(?:\[\])?)*"
)
"""A quoted string or identifier (left as it is), or a ``$n`` parameter and the casts that
type it for PostgreSQL (``$2::text``)."""
_LIST = re.compile(r"= ANY\(\$(\d+)(?:::[A-Za-z][A-Za-z0-9_]*(?:\[\])?)*\)")
"""A list argument of the shared file: ``= ANY($n)``, ``= ANY($n::text[])``."""


def parse_blocks(text: str) -> dict[str, str]:
    """``{name: SQL}`` of ``text``'s blocks, fragments included and not yet filled in;
    each statement's lines are joined by a space, with comment lines dropped (what the
    drivers send, and logs show, is one line)."""
    parts = _HEADER.split(text)
    blocks: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        # A trailing "-- why" comment would swallow the lines joined after it.
        lines = [line.partition(" --")[0].strip() for line in body.splitlines()]
        sql = " ".join(line for line in lines if line and not line.startswith("--"))
        sql = sql.removesuffix(";").rstrip()
        if not sql:
            raise ValueError(f"query {name!r} is empty")
        if name in blocks:
            raise ValueError(f"query {name!r} is defined twice")
        blocks[name] = sql
    return blocks


def fill_fragments(blocks: dict[str, str]) -> dict[str, str]:
    """The queries of ``blocks``, each ``{_name}`` replaced by the fragment's text."""
    queries = {name: sql for name, sql in blocks.items() if not name.startswith("_")}
    for name, text in blocks.items():
        if not name.startswith("_"):
            continue
        slot = "{" + name + "}"
        users = [q for q, sql in queries.items() if slot in sql]
        if not users:
            raise ValueError(f"fragment {name!r} is used by no query")
        for q in users:
            queries[q] = queries[q].replace(slot, text)
    return queries


def parse_queries(text: str) -> dict[str, str]:
    """``{name: SQL}`` of one file's blocks, fragments filled in."""
    return fill_fragments(parse_blocks(text))


def sqlite_placeholders(sql: str) -> str:
    """``sql`` with each ``$n`` parameter outside quotes written ``?n``, as SQLite
    numbers them, and the casts that type it for PostgreSQL (``$2::text``) dropped: SQLite
    needs none. A ``$`` inside a string, such as a JSON path, is left alone. A list
    argument, ``= ANY($n)``, becomes ``IN ({ids})``; it must be the last parameter."""
    lists = {int(n) for n in _LIST.findall(sql)}
    if lists:
        last = max(int(m[1]) for m in _PLACEHOLDER.finditer(sql) if m[1] is not None)
        if lists != {last}:
            raise ValueError(f"a list argument must be the last parameter (${last}): {sql}")
        sql = _LIST.sub("IN ({ids})", sql)
    return _PLACEHOLDER.sub(lambda m: m[0] if m[1] is None else f"?{m[1]}", sql)


def merge_blocks(shared: dict[str, str], own: dict[str, str], dialect: str) -> dict[str, str]:
    """The queries of ``dialect``: the shared blocks in its placeholders, then its own;
    a name in both is refused."""
    both = sorted(shared.keys() & own.keys())
    if both:
        raise ValueError(
            f"{dialect}: {', '.join(both)} defined in the shared queries.sql and the "
            "dialect's own: a query is written once or differently on each dialect"
        )
    if dialect == "sqlite":
        shared = {name: sqlite_placeholders(sql) for name, sql in shared.items()}
    return fill_fragments({**shared, **own})


def _read(*parts: str) -> str:
    path = resources.files("herald.store").joinpath("sql", *parts)
    return path.read_text(encoding="utf-8")


@functools.cache
def dialect_blocks(dialect: str) -> dict[str, str]:
    """The blocks of ``dialect``'s own file (``sqlite`` or ``postgres``), unfilled."""
    return parse_blocks(_read(dialect, "queries.sql"))


@functools.cache
def shared_blocks() -> dict[str, str]:
    """The blocks of the shared file, ``$n`` placeholders, unfilled."""
    return parse_blocks(_read("queries.sql"))


@functools.cache
def load_queries(dialect: str) -> dict[str, str]:
    """The named queries of ``dialect`` (``sqlite`` or ``postgres``), parsed once."""
    return merge_blocks(shared_blocks(), dialect_blocks(dialect), dialect)
