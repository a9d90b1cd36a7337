"""A PostgreSQL server of the test's own, which it may stop and start at will.

The shared server on 5432 serves every test (and other people's): stopping it would
break them. This one is initialised into a temporary directory with Debian's binaries
(``/usr/lib/postgresql/*/bin``), on a free port, trusting local connections, and runs
as the ``postgres`` user when the tests run as root (initdb refuses root).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.support.daemon import free_port
from tests.support.required import unavailable


def _bin_dir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


class PrivatePostgres:
    """``start()`` once to initialise and run it; ``stop()`` and ``start()`` again to
    take it away and bring it back with its data; ``close()`` removes it."""

    def __init__(self) -> None:
        bin_dir = _bin_dir()
        if bin_dir is None:
            unavailable("no PostgreSQL server binaries under /usr/lib/postgresql/*/bin")
        self.bin = bin_dir
        self.user: str | None = None
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("postgres")
            except KeyError:
                unavailable("running as root and there is no postgres user to run initdb as")
            self.user = "postgres"
        # Not under pytest's tmp_path: its parents are private to root.
        self.root = Path(tempfile.mkdtemp(prefix="herald-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        if self.user is not None:
            shutil.chown(self.root, self.user)
        self._initialised = False

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/herald"

    def _run(self, *args: str, timeout: float = 60) -> None:
        command = [str(self.bin / args[0]), *args[1:]]
        if self.user is not None:
            command = ["runuser", "-u", self.user, "--", *command]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise AssertionError(f"{' '.join(args)}: {proc.stdout}{proc.stderr}")

    def start(self) -> PrivatePostgres:
        if not self._initialised:
            self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "--no-sync")
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} -c fsync=off"
            " -c max_connections=50"
        )
        log = str(self.root / "server.log")
        self._run(
            "pg_ctl", "-D", str(self.data), "-o", options, "-l", log, "-w", "-t", "30", "start"
        )
        if not self._initialised:
            self._run(
                "createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "herald"
            )
            self._initialised = True
        return self

    def stop(self) -> None:
        """Stop it as an operator would (fast: sessions are closed at once)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def close(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)
