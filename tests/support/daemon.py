"""``herald run`` as a subprocess, configured in a temporary directory."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from tests.support.sql import Db


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return (
            "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"
        )
    return json.dumps(str(value))


class Herald:
    """One daemon under test, with helpers to run the CLI against the same config."""

    def __init__(
        self,
        workdir: Path,
        overrides: Mapping[str, Mapping[str, Any]] | None = None,
        *,
        database_url: str | None = None,
        wrapper: Sequence[str] = (),
    ):
        self.workdir = workdir
        # A command the daemon runs under (e.g. strace), given before the interpreter.
        self.wrapper = list(wrapper)
        self.db_path = workdir / "herald.db"
        self.database_url = database_url or f"sqlite:///{self.db_path}"
        self.backend = "postgres" if database_url else "sqlite"
        self.port = free_port()
        self.config_path = workdir / "herald.toml"
        self.log_path = workdir / "herald.log"
        sections: dict[str, dict[str, Any]] = {
            "database": {"url": self.database_url},
            "api": {"listen": f"127.0.0.1:{self.port}"},
            # One process unless a test asks for workers (tests/e2e/test_workers.py):
            # children double every daemon's start-up cost across the suite.
            "delivery": {
                "backoff_base_seconds": 0.05,
                "idle_poll_seconds": 0.2,
                "worker_processes": 1,
            },
            "relay": {"poll_interval_seconds": 0.01},
            # "default" may use the host's cloud identity (the default lists no tenant).
            "security": {
                "allow_private_networks": True,
                "ambient_credentials_tenants": ["default"],
            },
            "log": {"format": "json", "level": "info"},
        }
        if self.backend == "postgres":
            sections["security"]["encryption_key_file"] = str(workdir / "herald.key")
            # A restarted instance is a new lease owner: the killed one's leases
            # must lapse (renewed every third of this while alive) before takeover.
            sections["delivery"]["lease_seconds"] = 3
        for name, values in (overrides or {}).items():
            sections.setdefault(name, {}).update(values)
        lines = []
        for name, values in sections.items():
            lines.append(f"[{name}]")
            lines.extend(f"{k} = {_toml_value(v)}" for k, v in values.items())
        self.config_path.write_text("\n".join(lines) + "\n")
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._keys: dict[str, str] = {}

    # --- process ---------------------------------------------------------
    def start(self, *, timeout: float = 60.0) -> Herald:
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [
                *self.wrapper,
                sys.executable,
                "-m",
                "herald",
                "run",
                "--config",
                str(self.config_path),
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=self.workdir,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._close_log()
                raise AssertionError(
                    f"herald run exited with {self.proc.returncode}:\n{self.log()}"
                )
            try:
                if self.get("/readyz")[0] == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"herald run not ready within {timeout} s:\n{self.log()}")

    def stop(self, *, timeout: float = 30.0) -> int:
        """SIGTERM and wait: the graceful path."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=timeout)
        self._close_log()
        return code

    async def astart(self) -> Herald:
        """start() without blocking the test's event loop (its receivers must keep answering)."""
        return await asyncio.to_thread(self.start)

    async def astop(self, *, timeout: float = 30.0) -> int:
        return await asyncio.to_thread(self.stop, timeout=timeout)

    def wait_exit(self, timeout: float = 30.0) -> int:
        """Wait for the daemon to exit on its own; its exit status."""
        assert self.proc is not None
        code = self.proc.wait(timeout=timeout)
        self._close_log()
        return code

    def kill(self) -> None:
        """SIGKILL: the crash path."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=10)
        self._close_log()

    def discard(self) -> None:
        """At a test's end: kill it if it still runs, and close its log either way (a
        daemon that exited on its own still holds the file open here)."""
        if self.proc is not None and self.proc.poll() is None:
            self.kill()
        self._close_log()

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_events(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    # --- HTTP ------------------------------------------------------------
    def get(self, path: str, *, key: str | None = None) -> tuple[int, Any]:
        """(status, JSON body) of ``GET path``, with ``key`` as the Bearer key if given."""
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        ask = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", headers=headers)
        try:
            with urllib.request.urlopen(ask, timeout=10) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            with exc:
                return exc.code, json.loads(exc.read() or b"null")

    # --- CLI -------------------------------------------------------------
    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [sys.executable, "-m", "herald", *args, "--config", str(self.config_path)],
            capture_output=True,
            text=True,
            cwd=self.workdir,
            timeout=60,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"herald {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
        return proc

    def cli_json(self, *args: str) -> Any:
        return json.loads(self.cli(*args, "--json").stdout)

    async def acli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(self.cli, *args, check=check)

    async def acli_json(self, *args: str) -> Any:
        return json.loads((await self.acli(*args, "--json")).stdout)

    def api_key(self, tenant: str = "default") -> str:
        """An API key for ``tenant``, made once with ``herald keys create``."""
        if tenant not in self._keys:
            self._keys[tenant] = self.cli("keys", "create", "--tenant", tenant).stdout.strip()
        return self._keys[tenant]

    def portal_token(self, tenant: str = "default") -> str:
        """What a tenant's server does to open the portal: ``POST /v2/token`` with its
        API key; the ``tk_`` value."""
        url = f"http://127.0.0.1:{self.port}/v2/token"
        ask = urllib.request.Request(url, b"", {"Authorization": f"Bearer {self.api_key(tenant)}"})
        with urllib.request.urlopen(ask, timeout=10) as resp:
            assert resp.status == 201
            token: str = json.loads(resp.read())["token"]
        assert token.startswith("tk_")
        return token

    def create_webhook(
        self,
        url: str,
        *,
        events: list[str] | None = None,
        secret: str | None = None,
        name: str = "test hook",
        tenant: str = "default",
    ) -> dict[str, Any]:
        """Create a webhook destination through the API (the CLI's own tests use the CLI)."""
        webhook: dict[str, str] = {"url": url}
        if secret:
            webhook["secret"] = secret
        body = {"name": name, "type": "webhook", "webhook": webhook, "events": events or ["*"]}
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/v2/event-destinations",
            data=json.dumps(body).encode(),
            headers={
                "Authorization": f"Bearer {self.api_key(tenant)}",
                "Content-Type": "application/json",
            },
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as resp:
            result: dict[str, Any] = json.loads(resp.read())
        return result

    async def acreate_webhook(self, url: str, **kwargs: Any) -> dict[str, Any]:
        return await asyncio.to_thread(lambda: self.create_webhook(url, **kwargs))

    # --- SQL, as a producer would ------------------------------------------
    def connect(self) -> Db:
        """A plain DB-API connection to Herald's database (autocommit; ``?`` placeholders)."""
        return Db(self.database_url)

    def insert_events(self, rows: list[tuple[str, str, str, str]]) -> None:
        """Insert (id, tenant, type, data-json) rows in one producer transaction."""
        db = self.connect()
        try:
            db.execute("BEGIN")
            db.executemany(
                "INSERT INTO herald_outbox (id, tenant_id, type, data) VALUES (?, ?, ?, ?)", rows
            )
            db.execute("COMMIT")
        finally:
            db.close()

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        db = self.connect()
        try:
            return db.execute(sql, params)
        finally:
            db.close()
