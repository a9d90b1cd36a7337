"""structlog set-up: JSON lines to stdout, or a readable console format on a TTY."""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

import orjson
import structlog

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


_debug = False


def debug_enabled() -> bool:
    """Whether debug lines are written: hot paths check this before building one (a
    filtered structlog call still binds a logger, a few microseconds per call)."""
    return _debug


def _dumps(obj: Any, default: Any = None) -> str:
    return orjson.dumps(obj, default=default or str).decode()


def configure(*, level: str = "info", fmt: str = "auto", stream: TextIO | None = None) -> None:
    """Configure structlog (and stdlib logging of libraries) once per process."""
    global _debug
    _debug = level == "debug"
    out = stream or sys.stdout
    use_console = fmt == "console" or (fmt == "auto" and out.isatty())
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: Any
    if use_console:
        renderer = structlog.dev.ConsoleRenderer(colors=out.isatty())
    else:
        shared.append(structlog.processors.format_exc_info)
        renderer = structlog.processors.JSONRenderer(serializer=_dumps)
    structlog.configure(
        processors=[*shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )
    logging.basicConfig(level=max(_LEVELS[level], logging.WARNING), stream=sys.stderr, force=True)


def set_level(level: str) -> None:
    """Change the level at run time (SIGHUP re-reads it from the config)."""
    global _debug
    _debug = level == "debug"
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]))
