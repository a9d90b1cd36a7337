"""One Herald instance for a benchmark: config, CLI, outbox pre-load and ``herald run``.

SQLite by default; pass a :class:`~bench.db.Database` for PostgreSQL. Several
instances on one PostgreSQL database share ``security.encryption_key`` and
each has its own config file, log and ``api.listen``.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.common import (
    EVENT_TYPE,
    REPO_ROOT,
    TENANT,
    BenchError,
    Child,
    Deadline,
    event_id,
    free_port,
    iso_ms,
    log,
    payload,
    run_cmd,
)
from bench.db import Database, OutboxRowT

CLI_TIMEOUT = 60.0
BULK_TIMEOUT = 600.0
STOP_TIMEOUT = 60.0
PROGRESS_SECONDS = 5.0


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))


def new_encryption_key() -> str:
    import base64

    return base64.urlsafe_b64encode(os.urandom(32)).decode("ascii")


class HeraldInstance:
    """Herald on ``db`` (SQLite in ``workdir`` by default); other keys at their defaults."""

    def __init__(
        self,
        workdir: Path,
        overrides: Mapping[str, Mapping[str, object]] | None = None,
        *,
        db: Database | None = None,
        name: str = "herald",
        encryption_key: str | None = None,
    ) -> None:
        self.workdir = workdir
        self.name = name
        self.cpus: tuple[int, ...] = ()
        """CPUs ``herald run`` may use (``taskset``); empty: all of them."""
        self.db = db or Database.sqlite(workdir / "herald.db")
        self.db_path = self.db.path or workdir / "herald.db"
        self.config_path = workdir / f"{name}.toml"
        self.log_path = workdir / f"{name}.log"
        self.api_port = free_port()
        sections: dict[str, dict[str, object]] = {
            "database": {"url": self.db.url},
            "api": {"listen": f"127.0.0.1:{self.api_port}"},
            "security": {"allow_private_networks": True},
            "log": {"level": "warning", "format": "json"},
        }
        if self.db.kind != "sqlite" or encryption_key:
            sections["security"]["encryption_key"] = encryption_key or new_encryption_key()
        for section, values in (overrides or {}).items():
            sections.setdefault(section, {}).update(values)
        self.encryption_key = str(sections["security"].get("encryption_key", ""))
        lines: list[str] = []
        for section, values in sections.items():
            lines.append(f"[{section}]")
            lines.extend(f"{k} = {_toml(v)}" for k, v in values.items())
        self.config_path.write_text("\n".join(lines) + "\n")
        self.env = {k: v for k, v in os.environ.items() if not k.upper().startswith("HERALD_")} | {
            "PYTHONUNBUFFERED": "1"
        }

    def sibling(self, name: str) -> HeraldInstance:
        """Another instance on the same database with the same key (PostgreSQL scale-out)."""
        if self.db.kind == "sqlite":
            raise BenchError("SQLite is single-instance")
        return HeraldInstance(
            self.workdir, db=self.db, name=name, encryption_key=self.encryption_key
        )

    # --- CLI ----------------------------------------------------------------
    def cli(self, *args: str) -> str:
        argv = [sys.executable, "-m", "herald", *args, "--config", str(self.config_path)]
        return run_cmd(argv, timeout=CLI_TIMEOUT, what=f"herald {args[0]}", cwd=self.workdir)

    def migrate(self) -> None:
        self.cli("migrate")

    def create_destination(self, body: Mapping[str, Any]) -> str:
        out = self.cli("destinations", "create", "--json", "--data", json.dumps(body))
        dest_id = json.loads(out)["id"]
        if not isinstance(dest_id, str):
            raise BenchError(f"unexpected destinations create output: {out}")
        return dest_id

    def create_webhook(self, url: str, secret: str, events: Sequence[str] = ("*",)) -> str:
        body = {
            "name": "bench",
            "type": "webhook",
            "events": list(events),
            "webhook": {"url": url, "secret": secret},
        }
        return self.create_destination(body)

    def create_destinations(self, bodies: Sequence[Mapping[str, Any]]) -> list[str]:
        """Many destinations in one process, through the same service as the CLI."""
        spec = self.workdir / f"{self.name}-destinations.json"
        spec.write_text(json.dumps(list(bodies)))
        argv = [
            sys.executable,
            "-m",
            "bench.mkdest",
            "--config",
            str(self.config_path),
            "--bodies",
            str(spec),
        ]
        out = run_cmd(argv, timeout=BULK_TIMEOUT, what="bench.mkdest", cwd=REPO_ROOT)
        ids = json.loads(out.strip().splitlines()[-1])
        if not isinstance(ids, list) or len(ids) != len(bodies):
            raise BenchError(f"bench.mkdest created {ids!r}, expected {len(bodies)} ids")
        return [str(i) for i in ids]

    # --- database -------------------------------------------------------------
    def reader(self) -> sqlite3.Connection:
        """A read-only SQLite connection in autocommit mode (sees each commit as it lands)."""
        return sqlite3.connect(f"file:{self.db_path}?mode=ro", uri=True, isolation_level=None)

    def scalar(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        return self.db.scalar(sql, params)

    def preload(
        self,
        events: int,
        *,
        start: int = 0,
        type_of: Callable[[int], str] | None = None,
        created_at: str | None = None,
    ) -> float:
        """Insert outbox rows ``start``…``start+events-1`` in one transaction; seconds taken."""
        stamp = created_at or iso_ms(time.time())
        rows: list[OutboxRowT] = [
            (
                event_id(i),
                TENANT,
                type_of(i) if type_of else EVENT_TYPE,
                payload(i).decode(),
                stamp,
            )
            for i in range(start, start + events)
        ]
        return self.db.insert_outbox(rows)

    # --- daemon ---------------------------------------------------------------
    def start(self) -> Child:
        argv = [sys.executable, "-m", "herald", "run", "--config", str(self.config_path)]
        if self.cpus:  # taskset execs the daemon in place: the pid is the daemon's
            argv = ["taskset", "-c", ",".join(map(str, self.cpus)), *argv]
        return Child(self.name, argv, log_path=self.log_path, cwd=self.workdir, env=self.env)

    def stop(self, child: Child) -> None:
        code = child.stop(sig=signal.SIGTERM, timeout=STOP_TIMEOUT)
        if code != 0:
            raise BenchError(f"{self.name} exited {code} on SIGTERM:\n{child.log_tail()}")

    def wait_ready(self, child: Child, deadline: Deadline) -> None:
        """Until ``/readyz`` answers 200 (migrations done, relay and workers running)."""
        url = f"http://127.0.0.1:{self.api_port}/readyz"
        while True:
            if not child.alive():
                raise BenchError(f"{self.name} exited during start-up:\n{child.log_tail()}")
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            deadline.check(f"{self.name} not ready")
            time.sleep(0.05)

    def taken(self) -> dict[str, int]:
        """The running daemon's deliveries taken to attempt, by how (``/metrics``)."""
        url = f"http://127.0.0.1:{self.api_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            return taken_from_metrics(resp.read().decode())

    def activate(self, dest_ids: str | Sequence[str], deadline: Deadline) -> None:
        """Run Herald until every destination's verification ping made it ``active``."""
        ids = [dest_ids] if isinstance(dest_ids, str) else list(dest_ids)
        child = self.start()
        try:
            last = time.monotonic()
            while True:
                if not child.alive():
                    raise BenchError(f"herald run exited early:\n{child.log_tail()}")
                statuses = dict(
                    self.db.query(
                        "SELECT status, COUNT(*) FROM herald_destinations GROUP BY status"
                    )
                )
                active = int(statuses.get("active", 0))
                if active >= len(ids):
                    break
                if time.monotonic() - last > PROGRESS_SECONDS:
                    last = time.monotonic()
                    log(f"activation: {active}/{len(ids)} destinations active")
                deadline.check(f"destinations by status: {statuses}")
                time.sleep(0.1)
        except BaseException:
            child.stop(timeout=10)
            raise
        self.stop(child)
        log(f"{len(ids)} destination(s) active")


def taken_from_metrics(text: str) -> dict[str, int]:
    """``herald_deliveries_taken_total`` by its ``via`` label, from a Prometheus text page."""
    from prometheus_client.parser import text_string_to_metric_families

    return {
        s.labels["via"]: int(s.value)
        for family in text_string_to_metric_families(text)
        if family.name == "herald_deliveries_taken"
        for s in family.samples
        if s.name == "herald_deliveries_taken_total"
    }


def wait_count(
    db: Database,
    sql: str,
    target: int,
    *,
    children: Sequence[Child],
    deadline: Deadline,
    what: str,
    params: Sequence[Any] = (),
    poll: float = 0.2,
    on_poll: Callable[[int], None] | None = None,
) -> int:
    """Poll ``sql`` (a COUNT) until it reaches ``target``; every child must stay alive.

    ``on_poll`` is called with each count read below ``target`` (a CPU meter's sample)."""
    last = time.monotonic()
    while True:
        for child in children:
            if not child.alive():
                raise BenchError(f"{child.name} exited during {what}:\n{child.log_tail()}")
        done = db.count(sql, params)
        if done >= target:
            return done
        if on_poll is not None:
            on_poll(done)
        if time.monotonic() - last >= PROGRESS_SECONDS:
            last = time.monotonic()
            log(f"{what}: {done}/{target}")
        deadline.check(f"{what}: {done}/{target}")
        time.sleep(poll)


def vm_hwm_mb(pid: int) -> float:
    """Peak resident set size of ``pid`` (VmHWM), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise BenchError(f"no VmHWM in /proc/{pid}/status")
