"""Outbox sources' databases: a producer's own PostgreSQL, MySQL/MariaDB or SQLite
database, read through one small interface (:class:`SourceDB`).

A source's database is not Herald's: Herald reads rows of one outbox table there in
``seq`` order and deletes those it has relayed, nothing more. Each dialect is a
module of its own, imported only when a source of it is configured (the MySQL
driver is the ``mysql`` extra). Driver errors become :class:`SourceError` here.
"""

from __future__ import annotations

import asyncio
import importlib.util
import time
from typing import Any

from herald.config import SourceSettings, mask_secrets
from herald.errors import ConfigError
from herald.sourcedb.base import SourceDB, SourceError

__all__ = ["SourceDB", "SourceError", "check_driver", "open_source", "probe"]

_DRIVERS = {"mysql": ("asyncmy", "pip install 'herald[mysql]'")}


def check_driver(source: SourceSettings) -> None:
    """Raise :class:`ConfigError` (one line: what to install) when the driver of
    ``source``'s database is not installed."""
    driver = _DRIVERS.get(source.dialect)
    if driver is not None and importlib.util.find_spec(driver[0]) is None:
        raise ConfigError(
            f"outbox source {source.name!r}: a {source.dialect}:// source needs the"
            f" {driver[0]} driver: {driver[1]}"
        )


def open_source(source: SourceSettings) -> SourceDB[Any]:
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


PROBE_TIMEOUT_SECONDS = 15


async def probe(source: SourceSettings) -> dict[str, object]:
    """``source`` as this process finds it now: ``state`` ``up`` (its table readable,
    with the rows waiting and the oldest one's age) or ``down`` with the ``error``."""
    out: dict[str, object] = {
        "name": source.name,
        "dialect": source.dialect,
        "url": mask_secrets(source.url),
        "table": source.table,
        "state": "up",
        "error": None,
        "pending": None,
        "lag_seconds": None,
    }
    db = open_source(source)
    try:
        await asyncio.wait_for(db.open(), PROBE_TIMEOUT_SECONDS)
        pending, oldest = await asyncio.wait_for(db.stats(), PROBE_TIMEOUT_SECONDS)
        out["pending"] = pending
        out["lag_seconds"] = 0.0 if oldest is None else round(max(0.0, time.time() - oldest), 3)
    except SourceError as exc:
        out["state"], out["error"] = "down", exc.message
    except TimeoutError:
        out["state"], out["error"] = "down", "timed out"
    finally:
        await db.shutdown()
    return out
