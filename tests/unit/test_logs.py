"""Log format: JSON lines by default, a console format on a TTY, and the level filter."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator

import pytest
import structlog

from herald import logs


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _restore() -> Iterator[None]:
    yield
    structlog.reset_defaults()
    logs.set_level("info")
    structlog.reset_defaults()


def test_json_lines_when_not_a_terminal() -> None:
    out = io.StringIO()
    logs.configure(level="info", fmt="auto", stream=out)
    structlog.get_logger("t").info("attempt_failed", delivery_id="dlv_1", attempt=2)
    [line] = out.getvalue().splitlines()
    record = json.loads(line)
    assert record["event"] == "attempt_failed"
    assert (record["delivery_id"], record["attempt"], record["level"]) == ("dlv_1", 2, "info")
    assert record["timestamp"].endswith("Z")


def test_console_format_on_a_terminal_and_json_when_asked() -> None:
    tty = Terminal()
    logs.configure(level="info", fmt="auto", stream=tty)
    structlog.get_logger("t").info("relay_listening", channel="herald_outbox")
    text = tty.getvalue()
    assert "relay_listening" in text
    assert "channel" in text
    with pytest.raises(json.JSONDecodeError):
        json.loads(text.splitlines()[0])

    forced = Terminal()
    logs.configure(level="info", fmt="json", stream=forced)
    structlog.get_logger("t").info("relay_listening")
    assert json.loads(forced.getvalue())["event"] == "relay_listening"


def test_level_filters_and_set_level_changes_it() -> None:
    out = io.StringIO()
    logs.configure(level="warning", fmt="json", stream=out)
    log = structlog.get_logger("t")
    log.info("hidden")
    log.warning("shown")
    assert not logs.debug_enabled()
    logs.set_level("debug")
    log.debug("now_shown")
    assert logs.debug_enabled()
    assert [json.loads(x)["event"] for x in out.getvalue().splitlines()] == ["shown", "now_shown"]
