"""Outbox sources' databases: a producer's own PostgreSQL, MySQL/MariaDB or SQLite
database, read through one small interface (:class:`SourceDB`).

A source's database is not Herald's: Herald reads rows of one outbox table there in
``seq`` order and deletes those it has relayed, nothing more. Each dialect is a
module of its own, imported only when a source of it is configured (the MySQL
driver is the ``mysql`` extra). Driver errors become :class:`SourceError` here.
"""

from __future__ import annotations

import importlib.util

from herald.config import SourceSettings
from herald.errors import ConfigError
from herald.sourcedb.base import SourceDB, SourceError

__all__ = ["SourceDB", "SourceError", "check_driver", "open_source"]

_DRIVERS = {"mysql": ("aiomysql", "pip install 'herald[mysql]'")}


def check_driver(source: SourceSettings) -> None:
    """Raise :class:`ConfigError` (one line: what to install) when the driver of
    ``source``'s database is not installed."""
    driver = _DRIVERS.get(source.dialect)
    if driver is not None and importlib.util.find_spec(driver[0]) is None:
        raise ConfigError(
            f"outbox source {source.name!r}: a {source.dialect}:// source needs the"
            f" {driver[0]} driver: {driver[1]}"
        )


def open_source(source: SourceSettings) -> SourceDB:
    """The (not yet connected) database of ``source``."""
    check_driver(source)
    if source.dialect == "postgresql":
        from herald.sourcedb.postgres import PostgresSource

        return PostgresSource(source)
    if source.dialect == "mysql":
        from herald.sourcedb.mysql import MySQLSource

        return MySQLSource(source)
    from herald.sourcedb.sqlite import SQLiteSource

    return SQLiteSource(source)
