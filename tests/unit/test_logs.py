"""Log format: JSON lines by default, a console format on a TTY, and the level filter."""

from __future__ import annotations

import io
import json
import logging
import sys
import warnings
from collections.abc import Iterator

import pytest
import structlog

from herald import logs


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _restore() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level, hook = list(root.handlers), root.level, sys.excepthook
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)
    sys.excepthook = hook
    logging.captureWarnings(False)
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


def lines(out: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_libraries_lines_are_json_on_the_same_stream() -> None:
    """aiormq, botocore, azure, asyncio log through the standard library: their records
    come out as JSON lines beside Herald's own, with the same time and level fields."""
    out = io.StringIO()
    logs.configure(level="info", fmt="json", stream=out)
    logging.getLogger("aiormq.connection").error("error when creating transport: %s", "refused")
    logging.getLogger("azure.core").info("every request at info")  # below the floor
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("asyncio").exception("Task exception was never retrieved")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("deprecated thing", DeprecationWarning, stacklevel=1)
    structlog.get_logger("herald").info("herald_line")
    aiormq, task, warned, own = lines(out)
    assert aiormq["event"] == "error when creating transport: refused"
    assert (aiormq["logger"], aiormq["level"]) == ("aiormq.connection", "error")
    assert str(aiormq["timestamp"]).endswith("Z")
    assert task["logger"] == "asyncio"
    assert "RuntimeError: boom" in str(task["exception"])
    assert warned["logger"] == "py.warnings"
    assert "deprecated thing" in str(warned["event"])
    assert own["event"] == "herald_line"


def test_library_lines_below_warning_are_dropped_even_at_debug() -> None:
    """aiosqlite's debug lines carry statements' parameters (event payloads)."""
    out = io.StringIO()
    logs.configure(level="debug", fmt="json", stream=out)
    logging.getLogger("aiosqlite").debug("operation with a payload")
    logging.getLogger("azure.core").info("every request")
    structlog.get_logger("herald").debug("herald_debug")
    assert [r["event"] for r in lines(out)] == ["herald_debug"]
    logs.set_level("error")
    logging.getLogger("aiormq").warning("hidden at error")
    assert len(lines(out)) == 1


def test_instants_are_iso_utc_not_epoch_floats() -> None:
    out = io.StringIO()
    logs.configure(level="info", fmt="json", stream=out)
    structlog.get_logger("t").info(
        "attempt_failed", next_attempt_at=1795556469.14, attempt=2, retry_in=0.5, seen_at=None
    )
    [record] = lines(out)
    assert record["next_attempt_at"] == "2026-11-24T21:41:09.140000Z"
    assert (record["attempt"], record["retry_in"], record["seen_at"]) == (2, 0.5, None)


def test_an_uncaught_exception_at_exit_with_the_log_closed_prints_no_hook_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A process at exit whose log stream is gone: the hook falls back to Python's own,
    never "Error in sys.excepthook" on top of the exception."""
    out = io.StringIO()
    logs.configure(level="info", fmt="json", stream=out)
    out.close()
    try:
        raise ValueError("at exit")
    except ValueError as exc:
        sys.excepthook(type(exc), exc, exc.__traceback__)
    err = capsys.readouterr().err
    assert "ValueError: at exit" in err
    assert "Error in sys.excepthook" not in err


def test_an_uncaught_exception_is_one_json_line() -> None:
    out = io.StringIO()
    logs.configure(level="info", fmt="json", stream=out)
    try:
        raise ValueError("nobody caught me")
    except ValueError as exc:
        sys.excepthook(type(exc), exc, exc.__traceback__)
    [record] = lines(out)
    assert (record["event"], record["level"]) == ("uncaught_exception", "critical")
    assert "ValueError: nobody caught me" in str(record["exception"])
