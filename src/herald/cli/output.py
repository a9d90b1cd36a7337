"""How commands print: indented JSON for ``--json``, aligned tables otherwise."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import orjson


def print_json(obj: Any) -> None:
    sys.stdout.write(orjson.dumps(obj, option=orjson.OPT_INDENT_2).decode() + "\n")


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> None:
    cells = [[("-" if c is None else str(c)) for c in row] for row in rows]
    widths = [
        max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)
    ]
    print("  ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip())
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def short_ts(value: str | None) -> str | None:
    return None if value is None else value[:19].replace("T", " ")


def dest_rows(views: list[dict[str, Any]]) -> None:
    table(
        [
            (
                v["id"],
                v["name"],
                v["type"],
                v["status"],
                ",".join(v["events"]),
                short_ts(v["created_at"]),
            )
            for v in views
        ],
        ("id", "name", "type", "status", "events", "created"),
    )


def print_delivery(v: dict[str, Any]) -> None:
    for key in (
        "id",
        "event_id",
        "event_type",
        "destination_id",
        "status",
        "attempt_count",
        "next_attempt_at",
        "created_at",
    ):
        print(f"{key:16} {v[key] if v[key] is not None else '-'}")
    attempts = v.get("attempts") or []
    if attempts:
        print()
        table(
            [
                (
                    a["number"],
                    short_ts(a["started_at"]),
                    a["duration_ms"],
                    a["outcome"],
                    a["response_status"],
                    (a["error"] or "")[:60],
                )
                for a in attempts
            ],
            ("attempt", "started", "ms", "outcome", "status", "error"),
        )
