"""``herald keys …``: tenants' API keys and operators' console keys (``--operator``),
and re-encrypting credentials under a new encryption key."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import structlog

from herald.access import ApiKeyInfo
from herald.access.keys import OPERATOR_KIND, OPERATOR_TENANT, key_id
from herald.cli.common import EXIT_OK, UsageError, os_user
from herald.cli.output import print_json, short_ts, table
from herald.config import Settings
from herald.errors import ConfigError, HeraldError
from herald.model import DEFAULT_TENANT
from herald.timeutil import format_epoch
from herald.views import list_view


async def _cmd_keys_create(settings: Settings, args: argparse.Namespace) -> int:
    from herald.wiring import access_store

    operator = args.operator
    tenant = _tenant(args)
    async with access_store(settings) as access:
        key, digest = await access.keys.create(tenant, operator=operator)
    structlog.get_logger("herald.keys").info(
        "api_key_created", by=f"cli:{os_user()}", **_whose(args), key_id=key_id(digest)
    )
    if args.json:
        view: dict[str, Any] = {"object": "api_key", "id": key_id(digest), "key": key}
        view.update({"kind": OPERATOR_KIND} if operator else {"tenant_id": args.tenant})
        print_json(view)
    else:
        print(key)
        whose = "an operator (the web console)" if operator else f"tenant {args.tenant!r}"
        print(f"# API key for {whose}; shown once, only its hash is stored.", file=sys.stderr)
    return EXIT_OK


def _whose(args: argparse.Namespace) -> dict[str, str]:
    """The audit lines' owner of a key: its kind, or its tenant."""
    return {"kind": OPERATOR_KIND} if args.operator else {"tenant_id": args.tenant}


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
    from herald.wiring import InstanceLock, components, encryption_key, previous_keys

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

    def progress(rewritten: int, seen: int, last: str) -> None:
        print(
            f"re-encrypted {rewritten} of {seen} destinations so far (up to {last})",
            file=sys.stderr,
            flush=True,
        )

    try:
        async with components(settings, box=box) as comp:
            seen, rewritten = await comp.access.keys.reencrypt(
                batch_size=args.batch_size, progress=progress
            )
    finally:
        if lock is not None:
            lock.release()
    structlog.get_logger("herald.keys").info(
        "encryption_key_rotated", by=os_user(), destinations=seen, reencrypted=rewritten
    )
    if args.json:
        print_json({"object": "key_rotation", "destinations": seen, "reencrypted": rewritten})
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


def _key_view(key: ApiKeyInfo) -> dict[str, Any]:
    owner = {"kind": key.kind} if key.kind == OPERATOR_KIND else {"tenant_id": key.tenant_id}
    return {
        "object": "api_key",
        "id": key_id(key.key_hash),
        **owner,
        "ends_with": key.hint,
        "created_at": format_epoch(key.created_at),
        "revoked_at": None if key.revoked_at is None else format_epoch(key.revoked_at),
    }


async def _cmd_keys_list(settings: Settings, args: argparse.Namespace) -> int:
    from herald.wiring import access_store

    async with access_store(settings) as access:
        tenant = _tenant(args)
        views = [_key_view(k) for k in await access.keys.of(tenant, operator=args.operator)]
    if args.json:
        print_json(list_view(views, has_more=False, next_cursor=None, request_id="cli"))
    else:
        rows = [
            [v["id"], "…" + v["ends_with"], short_ts(v["created_at"]), short_ts(v["revoked_at"])]
            for v in views
        ]
        table(rows, ["id", "key", "created", "revoked"])
    return EXIT_OK


async def _cmd_keys_revoke(settings: Settings, args: argparse.Namespace) -> int:
    """Revoke one key, named by its id from ``keys list`` (8+ hex digits) or the key itself.

    An operator key's console sessions end with it (they are looked up through it)."""
    from herald.wiring import access_store

    tenant = _tenant(args)
    whose = "operators" if args.operator else f"tenant {args.tenant!r}"
    async with access_store(settings) as access:
        revoked = _key_view(await access.keys.revoke(tenant, args.key, operator=args.operator))
    structlog.get_logger("herald.keys").info(
        "api_key_revoked", by=f"cli:{os_user()}", **_whose(args), key_id=revoked["id"]
    )
    if args.json:
        print_json(revoked)
    else:
        print(f"revoked key {revoked['id']} (…{revoked['ends_with']}) of {whose}")
    return EXIT_OK


def _tenant(args: argparse.Namespace) -> str:
    """The tenant column of the keys a command acts on (none for operator keys)."""
    if args.operator:
        if args.tenant != DEFAULT_TENANT:
            raise UsageError("an operator key belongs to no tenant: give --operator or --tenant")
        return OPERATOR_TENANT
    return str(args.tenant)


async def cmd_keys(settings: Settings, args: argparse.Namespace) -> int:
    commands = {
        "rotate-encryption": _cmd_keys_rotate,
        "list": _cmd_keys_list,
        "revoke": _cmd_keys_revoke,
    }
    return await commands.get(args.action, _cmd_keys_create)(settings, args)
