"""The ``herald`` command line's commands, arguments and help."""

from __future__ import annotations

import argparse
from pathlib import Path

from herald import __version__
from herald.model import DEFAULT_TENANT, DeliveryStatus, DestinationStatus


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
    kinded = argparse.ArgumentParser(add_help=False, parents=[scoped])
    kinded.add_argument(
        "--operator",
        action="store_true",
        help="operator keys (sk_op_…, for the web console) instead of a tenant's API keys",
    )
    keys.add_parser("create", parents=[kinded], help="print a new sk_live_ (or sk_op_) key once")
    keys.add_parser("list", parents=[kinded], help="the tenant's keys (id, last characters)")
    keys.add_parser(
        "revoke", parents=[kinded], help="revoke a key: its id from 'keys list', or the key"
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
