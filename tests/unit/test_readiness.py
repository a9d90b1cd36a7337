"""``/readyz``'s problems by component: the dispatcher under its own name, and under
its old one, ``workers``, for one release (README, Changes)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from herald.app import Daemon
from herald.config import Settings


class _Store:
    async def ping(self) -> None:
        return None

    async def schema_version(self) -> int:
        return 18


def _parts(*, dispatcher_running: bool, storage_error: str | None = None) -> Any:
    return SimpleNamespace(
        comp=SimpleNamespace(store=_Store()),
        relay=SimpleNamespace(running=True, storage_error=None),
        dispatcher=SimpleNamespace(running=dispatcher_running, storage_error=storage_error),
    )


async def test_a_stopped_dispatcher_is_named_and_its_old_label_kept() -> None:
    daemon = Daemon(Settings())
    problems = await daemon._problems(_parts(dispatcher_running=False), 18)
    assert problems == {"dispatcher": "not running", "workers": "not running"}


async def test_a_dispatcher_failing_its_database_is_named_and_its_old_label_kept() -> None:
    daemon = Daemon(Settings())
    problems = await daemon._problems(_parts(dispatcher_running=True, storage_error="gone"), 18)
    assert problems["dispatcher"] == problems["workers"] == "cannot use the database: gone"


async def test_a_working_dispatcher_is_no_problem() -> None:
    daemon = Daemon(Settings())
    assert await daemon._problems(_parts(dispatcher_running=True), 18) == {}
