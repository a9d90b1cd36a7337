"""The ``herald`` command line's commands, arguments and help."""

from __future__ import annotations

import argparse
import difflib
import functools
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from herald import __version__
from herald.model import DEFAULT_TENANT, DeliveryStatus, DestinationStatus

HIDDEN_COMMANDS = frozenset({"worker"})
"""Commands that exist for Herald's own use and are offered nowhere."""


class HeraldParser(argparse.ArgumentParser):
    """argparse, speaking like the rest of the CLI: each usage error is followed by a
    ``herald: hint:`` line that fits it — the close match of a mistyped command, action
    or option, else where that command's help is."""

    def error(self, message: str, hint: str | None = None) -> NoReturn:
        self.print_usage(sys.stderr)
        print(f"herald: error: {message}", file=sys.stderr)
        print(f"herald: hint: {hint or f'Run {self.prog!r} with --help.'}", file=sys.stderr)
        raise SystemExit(2)

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        choices = action.choices
        if choices is None or value in choices:
            return
        offered = [str(c) for c in choices if c not in HIDDEN_COMMANDS]
        if isinstance(action, argparse._SubParsersAction):
            what = f"{str(action.metavar or 'command').lower()} {value!r}"
        else:
            what = f"value {value!r} for {'/'.join(action.option_strings) or action.dest}"
        self.error(
            f"unknown {what} (choose from {', '.join(offered)})",
            _did_you_mean(str(value), offered) or "Use one of the values listed.",
        )

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras and not self._subparsers:
            # A command's own parser: what it does not know, it names (the top parser
            # would only say "unrecognized arguments", without knowing whose).
            options = [o for o in self._option_string_actions if o.startswith("--")]
            word = extras[0]
            guess = _did_you_mean(word.split("=", 1)[0], options) if word[:1] == "-" else None
            kind = "option" if word[:1] == "-" else "argument"
            self.error(f"unrecognized {kind} {word!r}", guess)
        return parsed, extras


def _did_you_mean(word: str, candidates: Iterable[str]) -> str | None:
    """``did you mean 'X'?`` for the candidate closest to ``word``, or None."""
    names = list(candidates)
    close = difflib.get_close_matches(word, names, n=1, cutoff=0.6)
    if not close and len(word.lstrip("-")) >= 3:
        # A prefix counts too: "dest" for "destinations", "--all" for "--all-tenants".
        close = [n for n in names if n.startswith(word)][:1]
    return f"did you mean {close[0]!r}?" if close else None


def build_parser() -> argparse.ArgumentParser:
    base = HeraldParser(add_help=False)
    base.add_argument(
        "--config", type=Path, help="TOML config file (default: none, built-in defaults)"
    )
    common = HeraldParser(add_help=False, parents=[base])
    common.add_argument(
        "--verbose",
        action="store_true",
        help="also print the command's informational log lines on stderr",
    )
    scoped = HeraldParser(add_help=False, parents=[common])
    scoped.add_argument(
        "--tenant", default=DEFAULT_TENANT, help="tenant to act for (default: %(default)s)"
    )
    scoped.add_argument("--json", action="store_true", help="print the API's JSON representation")
    # Operators' listings may look across tenants.
    everyone = HeraldParser(add_help=False)
    everyone.add_argument(
        "--all-tenants", action="store_true", help="every tenant's, not only --tenant's"
    )

    parser = HeraldParser(
        prog="herald",
        description="Herald event delivery engine: run the daemon, manage destinations,"
        " follow deliveries and replay them. Every command takes --config; settings can"
        " also come from HERALD_<SECTION>__<KEY> environment variables.",
        epilog="Run 'herald COMMAND --help' for a command's options and an example.",
    )
    parser.add_argument("--version", action="version", version=f"herald {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    command = functools.partial(_command, sub)

    command("run", [base], "run the daemon", ["herald run --config /etc/herald/herald.toml"])
    # Started by `herald run` when delivery.worker_processes > 1; not for direct use. No
    # help= at all: that keeps it out of the list (help=SUPPRESS prints "==SUPPRESS==").
    sub.add_parser("worker", parents=[base])
    command(
        "migrate",
        [common],
        "create or upgrade the schema and exit (herald run does it too)",
        ["herald migrate --config /etc/herald/herald.toml"],
    )
    check = command(
        "check-config",
        [common],
        "run every start-up check of `run` and print the effective config",
        ["herald check-config --config /etc/herald/herald.toml --check-db"],
        description=(
            "Validate the config file and HERALD_… environment as `herald run` would, print"
            " the effective config (secrets masked), where the encryption key comes from,"
            " the retry schedule and a verdict. Changes nothing. Exit status 2 on a"
            " config error, 1 when --check-db cannot reach the database."
        ),
    )
    check.add_argument(
        "--check-db",
        action="store_true",
        help="also connect to the database and compare its schema with this version's",
    )
    check.add_argument("--json", action="store_true", help="one JSON object instead of text")

    emit = command(
        "emit",
        [scoped],
        "write one event into the outbox (as a producer's transaction would)",
        [
            'herald emit order.paid --data \'{"order_id": "ord_1"}\'',
            "herald emit order.paid --data @event.json",
        ],
    )
    emit.add_argument("type", help="the event type, e.g. order.paid")
    emit.add_argument("--data", required=True, help="JSON object, or @file.json")
    emit.add_argument("--id", help="event id (evt_…); generated when absent")
    emit.add_argument("--created-at", help="RFC 3339 timestamp (default: now)")
    emit.add_argument(
        "--traceparent",
        help="the producer's W3C trace context, sent on to the receivers"
        " (an invalid one is dropped with a warning)",
    )
    emit.add_argument(
        "--ordering-key",
        help="the event's ordering key: a destination with ordering 'key' gets the events"
        " of one key one at a time, in order (docs/ordering.md)",
    )

    keys = _group(sub, "keys", "API keys and operator keys; rotate the encryption key")
    command = functools.partial(_command, keys)
    kinded = HeraldParser(add_help=False, parents=[scoped])
    kinded.add_argument(
        "--operator",
        action="store_true",
        help="operator keys (sk_op_…, for the web console) instead of a tenant's API keys",
    )
    command(
        "create",
        [kinded],
        "print a new sk_live_ (or, with --operator, sk_op_) key once",
        ["herald keys create --tenant acme", "herald keys create --operator"],
    )
    command(
        "list",
        [kinded],
        "the tenant's keys, or the operator keys (id, last characters)",
        ["herald keys list", "herald keys list --operator"],
    )
    command(
        "revoke",
        [kinded],
        "revoke a key: its id from 'keys list', or the key",
        ["herald keys revoke key_01j…"],
    ).add_argument("key", help="the key's id (key_…) or the key itself")
    rot = command(
        "rotate-encryption",
        [common],
        "re-encrypt every destination's credentials under a new encryption key",
        ["herald keys rotate-encryption --new-key-file /etc/herald/new.key"],
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

    dests = _group(sub, "destinations", "event destinations: create, list, show, change, test")
    command = functools.partial(_command, dests)
    dl = command(
        "list",
        [scoped],
        "the tenant's destinations",
        ["herald destinations list --status active", "herald destinations list --type aws_sqs"],
    )
    dl.add_argument(
        "--status", choices=[s.value for s in DestinationStatus], help="only this status"
    )
    dl.add_argument("--type", help="destination type, e.g. webhook")
    dl.add_argument("--limit", type=int, default=100, help="at most (default: %(default)s)")
    dc = command(
        "create",
        [scoped],
        "create a destination from the API's JSON body; it starts pending_verification",
        [
            'herald destinations create --data \'{"name": "orders", "type": "webhook",'
            ' "events": ["order.*"], "webhook": {"url": "https://example.com/hooks"}}\'',
            "herald destinations create --data @destination.json",
        ],
    )
    dc.add_argument("--data", required=True, help="the API's JSON body, or @file.json")
    # The commands on one destination, by id: (name, help, what follows the id in the example).
    by_id: dict[str, argparse.ArgumentParser] = {}
    for action, text, example in (
        ("show", "the whole destination: target, events, status (credentials masked)", ""),
        ("delete", "delete the destination; its pending deliveries end as failure", ""),
        ("verify", "send a new verification ping (a destination becomes active on success)", ""),
        ("test", "send a test.ping now and show the attempt", ""),
        (
            "test-filter",
            "which of the newest events of its types pass a payload filter (its own by default)",
            ' --data \'{"filter": {"data": {"amount": {"$gte": 100}}}}\'',
        ),
        (
            "update",
            "change name, events, status or config (the API's PATCH body)",
            ' --data \'{"status": "inactive"}\'',
        ),
        (
            "rotate-secret",
            "a new webhook signing secret, shown once; the old one signs for 24 h more",
            "",
        ),
    ):
        by_id[action] = command(
            action, [scoped], text, [f"herald destinations {action} evtd_…{example}"]
        )
        by_id[action].add_argument("id", help="the destination's id (evtd_…)")
    by_id["update"].add_argument("--data", required=True, help="the API's JSON body, or @file.json")
    by_id["test-filter"].add_argument(
        "--data", help='the API\'s JSON body ({"filter": …}), or @file.json; none: its own filter'
    )
    by_id["rotate-secret"].add_argument(
        "--secret", help="the new whsec_ secret (default: generate one)"
    )

    types = _group(sub, "event-types", "the event-type catalog: descriptions and JSON Schemas")
    command = functools.partial(_command, types)
    tl = command(
        "list",
        [scoped],
        "the tenant's event types in type order, Herald's own among them",
        ["herald event-types list --tenant acme"],
    )
    tl.add_argument("--limit", type=int, default=100, help="at most (default: %(default)s)")
    command(
        "show",
        [scoped],
        "one event type: its description and schema",
        ["herald event-types show order.paid"],
    ).add_argument("type", help="the event type")
    tp = command(
        "put",
        [scoped],
        "create or replace an event type (the API's PUT body: description, schema)",
        [
            'herald event-types put order.paid --data \'{"description": "An order was paid.",'
            ' "schema": {"type": "object", "required": ["order_id"]}}\'',
            "herald event-types put order.paid --data @order.paid.json",
        ],
    )
    tp.add_argument("type", help="the event type")
    tp.add_argument("--data", required=True, help="the API's JSON body, or @file.json")
    command(
        "delete",
        [scoped],
        "remove an event type from the catalog (its events are no longer checked)",
        ["herald event-types delete order.paid"],
    ).add_argument("type", help="the event type")

    deliveries = _group(sub, "deliveries", "event deliveries: list and show, with their attempts")
    command = functools.partial(_command, deliveries)
    dlist = command(
        "list",
        [scoped, everyone],
        "deliveries, newest first, filtered",
        [
            "herald deliveries list --status failure --since 1h",
            "herald deliveries list --all-tenants --destination evtd_…",
        ],
    )
    _filter_args(dlist)
    dlist.add_argument("--limit", type=int, default=50, help="at most (default: %(default)s)")
    command(
        "show",
        [scoped, everyone],
        "one delivery: the event, every attempt with its full error and response",
        ["herald deliveries show dlv_…"],
    ).add_argument("id", help="the delivery's id (dlv_…)")

    replay = _command(
        sub,
        "replay",
        [scoped, everyone],
        "re-queue the deliveries that match the filter as one replay (rpl_…)",
        [
            "herald replay --status failure --since 1d --dry-run",
            "herald replay --status failure --since 1h --follow",
            "herald replay --status failure --since 1d --all-tenants",
            "herald replay --delivery dlv_… --delivery dlv_…",
        ],
    )
    _filter_args(replay)
    replay.add_argument("--delivery", action="append", help="a delivery id (repeatable)")
    replay.add_argument("--ids-file", help="file with one delivery id per line")
    replay.add_argument("--dry-run", action="store_true", help="count and show a sample only")
    replay.add_argument(
        "--follow",
        action="store_true",
        help="then wait until none of its deliveries is pending, showing how they turn out;"
        " exit status 1 if any failed",
    )
    replay.add_argument(
        "--rate",
        type=float,
        help="deliveries made due per second (default: delivery.replay_rate_per_second; 0: all)",
    )

    replays = _group(sub, "replays", "replays: each one's deliveries counted by outcome now")
    command = functools.partial(_command, replays)
    command(
        "show",
        [scoped, everyone],
        "a replay and how its deliveries have turned out: succeeded, failed, pending",
        ["herald replays show rpl_…", "herald replays show rpl_… --all-tenants --json"],
    ).add_argument("id", help="the replay's id (rpl_…)")
    rlist = command(
        "list",
        [scoped, everyone],
        "replays, newest first (with --all-tenants: operator-wide ones too)",
        ["herald replays list --all-tenants --limit 10"],
    )
    rlist.add_argument("--limit", type=int, default=50, help="at most (default: %(default)s)")

    outbox = _group(sub, "outbox", "the outbox: rejected rows, outbox sources, a source's table")
    rej = _command(
        outbox,
        "rejected",
        [scoped, everyone],
        "rows the relay rejected, newest first, with the reason",
        ["herald outbox rejected --all-tenants --limit 20"],
    )
    rej.add_argument("--limit", type=int, default=50, help="at most (default: %(default)s)")
    srcs = _command(
        outbox,
        "sources",
        [common],
        "the outbox sources ([[outbox.sources]]): reachable or why not, rows waiting, lag",
        ["herald outbox sources --json"],
    )
    srcs.add_argument("--json", action="store_true", help="print JSON")
    schema = _command(
        outbox,
        "schema",
        [common],
        "the outbox table (and PostgreSQL's wake-up trigger) to create in a producer's database",
        ["herald outbox schema --dialect mysql", "herald outbox schema --dialect postgresql"],
    )
    schema.add_argument(
        "--dialect",
        required=True,
        choices=["postgresql", "mysql", "sqlite"],
        help="the producer's database",
    )
    schema.add_argument(
        "--table", default="herald_outbox", help="the table's name (default: %(default)s)"
    )

    inst = _command(
        sub,
        "instances",
        [common],
        "running instances on this database and their heartbeats",
        ["herald instances --json"],
    )
    inst.add_argument("--json", action="store_true", help="print JSON")
    return parser


def _command(
    sub: Any,
    name: str,
    parents: list[argparse.ArgumentParser],
    help: str,
    examples: list[str],
    *,
    description: str | None = None,
) -> argparse.ArgumentParser:
    """A command with its help line, a description and examples under --help."""
    parser: argparse.ArgumentParser = sub.add_parser(
        name,
        parents=parents,
        help=help,
        description=description or help[0].upper() + help[1:] + ".",
        epilog="example" + ("s" if len(examples) > 1 else "") + ":\n  " + "\n  ".join(examples),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return parser


def _group(sub: Any, name: str, help: str) -> Any:
    """A command whose actions are sub-commands."""
    parser = sub.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".")
    return parser.add_subparsers(dest="action", required=True, metavar="ACTION")


def _filter_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--destination", help="destination id")
    p.add_argument("--status", choices=[s.value for s in DeliveryStatus], help="only this status")
    p.add_argument("--event-type", action="append", help="event type (repeatable)")
    p.add_argument("--since", help="created at or after: timestamp or duration ago (2h)")
    p.add_argument("--until", help="created before: timestamp or duration ago")
