"""Operators' commands: ``migrate``, ``check-config``, ``replay``, ``replays``,
``outbox rejected`` and ``instances``."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

from herald.cli.common import EXIT_FAILED, EXIT_OK, delivery_filter, os_user
from herald.cli.output import print_json, short_ts, table, visible
from herald.config import Settings, masked
from herald.timeutil import format_epoch, format_span
from herald.views import list_view, replay_result_view, replay_view

# How often ``replay --follow`` counts the replay's deliveries again.
FOLLOW_SECONDS = 1.0


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
    if found.blockers:
        verdict = "NOT OK: the configuration is valid, but herald run would fail now: " + (
            "; ".join(found.blockers)
        )
    down = [s for s in found.sources or () if s["state"] != "up"]
    status = EXIT_FAILED if found.blockers or down else EXIT_OK
    if getattr(args, "json", False):
        print_json(
            {
                "config": masked(settings),
                "encryption_key": found.key,
                "retry_schedule_seconds": found.retry_schedule,
                "listen": found.listen,
                "database": found.database,
                "warnings": found.warnings,
                "blockers": list(found.blockers),
                "sources": found.sources,
                "ok": not found.blockers and not down,
            }
        )
        return status
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
    for warning in found.warnings:
        print(f"warning: {warning}")
    for s in found.sources or ():
        state = f"{s['pending']} rows waiting" if s["state"] == "up" else f"DOWN: {s['error']}"
        print(f"outbox source {s['name']} ({s['dialect']}, table {s['table']}): {state}")
    if down:
        # It would start (a source that is down never stops it), but not relay those.
        print(f"FAILED: {len(down)} outbox source(s) cannot be read; herald run would start")
        return EXIT_FAILED
    print(verdict)
    return status


async def cmd_replay(settings: Settings, args: argparse.Namespace) -> int:
    from herald.wiring import components

    flt = delivery_filter(args, tenant=None if args.all_tenants else args.tenant)

    tty = sys.stderr.isatty()

    def progress(done: int, total: int) -> None:
        if tty:
            sys.stderr.write(f"\r{_bar(done, total)} re-queued {done}/{total}")
            # Ended at once: the audit line logged next starts on a line of its own.
            sys.stderr.write("\n" if done >= total else "")
            sys.stderr.flush()

    rate = args.rate if args.rate is not None else settings.delivery.replay_rate_per_second
    async with components(settings) as comp:
        result = await comp.service.replays.run(
            flt,
            by=f"cli:{os_user()}",
            dry_run=args.dry_run,
            progress=progress,
            rate_per_second=rate or None,
        )
    if args.json:
        if not args.follow or result.replay is None:
            print_json(replay_result_view(result))
            return EXIT_OK
    elif result.replay is None:
        print(f"{result.matched} deliveries match; dry run, nothing re-queued")
        for d in result.sample:
            print(visible(f"  {d.id}  {d.event_type}  {d.destination_id}  {d.status.value}"))
    else:
        print(
            f"re-queued {result.requeued} of {result.matched} matching deliveries"
            f" as replay {result.replay.id}"
        )
        if not args.follow:
            print(f"# follow it: herald replays show {result.replay.id}", file=sys.stderr)
    if args.follow and result.replay is not None:
        return await _follow(settings, args, result.replay.id, tty=tty)
    return EXIT_OK


def _bar(done: int, total: int, width: int = 30) -> str:
    filled = int(width * done / max(total, 1))
    return f"[{'#' * filled}{'.' * (width - filled)}]"


async def _follow(
    settings: Settings, args: argparse.Namespace, replay_id: str, *, tty: bool
) -> int:
    """Until none of the replay's deliveries is pending: how they turned out, as a live
    line on a terminal; the final counts. Exit status 1 if any failed."""
    from herald.wiring import components

    tenant = None if args.all_tenants else args.tenant
    async with components(settings) as comp:
        while True:
            replay = await comp.service.replays.get(tenant, replay_id)
            view = replay_view(replay)
            out = view["outcome"]
            done = out["succeeded"] + out["failed"]
            line = (
                f"{_bar(done, done + out['pending'])} succeeded {out['succeeded']},"
                f" failed {out['failed']}, pending {out['pending']}"
            )
            if tty:
                sys.stderr.write(f"\r{line}")
                sys.stderr.flush()
            if out["pending"] == 0:
                break
            await asyncio.sleep(FOLLOW_SECONDS)
    if tty:
        sys.stderr.write("\n")
    if args.json:
        print_json(view)
    else:
        print(f"replay {replay_id}: {line.partition('] ')[2]}")
    return EXIT_FAILED if out["failed"] else EXIT_OK


async def cmd_replays(settings: Settings, args: argparse.Namespace) -> int:
    """``replays show ID`` / ``replays list``: replays and their outcome counted now, of
    ``--tenant``; with ``--all-tenants``, of every tenant and operator-wide ones."""
    from herald.wiring import components

    tenant = None if getattr(args, "all_tenants", False) else args.tenant
    async with components(settings) as comp:
        if args.action == "show":
            replay = await comp.service.replays.get(tenant, args.id)
            view = replay_view(replay)
            if args.json:
                print_json(view)
            else:
                print_replay(view)
            return EXIT_OK
        items, has_more = await comp.service.replays.page(tenant, limit=args.limit)
    views = [replay_view(r) for r in items]
    if args.json:
        print_json(list_view(views, has_more=has_more, next_cursor=None, request_id="cli"))
        return EXIT_OK
    table(
        [
            (
                v["id"],
                v["tenant_id"] or "(all)",
                v["by"],
                short_ts(v["created_at"]),
                v["requeued"],
                v["outcome"]["pending"],
                v["outcome"]["succeeded"],
                v["outcome"]["failed"],
            )
            for v in views
        ],
        ("id", "tenant", "by", "created", "requeued", "pending", "succeeded", "failed"),
    )
    if has_more:
        print(f"(more than {args.limit}; use --limit)", file=sys.stderr)
    return EXIT_OK


def print_replay(v: dict[str, Any]) -> None:
    """One replay as ``field value`` lines, its filter and outcome spelled out."""
    outcome = v["outcome"]
    flt = v["filter"]
    rows: list[tuple[str, Any]] = [
        ("id", v["id"]),
        ("tenant_id", v["tenant_id"] or "(all tenants)"),
        ("by", v["by"]),
        ("created_at", v["created_at"]),
        ("finished_at", v["finished_at"] or "(running or interrupted)"),
        (
            "cut_short",
            "yes: Herald stopped it; replay again for the rest" if v["cut_short"] else "no",
        ),
        ("filter", " ".join(f"{k}={_filter_value(x)}" for k, x in flt.items()) or "(none)"),
        ("matched", v["matched"]),
        ("requeued", v["requeued"]),
        ("pending", outcome["pending"]),
        ("succeeded", outcome["succeeded"]),
        ("failed", outcome["failed"]),
    ]
    for name, value in rows:
        print(visible(f"{name:<12} {value}"))


def _filter_value(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


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
                r["source"],
                r["seq"],
                r["id"],
                r["type"],
                r["reason"],
                format_epoch(float(str(r["rejected_at"])))[:19],
            )
            for r in rows
        ],
        ("source", "seq", "id", "type", "reason", "rejected"),
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
