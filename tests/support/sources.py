"""Producers' own databases for the outbox-source tests: a fresh one per test, of each
dialect, with the table ``herald outbox schema`` prints, written through plain DB-API
connections as a producer's code would (``herald.outbox.publish``).

MariaDB is the machine's server at 127.0.0.1:3306 (root, no password; ``make services``
installs and starts it): each test gets a database of its own, dropped afterwards.
PostgreSQL is a fresh database on the test server (``tests/support/databases.py``).
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

from herald.sourcedb.schema import outbox_ddl
from tests.support.daemon import free_port
from tests.support.databases import create_postgres_database, drop_postgres_database
from tests.support.required import unavailable

DIALECTS = ("sqlite", "mysql", "postgresql")
MARIADB = {"host": "127.0.0.1", "port": 3306, "user": "root", "password": ""}
MARIADB_URL = "mysql://root@127.0.0.1:3306"


def _mysql(database: str | None = None, port: int = 3306) -> Any:
    import pymysql

    try:
        return pymysql.connect(
            **{**MARIADB, "port": port}, database=database, autocommit=True, connect_timeout=5
        )
    except pymysql.err.OperationalError as exc:
        unavailable(f"MariaDB at 127.0.0.1:3306 (root, no password) is not reachable: {exc}")


def _split(sql: str) -> list[str]:
    """DDL statements one by one (PostgreSQL's function body holds ``;`` in ``$$``)."""
    out: list[str] = []
    current: list[str] = []
    quoted = False
    for line in sql.splitlines():
        if line.strip().startswith("--"):
            continue
        current.append(line)
        quoted ^= line.count("$$") % 2 == 1
        if line.rstrip().endswith(";") and not quoted:
            out.append("\n".join(current).strip().removesuffix(";"))
            current = []
    return [s for s in out if s]


class Producer:
    """One producer's database: ``url`` for Herald, ``connect()`` for the producer."""

    def __init__(
        self, dialect: str, url: str, *, path: Path | None = None, db: str = "", port: int = 3306
    ) -> None:
        self.dialect = dialect
        self.url = url
        self.path = path
        self.db = db
        self.port = port

    def connect(self) -> Any:
        """A new DB-API connection, outside any transaction until the caller opens one."""
        if self.dialect == "sqlite":
            assert self.path is not None
            conn = sqlite3.connect(self.path, isolation_level=None, timeout=10)
            conn.execute("PRAGMA busy_timeout = 10000")
            return conn
        if self.dialect == "mysql":
            conn = _mysql(self.db, self.port)
            conn.autocommit(False)
            return conn
        import psycopg

        return psycopg.connect(self.url)

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        """A producer's transaction: committed when the block ends, rolled back if it raises."""
        conn = self.connect()
        try:
            if self.dialect == "sqlite":
                conn.execute("BEGIN IMMEDIATE")
            yield conn
            conn.commit()
        except BaseException:
            conn.rollback()
            raise
        finally:
            conn.close()

    def run(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """One statement in its own transaction; its rows."""
        with self.transaction() as conn:
            cur = conn.cursor()
            cur.execute(sql, params)
            rows = list(cur.fetchall()) if cur.description else []
            cur.close()
            return rows

    def count(self, table: str = "herald_outbox") -> int:
        return int(self.run(f"SELECT COUNT(*) FROM {table}")[0][0])

    def setup(self) -> None:
        """The outbox table (``herald outbox schema``) and a business table beside it."""
        business = {
            "sqlite": "CREATE TABLE orders (id INTEGER PRIMARY KEY, total INTEGER NOT NULL)",
            "mysql": "CREATE TABLE orders (id BIGINT PRIMARY KEY AUTO_INCREMENT,"
            " total BIGINT NOT NULL) ENGINE=InnoDB",
            "postgresql": "CREATE TABLE orders (id bigserial PRIMARY KEY, total bigint NOT NULL)",
        }[self.dialect]
        with self.transaction() as conn:
            cur = conn.cursor()
            for statement in [*_split(outbox_ddl(self.dialect)), business]:
                cur.execute(statement)
            cur.close()


@asynccontextmanager
async def producer_database(dialect: str, directory: Path) -> AsyncIterator[Producer]:
    """A fresh producer database of ``dialect`` with its outbox table, dropped afterwards."""
    if dialect == "sqlite":
        path = directory / "producer.db"
        sqlite3.connect(path).execute("PRAGMA journal_mode = wal").close()
        p = Producer("sqlite", f"sqlite:///{path}", path=path)
        p.setup()
        yield p
        return
    if dialect == "mysql":
        name = f"herald_src_{uuid.uuid4().hex[:12]}"
        admin = _mysql()
        try:
            admin.cursor().execute(f"CREATE DATABASE `{name}`")
            p = Producer("mysql", f"{MARIADB_URL}/{name}", db=name)
            p.setup()
            yield p
        finally:
            admin.cursor().execute(f"DROP DATABASE IF EXISTS `{name}`")
            admin.close()
        return
    url = await create_postgres_database()
    try:
        p = Producer("postgresql", url)
        p.setup()
        yield p
    finally:
        await drop_postgres_database(url)


class ThrowawayMariaDB:
    """A MariaDB server of the test's own (``mariadb-install-db`` into a directory, its
    own port, no grant checks), which the test may stop and start again."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def install(self) -> None:
        tool = shutil.which("mariadb-install-db")
        if tool is None:
            unavailable("mariadb-install-db is missing (make services installs mariadb-server)")
        subprocess.run(
            [
                tool,
                "--no-defaults",
                f"--datadir={self.dir / 'data'}",
                "--user=root",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )

    def start(self, timeout: float = 60) -> None:
        server = shutil.which("mariadbd") or "/usr/sbin/mariadbd"
        with (self.dir / "server.log").open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    server,
                    "--no-defaults",
                    f"--datadir={self.dir / 'data'}",
                    "--user=root",
                    f"--port={self.port}",
                    "--bind-address=127.0.0.1",
                    f"--socket={self.dir / 'mysqld.sock'}",
                    f"--pid-file={self.dir / 'mysqld.pid'}",
                    "--skip-grant-tables",
                    "--innodb-buffer-pool-size=16M",
                    "--innodb-log-file-size=16M",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        import pymysql

        deadline = time.monotonic() + timeout
        while True:
            try:
                pymysql.connect(
                    host="127.0.0.1", port=self.port, user="root", connect_timeout=2
                ).close()
                return
            except pymysql.err.OperationalError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(
                        f"throwaway mariadbd did not start: {(self.dir / 'server.log').read_text()}"
                    ) from None
                time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=60)
        self.proc = None

    def producer(self, name: str = "shop") -> Producer:
        import pymysql

        admin = pymysql.connect(host="127.0.0.1", port=self.port, user="root", autocommit=True)
        admin.cursor().execute(f"CREATE DATABASE IF NOT EXISTS `{name}`")
        admin.close()
        p = Producer("mysql", f"mysql://root@127.0.0.1:{self.port}/{name}", db=name, port=self.port)
        p.setup()
        return p
