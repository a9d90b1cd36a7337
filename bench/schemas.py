"""The relay's drain with a JSON Schema on every event, and with a payload filter on
every destination, against the same drain without.

In this process, on a fresh SQLite database: 20,000 outbox rows
(``task_run.completed``, the ~200-byte payload of every benchmark) and three
webhook destinations subscribed to ``*``; the relay (``Relay.run_once``, the real
store and catalog) drains the outbox batch by batch, making the events and 60,000
delivery rows, nothing attempted. Four runs, each on its own database: plain; a
schema for the type (required fields, types, an enum, a nested object: what a
tenant writes) in the tenant's catalog; a filter on every destination that every
event passes; both. The figure is events drained per second, and the ratios to
the plain run (the issue asks ≥ 0.9 with a schema). The runs alternate (plain,
schema, filter, both) ``--rounds`` times; the best of each is kept.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import (
    EVENT_TYPE,
    TENANT,
    event_id,
    grid,
    iso_now,
    log,
    machine,
    payload,
    write_named,
)
from herald.config import Settings
from herald.outbox import Relay
from herald.wiring import components

NAME = "schemas"
HELP = "relay drain with a schema on every event / a filter on every destination vs without"

SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["task_run_id", "workflow", "status", "attempt", "records"],
    "properties": {
        "task_run_id": {"type": "string", "pattern": "^tr_[0-9]+$"},
        "workflow": {"type": "string", "maxLength": 200},
        "status": {"enum": ["completed", "failed", "cancelled"]},
        "attempt": {"type": "integer", "minimum": 1},
        "duration_ms": {"type": "integer"},
        "finished_at": {"type": "string"},
        "records": {
            "type": "object",
            "required": ["read", "written"],
            "properties": {
                "read": {"type": "integer"},
                "written": {"type": "integer"},
                "skipped": {"type": "integer"},
            },
        },
    },
}
FILTER: dict[str, Any] = {
    "data": {"status": {"$in": ["completed", "failed"]}, "attempt": {"$gte": 1}},
    "created_at": {"$gte": "2020-01-01T00:00:00Z"},
}
VARIANTS = ("plain", "schema", "filter", "both")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="2,000 rows, one round")
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)


async def _drain(directory: Path, variant: str, events: int) -> float:
    db = directory / f"{variant}.db"
    overrides: dict[str, Any] = {
        "database": {"url": f"sqlite:///{db}"},
        "security": {"allow_private_networks": True},
    }
    settings = Settings(**overrides)
    async with components(settings) as comp:
        svc = comp.service
        for n in range(3):
            body: dict[str, Any] = {
                "name": f"d{n}",
                "type": "webhook",
                "webhook": {"url": f"http://127.0.0.1:9/{n}"},
                "events": ["*"],
            }
            if variant in ("filter", "both"):
                body["filter"] = FILTER
            await svc.create(TENANT, body)
        if variant in ("schema", "both"):
            await svc.event_types.put(TENANT, EVENT_TYPE, {"description": "x", "schema": SCHEMA})
        conn = sqlite3.connect(db)
        with conn:
            conn.executemany(
                "INSERT INTO herald_outbox (id, tenant_id, type, data) VALUES (?, ?, ?, ?)",
                ((event_id(i), TENANT, EVENT_TYPE, payload(i).decode()) for i in range(events)),
            )
        conn.close()
        relay = Relay(
            comp.store,
            comp.catalog,
            comp.policy,
            batch_size=settings.relay.batch_size,
            poll_interval=0.01,
            idle_poll=1.0,
            max_payload_bytes=settings.relay.max_payload_bytes,
        )
        started = time.perf_counter()
        drained = 0
        while drained < events:
            count = await relay.run_once()
            if count == 0:
                raise RuntimeError(f"{variant}: the relay stopped at {drained} of {events}")
            drained += count
        elapsed = time.perf_counter() - started
        rejected = await comp.store.count_rejected(up_to=1 << 62)
        if rejected:
            raise RuntimeError(f"{variant}: {rejected} rows rejected")
    return events / elapsed


def run(args: argparse.Namespace) -> int:
    events = 2_000 if args.quick else args.events
    rounds = 1 if args.quick else args.rounds
    best = dict.fromkeys(VARIANTS, 0.0)
    with tempfile.TemporaryDirectory(prefix="herald-bench-schemas-") as tmp:
        for r in range(rounds):
            for variant in VARIANTS:
                directory = Path(tmp) / f"r{r}"
                directory.mkdir(exist_ok=True)
                rate = asyncio.run(_drain(directory, variant, events))
                log(f"round {r + 1} {variant}: {rate:,.0f} events/s")
                best[variant] = max(best[variant], rate)
    ratios = {v: best[v] / best["plain"] for v in VARIANTS}
    print(
        grid(
            ("run", "events/s", "vs plain"),
            [(v, f"{best[v]:,.0f}", f"{ratios[v]:.2f}") for v in VARIANTS],
        )
    )
    write_named(
        NAME,
        {
            "when": iso_now(),
            "machine": machine(),
            "events": events,
            "rounds": rounds,
            "events_per_second": best,
            "ratio_to_plain": ratios,
        },
        quick=args.quick,
    )
    return 0
