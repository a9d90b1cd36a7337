"""Logging: every line through structlog, as JSON lines or a readable console format.

Herald's own lines are structlog's. Libraries log through the standard library
(aiohttp, aiobotocore/botocore, aio-pika/aiormq, grpc's Python side, azure, asyncio
itself): their records are routed into structlog's ``ProcessorFormatter`` and rendered
by the same renderer on the same stream, so in ``json`` mode every line a process
writes is one JSON object. Python warnings, uncaught exceptions and grpc's C core
(which writes to the stream directly, and is silenced in ``json`` mode) are covered
too. Times are ISO 8601 UTC everywhere, including fields such as ``next_attempt_at``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import threading
from collections.abc import MutableMapping
from types import TracebackType
from typing import Any, TextIO

import orjson
import structlog

from herald.timeutil import format_epoch

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}

LIBRARY_FLOOR = logging.WARNING
"""Libraries' records below this level are dropped, even when Herald logs at debug:
some log every request at info (azure's HTTP policy), and aiosqlite's debug lines
carry every statement's parameters, event payloads included."""

_debug = False
_json = False
_handler: logging.Handler | None = None

ALWAYS = "_always"
"""A line's key that keeps it through a quiet configuration (the audit trail's lines);
it is removed before the line is written."""


def debug_enabled() -> bool:
    """Whether debug lines are written: hot paths check this before building one (a
    filtered structlog call still binds a logger, a few microseconds per call)."""
    return _debug


def json_enabled() -> bool:
    """Whether lines are JSON objects (a daemon's last words must be one too)."""
    return _json


def _dumps(obj: Any, default: Any = None) -> str:
    return orjson.dumps(obj, default=default or str).decode()


def iso_instants(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Fields named ``*_at`` that hold an epoch (``next_attempt_at=1795556469.14``) are
    written as ISO 8601 UTC, like the line's own timestamp."""
    for key, value in event_dict.items():
        if (
            key.endswith("_at")
            and isinstance(value, int | float)
            and not isinstance(value, bool)
            and 0 < value < 253402300800  # up to year 9999: else shown as it is
        ):
            event_dict[key] = format_epoch(float(value))
    return event_dict


def _library_name(
    _: Any, __: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    record = event_dict.get("_record")
    if record is not None:
        event_dict["logger"] = record.name
    return event_dict


def configure(
    *, level: str = "info", fmt: str = "auto", stream: TextIO | None = None, quiet: bool = False
) -> None:
    """Configure structlog and the standard library's logging once per process; every
    line goes to ``stream`` (stderr by default). ``quiet`` (the CLI's commands without
    ``--verbose``) keeps only warnings, errors and the lines marked :data:`ALWAYS`."""
    global _debug, _json, _handler
    _debug = level == "debug"
    out = stream or sys.stderr
    use_console = fmt == "console" or (fmt == "auto" and out.isatty())
    _json = not use_console
    shared: list[Any] = [
        functools.partial(_quiet, quiet),
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        iso_instants,
    ]
    renderer: Any
    if use_console:
        renderer = structlog.dev.ConsoleRenderer(colors=out.isatty())
    else:
        shared.append(structlog.processors.format_exc_info)
        renderer = structlog.processors.JSONRenderer(serializer=_dumps)
        # grpc's C core writes to stderr itself, in its own format: in JSON mode it
        # stays quiet unless the operator asked for it (its errors reach Herald anyway,
        # as the failed calls' exceptions).
        os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    structlog.configure(
        processors=[*shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[_library_name, *shared],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    if _handler is not None:
        root.removeHandler(_handler)
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    _handler = handler
    root.setLevel(_library_level(level))
    logging.captureWarnings(True)
    log = structlog.get_logger("herald")

    def uncaught(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        if issubclass(kind, KeyboardInterrupt):
            sys.__excepthook__(kind, exc, tb)
            return
        try:
            log.critical("uncaught_exception", exc_info=(kind, exc, tb))
        except Exception:  # the log's stream is gone (a process at exit, a closed pipe)
            with contextlib.suppress(Exception):
                sys.__excepthook__(kind, exc, tb)

    def uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
        if args.exc_value is None or isinstance(args.exc_value, SystemExit):
            return
        thread = args.thread.name if args.thread is not None else None
        log.error(
            "uncaught_exception",
            thread=thread,
            exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
        )

    sys.excepthook = uncaught
    threading.excepthook = uncaught_in_thread


def _quiet(
    quiet: bool, _: Any, method: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    always = event_dict.pop(ALWAYS, False)
    if quiet and not always and method in ("debug", "info"):
        raise structlog.DropEvent
    return event_dict


def _library_level(level: str) -> int:
    return max(_LEVELS[level], LIBRARY_FLOOR)


def set_level(level: str) -> None:
    """Change the level at run time (SIGHUP re-reads it from the config)."""
    global _debug
    _debug = level == "debug"
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]))
    logging.getLogger().setLevel(_library_level(level))
