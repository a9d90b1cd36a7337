"""``herald outbox …``: the rejected rows, the outbox sources' state, and the DDL a
producer runs in its own database for one."""

from __future__ import annotations

import argparse
import asyncio
import time

from herald.cli.common import EXIT_FAILED, EXIT_OK
from herald.cli.ops import cmd_rejected
from herald.cli.output import print_json, table
from herald.config import Settings, SourceSettings, mask_secrets
from herald.sourcedb import SourceError, open_source
from herald.sourcedb.schema import outbox_ddl

PROBE_TIMEOUT_SECONDS = 15


async def cmd_outbox(settings: Settings, args: argparse.Namespace) -> int:
    if args.action == "schema":
        print(outbox_ddl(args.dialect, args.table), end="")
        return EXIT_OK
    if args.action == "sources":
        return await cmd_sources(settings, args)
    return await cmd_rejected(settings, args)


async def probe(source: SourceSettings) -> dict[str, object]:
    """One source as this process finds it: reachable, its table readable, the rows
    waiting and the oldest one's age."""
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


async def cmd_sources(settings: Settings, args: argparse.Namespace) -> int:
    found = [await probe(source) for source in settings.outbox.sources]
    if args.json:
        print_json({"object": "list", "data": found})
    else:
        table(
            [
                (
                    s["name"],
                    s["dialect"],
                    s["table"],
                    s["state"],
                    s["pending"],
                    s["lag_seconds"],
                    s["error"],
                )
                for s in found
            ],
            ("name", "dialect", "table", "state", "pending", "lag_s", "error"),
        )
    return EXIT_FAILED if any(s["state"] != "up" for s in found) else EXIT_OK
