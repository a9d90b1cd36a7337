"""The store: one :class:`~herald.store.sqlstore.SQLStore` over the SQLite or the
PostgreSQL dialect, chosen by ``database.url``."""

from __future__ import annotations

from typing import Any, TypeAlias

from herald.config import Settings
from herald.crypto import SecretBox
from herald.store.sqlstore import SQLStore

Store: TypeAlias = SQLStore[Any]
"""Everything the engine, the service and the CLI ask of a database. Operations that
must be atomic are single methods; callers never hold a transaction open across
awaits of their own."""


def make_store(settings: Settings, box: SecretBox) -> Store:
    """The backend ``database.url`` selects (not yet opened)."""
    path = settings.database.sqlite_path
    if path is not None:
        from herald.store.sqlite import SQLiteStore

        return SQLiteStore(
            path,
            box=box,
            busy_timeout=settings.database.busy_timeout_seconds,
            failing_after=settings.signals.failing_after_attempts,
            breaker=settings.delivery.breaker,
        )
    from herald.store.postgres import PostgresStore

    return PostgresStore(
        settings.database.url,
        box=box,
        pool_size=settings.database.pool_size,
        failing_after=settings.signals.failing_after_attempts,
        breaker=settings.delivery.breaker,
    )


async def applied_migrations(settings: Settings) -> set[int] | None:
    """The migrations the configured database has, changing nothing: None when it does
    not exist yet (a SQLite file ``herald run`` would create). Raises StorageError
    when it cannot be reached."""
    path = settings.database.sqlite_path
    if path is not None:
        from herald.store.sqlite import applied_migrations as sqlite_applied

        return await sqlite_applied(path)
    from herald.store.postgres import applied_migrations as postgres_applied

    return await postgres_applied(settings.database.url)


__all__ = ["Store", "applied_migrations", "make_store"]
