"""``FileWatch``: the inotify wait behind the SQLite relay's idle sleep."""

from __future__ import annotations

import asyncio
import shutil
import sys
from pathlib import Path

import pytest

from herald.store.fswatch import FileWatch

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify")


@pytest.fixture
def watched(tmp_path: Path) -> FileWatch:
    watch = FileWatch.open(tmp_path, ("herald.db", "herald.db-wal"))
    assert watch is not None
    return watch


async def test_a_write_to_a_watched_file_ends_the_wait(tmp_path: Path, watched: FileWatch) -> None:
    waiting = asyncio.create_task(watched.written())
    await asyncio.sleep(0)
    assert not waiting.done()
    (tmp_path / "herald.db-wal").write_bytes(b"commit")
    assert await asyncio.wait_for(waiting, 5) is True
    watched.close()


async def test_a_write_made_before_the_wait_is_not_lost(tmp_path: Path, watched: FileWatch) -> None:
    (tmp_path / "herald.db").write_bytes(b"commit")
    assert await asyncio.wait_for(watched.written(), 5) is True
    watched.close()


async def test_other_files_in_the_directory_do_not_wake_it(
    tmp_path: Path, watched: FileWatch
) -> None:
    waiting = asyncio.create_task(watched.written())
    (tmp_path / "herald.log").write_bytes(b"noise")
    (tmp_path / "herald.db-shm").write_bytes(b"noise")
    # A bounded look for something that must not happen: the noise's events are
    # read (the file watch is readable at once) and the wait goes on.
    done, _ = await asyncio.wait({waiting}, timeout=0.3)
    assert not done
    (tmp_path / "herald.db-wal").write_bytes(b"commit")
    assert await asyncio.wait_for(waiting, 5) is True
    watched.close()


async def test_the_wait_ends_false_when_the_directory_goes(tmp_path: Path) -> None:
    gone = tmp_path / "data"
    gone.mkdir()
    watch = FileWatch.open(gone, ("herald.db",))
    assert watch is not None
    waiting = asyncio.create_task(watch.written())
    shutil.rmtree(gone)
    assert await asyncio.wait_for(waiting, 5) is False
    watch.close()


def test_no_watch_on_a_directory_that_does_not_exist(tmp_path: Path) -> None:
    assert FileWatch.open(tmp_path / "missing", ("herald.db",)) is None
