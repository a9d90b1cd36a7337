"""The ``herald`` command line: the daemon, and the API's operations for ops at a shell.

Exit status: 0 success, 1 the operation failed, 2 bad usage or bad input.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, NoReturn

import argcomplete
import structlog

from herald.cli.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, UsageError
from herald.cli.output import visible
from herald.cli.parser import build_parser
from herald.config import Settings, load_settings
from herald.errors import BadRequest, ConfigError, HeraldError, ValidationError, advice
from herald.logs import configure as configure_logs
from herald.logs import json_enabled

__all__ = ["build_parser", "main"]

# Each command's module is imported when that command runs: a command to keys has
# no use for the daemon's web server and adapters, which were most of its time.
_COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("herald.cli.daemon", "cmd_run"),
    "worker": ("herald.cli.daemon", "cmd_worker"),
    "migrate": ("herald.cli.ops", "cmd_migrate"),
    "emit": ("herald.cli.resources", "cmd_emit"),
    "keys": ("herald.cli.keys", "cmd_keys"),
    "destinations": ("herald.cli.resources", "cmd_destinations"),
    "deliveries": ("herald.cli.resources", "cmd_deliveries"),
    "event-types": ("herald.cli.eventtypes", "cmd_event_types"),
    "replay": ("herald.cli.ops", "cmd_replay"),
    "replays": ("herald.cli.ops", "cmd_replays"),
    "outbox": ("herald.cli.sources", "cmd_outbox"),
    "instances": ("herald.cli.ops", "cmd_instances"),
    "check-config": ("herald.cli.ops", "cmd_check_config"),
}
"""Each command's module and function. ``run`` and ``worker`` return an exit status;
the others are coroutines, run here."""


def _command(name: str) -> Callable[[Settings, argparse.Namespace], Any]:
    module, function = _COMMANDS[name]
    found: Callable[[Settings, argparse.Namespace], Any] = getattr(
        importlib.import_module(module), function
    )
    return found


def _die(exc: HeraldError, code: int, *, daemon: bool = False, command: str = "herald") -> NoReturn:
    """Every problem of the input, one line each, then what to do about the first."""
    hint = advice(exc)
    if exc.code == "usage" and exc.hint is None:
        hint = f"Run {command!r} with --help."
    problems = [_with_field(problem) for problem in (exc, *exc.also)]
    if daemon and json_enabled():
        # The daemon's stderr is read by a log collector: its last line is JSON too.
        structlog.get_logger("herald").error(
            "herald_failed", error="; ".join(problems), hint=hint, exit_code=code
        )
        raise SystemExit(code)
    for problem in problems:
        print(f"herald: error: {visible(problem)}", file=sys.stderr)
    if hint:
        print(f"herald: hint: {hint}", file=sys.stderr)
    raise SystemExit(code)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    # Shell completion: answers and exits when the shell asks (_ARGCOMPLETE is set);
    # otherwise it does nothing. Enable with: eval "$(register-python-argcomplete herald)"
    argcomplete.autocomplete(parser)
    if not (sys.argv[1:] if argv is None else argv):
        parser.print_help()
        return EXIT_OK
    args = parser.parse_args(argv)
    daemon = args.command == "run"
    command = " ".join(["herald", args.command, *([args.action] if "action" in args else [])])
    try:
        settings = load_settings(args.config)
        if daemon or args.command == "worker":
            status: int = _command(args.command)(settings, args)
            return status
        # Commands print results on stdout. Their log lines go to stderr, and only what
        # went wrong and the audit trail unless --verbose: info lines on a terminal
        # would interleave with the output.
        configure_logs(
            level=settings.log.level,
            fmt=settings.log.format,
            stream=sys.stderr,
            quiet=not args.verbose,
        )
        body: Coroutine[Any, Any, int] = _command(args.command)(settings, args)
        return asyncio.run(body)
    except (ConfigError, ValidationError, BadRequest, UsageError) as exc:
        _die(exc, EXIT_USAGE, daemon=daemon, command=command)
    except HeraldError as exc:
        _die(exc, EXIT_FAILED, daemon=daemon, command=command)
    except KeyboardInterrupt:
        return 130


def _with_field(exc: HeraldError) -> str:
    if exc.field and exc.field not in exc.message:
        return f"{exc.field}: {exc.message}"
    return exc.message
