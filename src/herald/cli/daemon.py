"""``herald run``, and ``herald worker``, the attempt processes it forks."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import sys
from collections.abc import Callable, Iterator

from herald.config import Settings
from herald.errors import ConfigError


def cmd_worker(settings: Settings, args: argparse.Namespace) -> int:
    from herald.logs import configure
    from herald.wiring import components
    from herald.workers import serve_worker

    # stdout carries the attempt records to the parent: log lines go to stderr.
    configure(level=settings.log.level, fmt=settings.log.format, stream=sys.stderr)
    with _traced(settings), asyncio.Runner(loop_factory=_loop_factory()) as runner:
        return runner.run(serve_worker(components(settings)))


@contextlib.contextmanager
def _traced(settings: Settings) -> Iterator[None]:
    """Spans exported for this process while it runs (herald.tracing); after a fork,
    since the exporter runs a thread."""
    from herald import tracing

    try:
        tracing.configure(
            endpoint=settings.tracing.otlp_endpoint, service_name=settings.tracing.service_name
        )
    except tracing.TracingUnavailable as exc:
        raise ConfigError(str(exc), field="tracing.otlp_endpoint") from exc
    try:
        yield
    finally:
        tracing.shutdown()


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency where it builds
        return None
    return uvloop.new_event_loop


def cmd_run(settings: Settings, args: argparse.Namespace) -> int:
    from herald.app import Daemon
    from herald.logs import configure
    from herald.workers import fork_workers

    configure(level=settings.log.level, fmt=settings.log.format)
    forked = None
    if settings.delivery.worker_processes > 1:
        # Now, with everything imported and before any loop or thread exists.
        forked = fork_workers(
            settings.delivery.worker_processes, functools.partial(cmd_worker, settings, args)
        )
    with _traced(settings), asyncio.Runner(loop_factory=_loop_factory()) as runner:
        return runner.run(Daemon(settings, config_path=args.config, forked=forked).run())
