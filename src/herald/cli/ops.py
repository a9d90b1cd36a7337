"""Operators' commands: ``migrate``, ``check-config``, ``replay``, ``outbox rejected``
and ``instances``."""

from __future__ import annotations

import argparse
import sys
import time

from herald.cli.common import EXIT_OK, delivery_filter, os_user
from herald.cli.output import print_json, table, visible
from herald.config import Settings, masked
from herald.timeutil import format_epoch, format_span
from herald.views import delivery_view


async def cmd_migrate(settings: Settings, args: argparse.Namespace) -> int:
    from herald.wiring import components

    async with components(settings) as comp:
        version = await comp.store.schema_version()
    print(f"schema is at version {version}")
    return EXIT_OK


async def cmd_check_config(settings: Settings, args: argparse.Namespace) -> int:
    """Every start-up check of ``run`` (and with ``--check-db`` the database), the
    effective config with secrets masked, the retry schedule, and a verdict."""
    from herald.wiring import preflight

    found = await preflight(settings, check_db=getattr(args, "check_db", False))
    verdict = "OK: herald run would start with this configuration"
    if getattr(args, "json", False):
        print_json(
            {
                "config": masked(settings),
                "encryption_key": found.key,
                "retry_schedule_seconds": found.retry_schedule,
                "listen": found.listen,
                "database": found.database,
                "ok": True,
            }
        )
        return EXIT_OK
    schedule = found.retry_schedule
    print_json(masked(settings))
    print()
    print(f"encryption key: {found.key}")
    print(
        f"retry schedule: {len(schedule)} retries after "
        + ", ".join(format_span(s) for s in schedule)
        + f" ({format_span(sum(schedule))} from the first attempt to the last)"
        if schedule
        else "retry schedule: no retries (delivery.max_retries = 0)"
    )
    print(f"api.listen: {found.listen}")
    if found.database is not None:
        print(f"database: {found.database}")
    print(verdict)
    return EXIT_OK


async def cmd_replay(settings: Settings, args: argparse.Namespace) -> int:
    from herald.wiring import components

    flt = delivery_filter(args, tenant=None if args.all_tenants else args.tenant)

    def progress(done: int, total: int) -> None:
        if sys.stderr.isatty():
            width = 30
            filled = int(width * done / max(total, 1))
            sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
            sys.stderr.flush()

    rate = args.rate if args.rate is not None else settings.delivery.replay_rate_per_second
    async with components(settings) as comp:
        result = await comp.service.replay(
            flt,
            by=f"cli:{os_user()}",
            dry_run=args.dry_run,
            progress=progress,
            rate_per_second=rate or None,
        )
    if sys.stderr.isatty() and not args.dry_run and result.matched:
        sys.stderr.write("\n")
    if args.json:
        print_json(
            {
                "object": "replay",
                "dry_run": result.dry_run,
                "matched": result.matched,
                "requeued": result.requeued,
                "sample": [delivery_view(d) for d in result.sample],
            }
        )
        return EXIT_OK
    if result.dry_run:
        print(f"{result.matched} deliveries match; dry run, nothing re-queued")
        for d in result.sample:
            print(visible(f"  {d.id}  {d.event_type}  {d.destination_id}  {d.status.value}"))
    else:
        print(f"re-queued {result.requeued} of {result.matched} matching deliveries")
    return EXIT_OK


async def cmd_rejected(settings: Settings, args: argparse.Namespace) -> int:
    from herald.wiring import components

    async with components(settings) as comp:
        rows = await comp.store.list_rejected(
            limit=args.limit, tenant_id=None if args.all_tenants else args.tenant
        )
    if args.json:
        print_json({"object": "list", "data": rows})
        return EXIT_OK
    table(
        [
            (
                r["seq"],
                r["id"],
                r["type"],
                r["reason"],
                format_epoch(float(str(r["rejected_at"])))[:19],
            )
            for r in rows
        ],
        ("seq", "id", "type", "reason", "rejected"),
    )
    return EXIT_OK


async def cmd_instances(settings: Settings, args: argparse.Namespace) -> int:
    from herald.wiring import components

    async with components(settings) as comp:
        instances = await comp.store.list_instances()
    now = time.time()
    timeout = settings.delivery.instance_timeout_seconds

    def state(heartbeat_at: float) -> str:
        return "live" if now - heartbeat_at <= timeout else "silent"

    if args.json:
        print_json(
            {
                "object": "list",
                "data": [
                    {
                        "id": i.id,
                        "hostname": i.hostname,
                        "pid": i.pid,
                        "version": i.version,
                        "started_at": format_epoch(i.started_at),
                        "heartbeat_at": format_epoch(i.heartbeat_at),
                        "state": state(i.heartbeat_at),
                    }
                    for i in instances
                ],
            }
        )
        return EXIT_OK
    table(
        [
            (
                i.id,
                i.hostname,
                i.pid,
                i.version,
                format_epoch(i.started_at)[:19],
                f"{max(now - i.heartbeat_at, 0.0):.0f} s ago",
                state(i.heartbeat_at),
            )
            for i in instances
        ],
        ("id", "host", "pid", "version", "started", "heartbeat", "state"),
    )
    return EXIT_OK
