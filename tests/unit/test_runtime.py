"""Process-wide settings: the debug switch the hot paths read, the GC tuning."""

from __future__ import annotations

import gc
import io
from collections.abc import Iterator

import orjson
import pytest
import structlog

from herald import logs
from herald.gctune import YOUNG_THRESHOLD, settle_after_startup


@pytest.fixture
def restore_logging() -> Iterator[None]:
    yield
    structlog.reset_defaults()
    logs._debug = False


def test_debug_switch_follows_the_configured_and_reloaded_level(restore_logging: None) -> None:
    out = io.StringIO()
    logs.configure(level="info", fmt="json", stream=out)
    assert not logs.debug_enabled()
    logs.set_level("debug")  # SIGHUP
    assert logs.debug_enabled()
    structlog.get_logger("t").debug("seen")
    logs.set_level("warning")
    assert not logs.debug_enabled()
    structlog.get_logger("t").debug("unseen")
    assert [orjson.loads(line)["event"] for line in out.getvalue().splitlines()] == ["seen"]


def test_gc_settles_after_startup() -> None:
    before = gc.get_threshold()
    try:
        garbage: list[object] = []
        garbage.append(garbage)  # a cycle, collected before the freeze
        del garbage
        settle_after_startup()
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (YOUNG_THRESHOLD, before[1], before[2])
        assert gc.isenabled()
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
