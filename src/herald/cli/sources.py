"""``herald outbox …``: the rejected rows, the outbox sources' state, and the DDL a
producer runs in its own database for one."""

from __future__ import annotations

import argparse

from herald.cli.common import EXIT_FAILED, EXIT_OK
from herald.cli.ops import cmd_rejected
from herald.cli.output import print_json, table
from herald.config import Settings
from herald.sourcedb import probe
from herald.sourcedb.schema import outbox_ddl


async def cmd_outbox(settings: Settings, args: argparse.Namespace) -> int:
    if args.action == "schema":
        print(outbox_ddl(args.dialect, args.table), end="")
        return EXIT_OK
    if args.action == "sources":
        return await cmd_sources(settings, args)
    return await cmd_rejected(settings, args)


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
