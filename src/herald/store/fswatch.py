"""Wait, without polling, until one of a few files in a directory is written.

The SQLite relay uses it to sleep while nobody writes to the database: a commit
from any process appends to the ``-wal`` file (or rewrites the database in
rollback-journal mode), and Linux's inotify reports that write. Where inotify is
missing (another OS, no watches left, a directory it cannot watch) ``open`` gives
None and the caller keeps polling.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any


class FileWatch:
    """An inotify watch on ``directory`` for writes to the files named ``names``."""

    def __init__(self, inotify: Any, names: Iterable[str]) -> None:
        self._inotify = inotify
        self._names = frozenset(names)

    @classmethod
    def open(cls, directory: Path, names: Iterable[str]) -> FileWatch | None:
        if not sys.platform.startswith("linux"):
            return None
        try:
            from inotify_simple import INotify, flags
        except ImportError:  # pragma: no cover - a dependency on Linux
            return None
        try:
            inotify = INotify(nonblocking=True)
        except OSError:  # the per-user limit of inotify instances
            return None
        try:
            inotify.add_watch(directory, flags.MODIFY | flags.CREATE | flags.MOVED_TO)
        except OSError:  # no watches left, or no such directory
            inotify.close()
            return None
        return cls(inotify, names)

    def close(self) -> None:
        self._inotify.close()

    def _written(self) -> bool | None:
        """Read what is queued: True if a watched file was written, None if the watch
        is gone (its directory removed or unmounted), else False."""
        from inotify_simple import flags

        written = False
        for event in self._inotify.read(timeout=0):
            if event.mask & flags.IGNORED:
                return None
            # An overflowed queue lost events: one of them may have been ours.
            if event.mask & flags.Q_OVERFLOW or event.name in self._names:
                written = True
        return written

    async def written(self) -> bool:
        """Return once a watched file has been written since the last return (at once
        if that already happened); False when the watch has ended for good."""
        loop = asyncio.get_running_loop()
        fd = self._inotify.fileno()
        while True:
            state = self._written()
            if state is None:
                return False
            if state:
                return True
            readable: asyncio.Future[None] = loop.create_future()
            loop.add_reader(fd, _resolve, readable)
            try:
                await readable
            finally:
                loop.remove_reader(fd)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
