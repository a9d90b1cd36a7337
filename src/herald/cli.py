"""The ``herald`` command line: the daemon, and the API's operations for ops at a shell.

Exit status: 0 success, 1 the operation failed, 2 bad usage or bad input.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import getpass
import os
import re
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

import orjson
import structlog

from herald import __version__
from herald.apikeys import API_KEY_PREFIX, hash_api_key, new_api_key
from herald.config import Settings, load_settings, masked
from herald.errors import BadRequest, ConfigError, HeraldError, NotFound, ValidationError
from herald.logs import configure as configure_logs
from herald.model import (
    DEFAULT_TENANT,
    DeliveryFilter,
    DeliveryStatus,
    Destination,
    DestinationStatus,
)
from herald.store.base import ApiKeyInfo
from herald.timeutil import format_epoch, parse_timestamp
from herald.views import delivery_view, destination_view, event_view, list_view

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class UsageError(HeraldError):
    code = "usage"


def _die(message: str, code: int) -> NoReturn:
    print(f"herald: error: {message}", file=sys.stderr)
    raise SystemExit(code)


def parse_when(value: str) -> float:
    """An ISO 8601 timestamp, or a duration ago such as ``15m``, ``2h``, ``7d``."""
    if m := _DURATION.match(value):
        return time.time() - float(m.group(1)) * _UNITS[m.group(2)]
    try:
        return parse_timestamp(value).epoch
    except ValueError as exc:
        raise UsageError(f"{value!r} is neither a timestamp nor a duration like 2h") from exc


def read_body(value: str) -> Any:
    """``--data``: inline JSON, or ``@path`` to read it from a file (``@-`` for stdin)."""
    text: str | bytes = value
    if value.startswith("@"):
        name = value[1:]
        try:
            text = sys.stdin.buffer.read() if name == "-" else Path(name).read_bytes()
        except OSError as exc:
            raise UsageError(f"cannot read {name}: {exc.strerror}") from exc
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"--data is not valid JSON: {exc}") from exc


# --- output -------------------------------------------------------------------
def _print_json(obj: Any) -> None:
    sys.stdout.write(orjson.dumps(obj, option=orjson.OPT_INDENT_2).decode() + "\n")


def _table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> None:
    cells = [[("-" if c is None else str(c)) for c in row] for row in rows]
    widths = [
        max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)
    ]
    print("  ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip())
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def _short_ts(value: str | None) -> str | None:
    return None if value is None else value[:19].replace("T", " ")


# --- commands -----------------------------------------------------------------
def _os_user() -> str:
    """Who runs this command, for the audit lines. A container's uid often has no passwd
    entry, where getpass.getuser() raises: the uid stands in."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.getuid()}"


async def _cmd_migrate(settings: Settings, args: argparse.Namespace) -> int:
    from herald.wiring import components

    async with components(settings) as comp:
        version = await comp.store.schema_version()
    print(f"schema is at version {version}")
    return EXIT_OK


async def _cmd_emit(settings: Settings, args: argparse.Namespace) -> int:
    from herald.wiring import components

    data = read_body(args.data)
    async with components(settings) as comp:
        event = await comp.service.publish(
            args.tenant, args.type, data, event_id=args.id, created_at=args.created_at
        )
    if args.json:
        _print_json(event_view(event))
    else:
        print(event.id)
    return EXIT_OK


async def _cmd_keys_create(settings: Settings, args: argparse.Namespace) -> int:
    from herald.wiring import components

    key = new_api_key()
    async with components(settings) as comp:
        await comp.store.create_api_key(
            key_hash=hash_api_key(key), tenant_id=args.tenant, hint=key[-4:], now=time.time()
        )
    if args.json:
        _print_json({"object": "api_key", "tenant_id": args.tenant, "key": key})
    else:
        print(key)
        print(
            f"# API key for tenant {args.tenant!r}; shown once, only its hash is stored.",
            file=sys.stderr,
        )
    return EXIT_OK


def _new_key(args: argparse.Namespace) -> bytes:
    """``--new-key KEY`` or ``--new-key-file PATH`` (``-``: stdin), as 32 key bytes."""
    from herald.crypto import parse_key

    if args.new_key is not None:
        text, source = args.new_key, "--new-key"
    else:
        source = "--new-key-file"
        name = args.new_key_file
        try:
            raw = sys.stdin.buffer.read() if name == "-" else Path(name).read_bytes()
            text = raw.decode("ascii")
        except OSError as exc:
            raise UsageError(f"cannot read {name}: {exc.strerror}") from exc
        except UnicodeDecodeError:
            raise UsageError(f"{name} does not hold a base64 key") from None
    try:
        return parse_key(text)
    except ConfigError as exc:
        raise UsageError(f"{source}: {exc.message}") from None


async def _cmd_keys_rotate(settings: Settings, args: argparse.Namespace) -> int:
    """Re-encrypt every destination's credentials under a new key, a batch per transaction.

    Rows under the new key are skipped, so an interrupted run is finished by running
    it again; until then every row opens with the old or the new key.
    """
    from herald.crypto import SecretBox
    from herald.store import make_store
    from herald.wiring import InstanceLock, encryption_key, previous_keys

    if not 1 <= args.batch_size <= 10_000:
        raise UsageError("--batch-size must be from 1 to 10000")
    new_key = _new_key(args)
    current = encryption_key(settings)
    # Writes under the new key; reads under it, the current key or a previous one.
    box = SecretBox(new_key, [current, *previous_keys(settings)])
    lock = None
    db_path = settings.database.sqlite_path
    if db_path is not None:
        # A running daemon keeps the old key in memory and would write under it again.
        lock = InstanceLock(db_path)
        try:
            lock.acquire()
        except ConfigError:
            raise HeraldError(
                f"herald run is using {db_path}; stop it before rotating the encryption key"
            ) from None
    seen = rewritten = 0
    try:
        store = make_store(settings, box)
        await store.open()
        try:
            after: str | None = None
            while True:
                looked, changed, last = await store.reencrypt_secrets(
                    after_id=after, limit=args.batch_size
                )
                if last is None:
                    break
                seen, rewritten, after = seen + looked, rewritten + changed, last
                print(
                    f"re-encrypted {rewritten} of {seen} destinations so far (up to {last})",
                    file=sys.stderr,
                    flush=True,
                )
                if looked < args.batch_size:
                    break
        finally:
            await store.close()
    finally:
        if lock is not None:
            lock.release()
    structlog.get_logger("herald.keys").info(
        "encryption_key_rotated", by=_os_user(), destinations=seen, reencrypted=rewritten
    )
    if args.json:
        _print_json({"object": "key_rotation", "destinations": seen, "reencrypted": rewritten})
    else:
        print(f"re-encrypted {rewritten} of {seen} destinations under the new key")
    if new_key != current:
        print(
            "# Now make the new key current (security.encryption_key, or the key file) and keep"
            " the old one in security.previous_encryption_keys until every instance runs with"
            " the new key; then run this again (it should re-encrypt 0) and drop the old key.",
            file=sys.stderr,
        )
    return EXIT_OK


KEY_ID_LENGTH = 12
"""An API key is named by the first hex digits of its SHA-256 (the key itself is gone)."""


def _key_view(key: ApiKeyInfo) -> dict[str, Any]:
    return {
        "object": "api_key",
        "id": key.key_hash[:KEY_ID_LENGTH],
        "tenant_id": key.tenant_id,
        "ends_with": key.hint,
        "created_at": format_epoch(key.created_at),
        "revoked_at": None if key.revoked_at is None else format_epoch(key.revoked_at),
    }


async def _cmd_keys_list(settings: Settings, args: argparse.Namespace) -> int:
    from herald.wiring import components

    async with components(settings) as comp:
        views = [_key_view(k) for k in await comp.store.list_api_keys(args.tenant)]
    if args.json:
        _print_json(list_view(views, has_more=False, next_cursor=None, request_id="cli"))
    else:
        rows = [
            [v["id"], "…" + v["ends_with"], _short_ts(v["created_at"]), _short_ts(v["revoked_at"])]
            for v in views
        ]
        _table(rows, ["id", "key", "created", "revoked"])
    return EXIT_OK


async def _cmd_keys_revoke(settings: Settings, args: argparse.Namespace) -> int:
    """Revoke one key, named by its id from ``keys list`` (8+ hex digits) or the key itself."""
    from herald.wiring import components

    ref = args.key.strip()
    if ref.startswith(API_KEY_PREFIX):
        prefix = hash_api_key(ref)
    elif re.fullmatch(r"[0-9a-fA-F]{8,64}", ref):
        prefix = ref.lower()
    else:
        raise UsageError("name the key by its id from 'herald keys list' or give the key itself")
    async with components(settings) as comp:
        keys = await comp.store.list_api_keys(args.tenant)
        live = [k for k in keys if k.key_hash.startswith(prefix) and k.revoked_at is None]
        if len(live) > 1:
            raise UsageError(f"{len(live)} keys of tenant {args.tenant!r} match; give more digits")
        if not live:
            raise NotFound(f"tenant {args.tenant!r} has no unrevoked key {args.key!r}")
        await comp.store.revoke_api_keys(
            tenant_id=args.tenant, hash_prefix=live[0].key_hash, now=time.time()
        )
        revoked = _key_view(replace(live[0], revoked_at=time.time()))
    structlog.get_logger("herald.keys").info(
        "api_key_revoked", by=f"cli:{_os_user()}", tenant_id=args.tenant, key_id=revoked["id"]
    )
    if args.json:
        _print_json(revoked)
    else:
        print(f"revoked key {revoked['id']} (…{revoked['ends_with']}) of tenant {args.tenant!r}")
    return EXIT_OK


async def _cmd_keys(settings: Settings, args: argparse.Namespace) -> int:
    commands = {
        "rotate-encryption": _cmd_keys_rotate,
        "list": _cmd_keys_list,
        "revoke": _cmd_keys_revoke,
    }
    return await commands.get(args.action, _cmd_keys_create)(settings, args)


def _dest_rows(views: list[dict[str, Any]]) -> None:
    _table(
        [
            (
                v["id"],
                v["name"],
                v["type"],
                v["status"],
                ",".join(v["events"]),
                _short_ts(v["created_at"]),
            )
            for v in views
        ],
        ("id", "name", "type", "status", "events", "created"),
    )


async def _cmd_destinations(settings: Settings, args: argparse.Namespace) -> int:
    from herald.wiring import components

    async with components(settings) as comp:
        svc = comp.service

        def view(dest: Destination) -> dict[str, Any]:
            return destination_view(dest, comp.registry)

        action = args.action
        if action == "list":
            status = DestinationStatus(args.status) if args.status else None
            items, has_more = await svc.list_destinations(
                args.tenant, status=status, type=args.type, limit=args.limit
            )
            views = [view(d) for d in items]
            if args.json:
                _print_json(list_view(views, has_more=has_more, next_cursor=None, request_id="cli"))
            else:
                _dest_rows(views)
            return EXIT_OK
        if action == "create":
            dest = await svc.create(args.tenant, _object(read_body(args.data)))
        elif action == "show":
            dest = await svc.get(args.tenant, args.id)
        elif action == "update":
            dest = await svc.update(args.tenant, args.id, _object(read_body(args.data)))
        elif action == "delete":
            dest = await svc.delete(args.tenant, args.id)
        elif action == "verify":
            dest = await svc.verify(args.tenant, args.id)
        elif action == "rotate-secret":
            dest, secret = await svc.rotate_secret(args.tenant, args.id, args.secret)
            out = view(dest)
            out["secret"] = secret
            if args.json:
                _print_json(out)
            else:
                print(secret)
                print(
                    "# New signing secret, shown once; the previous one signs for 24 h more.",
                    file=sys.stderr,
                )
            return EXIT_OK
        elif action == "test":
            delivery = await svc.test(args.tenant, args.id)
            if args.json:
                _print_json(delivery_view(delivery, with_attempts=True))
            else:
                _print_delivery(delivery_view(delivery, with_attempts=True))
            return EXIT_OK if delivery.status is DeliveryStatus.SUCCESS else EXIT_FAILED
        else:  # pragma: no cover - argparse restricts the choices
            raise UsageError(f"unknown action {action}")
        if args.json:
            _print_json(view(dest))
        else:
            v = view(dest)
            _dest_rows([v])
    return EXIT_OK


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadRequest("--data must be a JSON object")
    return body


def _filter(args: argparse.Namespace, *, tenant: str | None) -> DeliveryFilter:
    ids: list[str] = list(getattr(args, "delivery", None) or [])
    if getattr(args, "ids_file", None):
        try:
            text = Path(args.ids_file).read_text()
        except OSError as exc:
            raise UsageError(f"cannot read {args.ids_file}: {exc.strerror}") from exc
        ids.extend(line.strip() for line in text.splitlines() if line.strip())
    return DeliveryFilter(
        tenant_id=tenant,
        destination_id=args.destination,
        status=DeliveryStatus(args.status) if args.status else None,
        event_types=tuple(args.event_type or ()),
        since=parse_when(args.since) if args.since else None,
        until=parse_when(args.until) if args.until else None,
        ids=tuple(ids),
    )


def _print_delivery(v: dict[str, Any]) -> None:
    for key in (
        "id",
        "event_id",
        "event_type",
        "destination_id",
        "status",
        "attempt_count",
        "next_attempt_at",
        "created_at",
    ):
        print(f"{key:16} {v[key] if v[key] is not None else '-'}")
    attempts = v.get("attempts") or []
    if attempts:
        print()
        _table(
            [
                (
                    a["number"],
                    _short_ts(a["started_at"]),
                    a["duration_ms"],
                    a["outcome"],
                    a["response_status"],
                    (a["error"] or "")[:60],
                )
                for a in attempts
            ],
            ("attempt", "started", "ms", "outcome", "status", "error"),
        )


async def _cmd_deliveries(settings: Settings, args: argparse.Namespace) -> int:
    from herald.wiring import components

    async with components(settings) as comp:
        if args.action == "show":
            delivery = await comp.service.get_delivery(args.tenant, args.id)
            if args.json:
                _print_json(delivery_view(delivery, with_attempts=True))
            else:
                _print_delivery(delivery_view(delivery, with_attempts=True))
            return EXIT_OK
        items, has_more = await comp.service.list_deliveries(
            _filter(args, tenant=args.tenant), limit=args.limit
        )
    views = [delivery_view(d) for d in items]
    if args.json:
        _print_json(list_view(views, has_more=has_more, next_cursor=None, request_id="cli"))
        return EXIT_OK
    _table(
        [
            (
                v["id"],
                v["event_type"],
                v["destination_id"],
                v["status"] + (" (held)" if v["held"] and v["status"] == "pending" else ""),
                v["attempt_count"],
                (v["last_attempt"] or {}).get("response_status"),
                _short_ts(v["next_attempt_at"]),
                _short_ts(v["created_at"]),
            )
            for v in views
        ],
        (
            "id",
            "event type",
            "destination",
            "status",
            "attempts",
            "last http",
            "next attempt",
            "created",
        ),
    )
    if has_more:
        print(f"(more than {args.limit}; use --limit)", file=sys.stderr)
    return EXIT_OK


async def _cmd_replay(settings: Settings, args: argparse.Namespace) -> int:
    from herald.wiring import components

    flt = _filter(args, tenant=args.tenant)

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
            by=f"cli:{_os_user()}",
            dry_run=args.dry_run,
            progress=progress,
            rate_per_second=rate or None,
        )
    if sys.stderr.isatty() and not args.dry_run and result.matched:
        sys.stderr.write("\n")
    if args.json:
        _print_json(
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
            print(f"  {d.id}  {d.event_type}  {d.destination_id}  {d.status.value}")
    else:
        print(f"re-queued {result.requeued} of {result.matched} matching deliveries")
    return EXIT_OK


async def _cmd_rejected(settings: Settings, args: argparse.Namespace) -> int:
    from herald.wiring import components

    async with components(settings) as comp:
        rows = await comp.store.list_rejected(limit=args.limit)
    if args.json:
        _print_json({"object": "list", "data": rows})
        return EXIT_OK
    _table(
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


async def _cmd_instances(settings: Settings, args: argparse.Namespace) -> int:
    from herald.wiring import components

    async with components(settings) as comp:
        instances = await comp.store.list_instances()
    now = time.time()
    timeout = settings.delivery.instance_timeout_seconds

    def state(heartbeat_at: float) -> str:
        return "live" if now - heartbeat_at <= timeout else "silent"

    if args.json:
        _print_json(
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
    _table(
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


async def _cmd_check_config(settings: Settings, args: argparse.Namespace) -> int:
    _print_json(masked(settings))
    return EXIT_OK


def _cmd_worker(settings: Settings, args: argparse.Namespace) -> int:
    from herald.logs import configure
    from herald.workers import serve_worker

    # stdout carries the attempt records to the parent: log lines go to stderr.
    configure(level=settings.log.level, fmt=settings.log.format, stream=sys.stderr)
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        return runner.run(serve_worker(settings))


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency where it builds
        return None
    return uvloop.new_event_loop


def _cmd_run(settings: Settings, args: argparse.Namespace) -> int:
    from herald.app import Daemon
    from herald.logs import configure
    from herald.workers import fork_workers

    configure(level=settings.log.level, fmt=settings.log.format)
    forked = None
    if settings.delivery.worker_processes > 1:
        # Now, with everything imported and before any loop or thread exists.
        forked = fork_workers(
            settings.delivery.worker_processes, functools.partial(_cmd_worker, settings, args)
        )
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        return runner.run(Daemon(settings, config_path=args.config, forked=forked).run())


# --- parser -------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--config", type=Path, help="TOML config file (default: none, built-in defaults)"
    )
    scoped = argparse.ArgumentParser(add_help=False, parents=[common])
    scoped.add_argument(
        "--tenant", default=DEFAULT_TENANT, help="tenant to act for (default: %(default)s)"
    )
    scoped.add_argument("--json", action="store_true", help="print the API's JSON representation")

    parser = argparse.ArgumentParser(prog="herald", description="Herald event delivery engine")
    parser.add_argument("--version", action="version", version=f"herald {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sub.add_parser("run", parents=[common], help="run the daemon")
    # Started by `herald run` when delivery.worker_processes > 1; not for direct use.
    sub.add_parser("worker", parents=[common], help="(internal) an attempt process of `herald run`")
    sub.add_parser("migrate", parents=[common], help="create or upgrade the schema and exit")
    sub.add_parser("check-config", parents=[common], help="validate and print the effective config")

    emit = sub.add_parser("emit", parents=[scoped], help="write one event into the outbox")
    emit.add_argument("type")
    emit.add_argument("--data", required=True, help="JSON object, or @file.json")
    emit.add_argument("--id", help="event id (evt_…); generated when absent")
    emit.add_argument("--created-at", help="RFC 3339 timestamp (default: now)")

    keys = sub.add_parser("keys", help="API keys").add_subparsers(dest="action", required=True)
    keys.add_parser("create", parents=[scoped], help="print a new sk_live_ key once")
    keys.add_parser("list", parents=[scoped], help="the tenant's keys (id, last characters)")
    keys.add_parser(
        "revoke", parents=[scoped], help="revoke a key: its id from 'keys list', or the key"
    ).add_argument("key")
    rot = keys.add_parser(
        "rotate-encryption",
        parents=[common],
        help="re-encrypt every destination's credentials under a new encryption key",
    )
    new = rot.add_mutually_exclusive_group(required=True)
    new.add_argument(
        "--new-key",
        help="the new key: base64 of 32 bytes; write --new-key=KEY (a key may begin with -)",
    )
    new.add_argument("--new-key-file", help="a file holding the new key ('-': stdin)")
    rot.add_argument(
        "--batch-size", type=int, default=100, help="rows per transaction (default: %(default)s)"
    )
    rot.add_argument("--json", action="store_true", help="print the counts as JSON")

    dests = sub.add_parser("destinations", help="event destinations").add_subparsers(
        dest="action", required=True
    )
    dl = dests.add_parser("list", parents=[scoped])
    dl.add_argument("--status", choices=[s.value for s in DestinationStatus])
    dl.add_argument("--type")
    dl.add_argument("--limit", type=int, default=100)
    dc = dests.add_parser("create", parents=[scoped])
    dc.add_argument("--data", required=True, help="the API's JSON body, or @file.json")
    for action in ("show", "delete", "verify", "test"):
        dests.add_parser(action, parents=[scoped]).add_argument("id")
    du = dests.add_parser("update", parents=[scoped])
    du.add_argument("id")
    du.add_argument("--data", required=True, help="the API's JSON body, or @file.json")
    dr = dests.add_parser("rotate-secret", parents=[scoped])
    dr.add_argument("id")
    dr.add_argument("--secret", help="the new whsec_ secret (default: generate one)")

    deliveries = sub.add_parser("deliveries", help="event deliveries").add_subparsers(
        dest="action", required=True
    )
    dlist = deliveries.add_parser("list", parents=[scoped])
    _filter_args(dlist)
    dlist.add_argument("--limit", type=int, default=50)
    deliveries.add_parser("show", parents=[scoped]).add_argument("id")

    replay = sub.add_parser("replay", parents=[scoped], help="re-queue matching deliveries")
    _filter_args(replay)
    replay.add_argument("--delivery", action="append", help="a delivery id (repeatable)")
    replay.add_argument("--ids-file", help="file with one delivery id per line")
    replay.add_argument("--dry-run", action="store_true", help="count and show a sample only")
    replay.add_argument(
        "--rate",
        type=float,
        help="deliveries made due per second (default: delivery.replay_rate_per_second; 0: all)",
    )

    outbox = sub.add_parser("outbox", help="the outbox").add_subparsers(
        dest="action", required=True
    )
    rej = outbox.add_parser(
        "rejected", parents=[scoped], help="rows the relay rejected, newest first"
    )
    rej.add_argument("--limit", type=int, default=50)

    inst = sub.add_parser(
        "instances", parents=[common], help="running instances on this database and heartbeats"
    )
    inst.add_argument("--json", action="store_true", help="print JSON")
    return parser


def _filter_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--destination", help="destination id")
    p.add_argument("--status", choices=[s.value for s in DeliveryStatus])
    p.add_argument("--event-type", action="append", help="event type (repeatable)")
    p.add_argument("--since", help="created at or after: timestamp or duration ago (2h)")
    p.add_argument("--until", help="created before: timestamp or duration ago")


_ASYNC_COMMANDS: dict[str, Callable[[Settings, argparse.Namespace], Coroutine[Any, Any, int]]] = {
    "migrate": _cmd_migrate,
    "emit": _cmd_emit,
    "keys": _cmd_keys,
    "destinations": _cmd_destinations,
    "deliveries": _cmd_deliveries,
    "replay": _cmd_replay,
    "outbox": _cmd_rejected,
    "instances": _cmd_instances,
    "check-config": _cmd_check_config,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = load_settings(args.config)
        if args.command == "run":
            return _cmd_run(settings, args)
        if args.command == "worker":
            return _cmd_worker(settings, args)
        # Commands print results on stdout; their log lines go to stderr.
        configure_logs(level=settings.log.level, fmt=settings.log.format, stream=sys.stderr)
        return asyncio.run(_ASYNC_COMMANDS[args.command](settings, args))
    except (ConfigError, ValidationError, BadRequest, UsageError) as exc:
        _die(_with_field(exc), EXIT_USAGE)
    except HeraldError as exc:
        _die(_with_field(exc), EXIT_FAILED)
    except KeyboardInterrupt:
        return 130


def _with_field(exc: HeraldError) -> str:
    if exc.field and exc.field not in exc.message:
        return f"{exc.field}: {exc.message}"
    return exc.message


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
