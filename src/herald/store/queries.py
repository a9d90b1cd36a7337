"""Named SQL queries, one file per dialect: ``store/sql/<dialect>/queries.sql``.

The blocks follow procrastinate's ``queries.sql``: a line ``-- name --`` opens a
query, optional ``-- …`` comment lines describe it, and the SQL runs to the next
block. A block whose name starts with ``_`` is a fragment, not a query: the queries
that say ``{_name}`` get its text, so a select list two queries share is written once.
Files are parsed once per process; callers look queries up by name.
"""

from __future__ import annotations

import functools
import re
from importlib import resources

_HEADER = re.compile(r"^-- (_?[a-z][a-z0-9_]*) --[ \t]*$", re.MULTILINE)

DIALECT_ONLY: dict[str, frozenset[str]] = {
    # SQLite's single writer claims in two statements, reads before locking when idle,
    # updates then inserts a heartbeat, purges unused events in one pass, and reads
    # the destinations' signal state under its write lock.
    "sqlite": frozenset(
        {
            "claim_select",
            "claim_lease",
            "outbox_any",
            "heartbeat_update",
            "heartbeat_insert",
            "reap_select",
            "purge_events",
            "signal_state",
        }
    ),
    # PostgreSQL's concurrent writers: one-statement claim and reap, lock ordering
    # (the signal state's too),
    # the migration lock, and a two-step purge of events planned for index probes.
    "postgres": frozenset(
        {
            "claim",
            "event_exists",
            "heartbeat",
            "lock_for_record",
            "migration_lock",
            "purge_events_of",
            "purge_unused_events",
            "jit_off",
            "reap_delete",
            "reap_release",
        }
    ),
}
"""Names only one dialect defines; every other name is in both files."""


def parse_queries(text: str) -> dict[str, str]:
    """``{name: SQL}`` of ``text``'s blocks, fragments filled in; each statement's lines
    are joined by a space, with comment lines dropped (what the drivers send, and logs
    show, is one line)."""
    parts = _HEADER.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        # A trailing "-- why" comment would swallow the lines joined after it.
        lines = [line.partition(" --")[0].strip() for line in body.splitlines()]
        sql = " ".join(line for line in lines if line and not line.startswith("--"))
        sql = sql.removesuffix(";").rstrip()
        if not sql:
            raise ValueError(f"query {name!r} is empty")
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice")
        queries[name] = sql
    fragments = {name: sql for name, sql in queries.items() if name.startswith("_")}
    for name in fragments:
        del queries[name]
        slot = "{" + name + "}"
        users = [q for q, sql in queries.items() if slot in sql]
        if not users:
            raise ValueError(f"fragment {name!r} is used by no query")
        for q in users:
            queries[q] = queries[q].replace(slot, fragments[name])
    return queries


@functools.cache
def load_queries(dialect: str) -> dict[str, str]:
    """The named queries of ``dialect`` (``sqlite`` or ``postgres``), parsed once."""
    path = resources.files("herald.store") / "sql" / dialect / "queries.sql"
    return parse_queries(path.read_text(encoding="utf-8"))
