"""Fresh, already migrated PostgreSQL databases for the backend-parametrised tests.

Creating a database and running Herald's migrations on it costs about half a
second; ``CREATE DATABASE … TEMPLATE`` of a migrated database costs a fraction
of that. A background thread also makes the next database while the current
test runs and drops used ones behind it, so a test rarely waits for either.
Tests that exercise the first migration itself create an empty database with
:func:`tests.support.databases.create_postgres_database` instead.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import suppress

from herald.crypto import SecretBox
from herald.store.postgres import PostgresStore
from tests.support.databases import ADMIN_DSN


def _url(name: str) -> str:
    return f"{ADMIN_DSN.rpartition('/')[0]}/{name}"


def _admin(sql: str) -> None:
    import psycopg

    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        conn.execute(sql)


async def _migrate(url: str) -> None:
    store = PostgresStore(url, box=SecretBox(b"t" * 32), pool_size=2)
    try:
        await store.open()
    finally:
        # No session may stay connected: PostgreSQL copies only an idle template.
        await store.close()


class MigratedDatabases:
    """Clones of one migrated template database, made one ahead in a worker thread."""

    def __init__(self) -> None:
        self._template: str | None = None
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pg-template")
        self._ahead: deque[Future[str]] = deque()

    def _clone(self) -> str:
        if self._template is None:
            name = f"herald_tmpl_{uuid.uuid4().hex[:12]}"
            _admin(f'CREATE DATABASE "{name}"')
            self._template = name
            asyncio.run(_migrate(_url(name)))
        name = f"herald_t_{uuid.uuid4().hex[:12]}"
        _admin(f'CREATE DATABASE "{name}" TEMPLATE "{self._template}"')
        return _url(name)

    async def take(self) -> str:
        """The URL of a new database holding Herald's current schema and nothing else."""
        ready = self._ahead.popleft() if self._ahead else self._worker.submit(self._clone)
        self._ahead.append(self._worker.submit(self._clone))
        return await asyncio.wrap_future(ready)

    def give_back(self, url: str) -> None:
        """Drop a database :meth:`take` gave (in the background)."""
        name = url.rpartition("/")[2]
        self._worker.submit(_admin, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def close(self) -> None:
        """Drop what is left: the database made ahead and the template."""
        while self._ahead:
            ready = self._ahead.popleft()
            with suppress(Exception):  # when it failed, there is nothing to drop
                self.give_back(ready.result())
        self._worker.shutdown(wait=True)
        if self._template is not None:
            _admin(f'DROP DATABASE IF EXISTS "{self._template}" WITH (FORCE)')
            self._template = None
