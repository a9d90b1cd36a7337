"""Storage backends behind one interface (:class:`~herald.store.base.Store`)."""

from __future__ import annotations

from herald.config import Settings
from herald.crypto import SecretBox
from herald.store.base import Store


def make_store(settings: Settings, box: SecretBox) -> Store:
    """The backend ``database.url`` selects (not yet opened)."""
    path = settings.database.sqlite_path
    if path is not None:
        from herald.store.sqlite import SQLiteStore

        return SQLiteStore(path, box=box, busy_timeout=settings.database.busy_timeout_seconds)
    from herald.store.postgres import PostgresStore

    return PostgresStore(settings.database.url, box=box, pool_size=settings.database.pool_size)


__all__ = ["Store", "make_store"]
