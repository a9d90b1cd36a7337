"""What the CLI prints cannot drive the operator's terminal."""

from __future__ import annotations

import json
import re

import pytest

from herald.cli.output import dest_rows, print_delivery, print_json, print_verification, table

HOSTILE = "\u001b]0;PWNED\u0007"
"""An OSC sequence: it retitles a terminal that prints it raw."""

RAW_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")  # all but the line feeds


def test_a_destination_table_shows_control_characters_escaped(
    capsys: pytest.CaptureFixture[str],
) -> None:
    dest_rows(
        [
            {
                "id": "evtd_1",
                "name": HOSTILE,
                "type": "webhook",
                "status": "active",
                "verification": {"state": "verified"},
                "events": ["*"],
                "created_at": "2026-11-25T00:00:00Z",
            },
            {
                "id": "evtd_2",
                "name": "two\nlines\r\u009b2J",
                "type": "webhook",
                "status": "active",
                "verification": {"state": "verified"},
                "events": ["*"],
                "created_at": "2026-11-25T00:00:00Z",
            },
        ]
    )
    out = capsys.readouterr().out
    assert RAW_CONTROL.search(out) is None, repr(out)
    assert len(out.splitlines()) == 3  # the header and one line per destination
    assert "\\x1b]0;PWNED\\x07" in out
    assert "two\\nlines\\r\\x9b2J" in out


def test_show_and_the_attempts_table_escape_ids_and_errors(
    capsys: pytest.CaptureFixture[str],
) -> None:
    print_delivery(
        {
            "id": "dlv_1",
            "event_id": "evt_x\r\nX-Injected: yes",
            "event_type": "a.b",
            "destination_id": "evtd_1",
            "status": "pending",
            "attempt_count": 1,
            "next_attempt_at": None,
            "created_at": "2026-11-25T00:00:00Z",
            "attempts": [
                {
                    "number": 1,
                    "started_at": "2026-11-25T00:00:00Z",
                    "duration_ms": 1.0,
                    "outcome": "failure_permanent",
                    "response_status": None,
                    "error": f"receiver said {HOSTILE}",
                    "response_excerpt": f"<p>{HOSTILE}</p>",
                }
            ],
        },
        {"id": f"evt_{HOSTILE}", "data": {"note": HOSTILE}},
    )
    table([(HOSTILE,)], ("name",))
    out = capsys.readouterr().out
    assert RAW_CONTROL.search(out) is None, repr(out)
    assert "evt_x\\r\\nX-Injected: yes" in out


def test_json_output_escapes_del_and_c1_and_keeps_the_value(
    capsys: pytest.CaptureFixture[str],
) -> None:
    value = {"name": HOSTILE + "\x7f\u009b\u0085", "ok": "caf\u00e9"}
    print_json(value)
    out = capsys.readouterr().out
    assert RAW_CONTROL.search(out) is None, repr(out)
    assert json.loads(out) == value


def test_a_failed_verification_shows_its_error_escaped_and_how_to_redo_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    print_verification(
        {
            "id": "evtd_1",
            "verification": {
                "state": "failed",
                "failed_at": "2026-11-25T00:00:00.000000Z",
                "last_error": HOSTILE,
                "reverify": "POST /v2/event-destinations/evtd_1/verify",
            },
        }
    )
    out = capsys.readouterr().out
    assert RAW_CONTROL.search(out) is None, repr(out)
    assert "verification: failed" in out
    assert "herald destinations verify evtd_1" in out
    print_verification({"id": "evtd_2", "verification": {"state": "verified"}})
    assert capsys.readouterr().out == ""
