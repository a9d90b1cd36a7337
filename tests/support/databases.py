"""Throwaway databases for the backend-parametrised tests.

PostgreSQL comes from ``HERALD_TEST_POSTGRES``, else from the DSN that
``scripts/test-services.sh`` (run by ``make test``) wrote, else the machine's
server at 127.0.0.1:5432; each test gets a fresh database created from it and
dropped afterwards.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import asyncpg

_DSN_FILE = Path(__file__).resolve().parents[2] / ".test-services" / "postgres.dsn"
ADMIN_DSN = os.environ.get("HERALD_TEST_POSTGRES") or (
    _DSN_FILE.read_text().strip()
    if _DSN_FILE.exists()
    else "postgresql://postgres@127.0.0.1:5432/test"
)
BACKENDS = ("sqlite", "postgres")


async def create_postgres_database() -> str:
    name = f"herald_t_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(ADMIN_DSN)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    base, _, _ = ADMIN_DSN.rpartition("/")
    return f"{base}/{name}"


async def drop_postgres_database(url: str) -> None:
    name = url.rpartition("/")[2]
    conn = await asyncpg.connect(ADMIN_DSN)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


def sqlite_url(directory: Path) -> str:
    return f"sqlite:///{directory / 'herald.db'}"
