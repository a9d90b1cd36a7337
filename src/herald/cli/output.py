"""How commands print: indented JSON for ``--json``, aligned tables otherwise."""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from typing import Any

import orjson

from herald.ingest import CONTROL, FORMAT_CHARACTERS
from herald.views import attempt_said

_RAW_IN_JSON = re.compile(f"[\x7f-\x9f{FORMAT_CHARACTERS}]")
"""DEL, the C1 controls and the format characters, which JSON may carry unescaped
(orjson does)."""


def visible(text: str) -> str:
    """``text`` with its control characters (C0, DEL, C1) and format characters (bidi
    overrides, zero-width ones) escaped as ``\\x1b``, ``\\n``, ``\\u202e``: a name, an id
    or an error from the database cannot move the cursor, retitle the operator's
    terminal, forge an output line or show itself reversed."""
    return CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


def _json_escape(char: str) -> str:
    """``char`` as a JSON string escape (a surrogate pair beyond the BMP)."""
    code = ord(char)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def print_json(obj: Any) -> None:
    text = orjson.dumps(obj, option=orjson.OPT_INDENT_2).decode()
    # Only inside strings (JSON's own syntax is printable ASCII): escaped, the same value.
    text = _RAW_IN_JSON.sub(lambda m: _json_escape(m.group()), text)
    sys.stdout.write(text + "\n")


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> None:
    cells = [[("-" if c is None else visible(str(c))) for c in row] for row in rows]
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
                v["verification"]["state"],
                ",".join(v["events"]),
                short_ts(v["created_at"]),
            )
            for v in views
        ],
        ("id", "name", "type", "status", "verification", "events", "created"),
    )


def print_verification(v: dict[str, Any]) -> None:
    """Under one destination: a verification not done yet, and how to redo it."""
    ver = v["verification"]
    if ver["state"] == "verified":
        return
    print()
    print(f"verification: {ver['state']}")
    if ver["state"] == "failed":
        print(f"failed at:    {short_ts(ver['failed_at'])}")
        print(f"last error:   {visible(ver['last_error'] or '-')}")
    last = ver.get("last_attempt")
    if last is not None:
        said = attempt_said(last)
        print(f"last attempt: {short_ts(last['started_at'])}  {visible(said)}")
    elif "last_attempt" in ver:
        print("last attempt: none yet (the ping is queued)")
    print(f"re-verify:    herald destinations verify {v['id']}  (API: {ver['reverify']})")


def print_delivery(v: dict[str, Any], event: dict[str, Any] | None = None) -> None:
    """One delivery for people: its fields, the event it carries, every attempt in full."""
    for key in (
        "id",
        "tenant_id",
        "event_id",
        "event_type",
        "destination_id",
        "status",
        "attempt_count",
        "next_attempt_at",
        "created_at",
    ):
        if key in v:
            print(f"{key:16} {visible(str(v[key])) if v[key] is not None else '-'}")
    if event is not None:
        print("\nevent:")
        text = orjson.dumps(event, option=orjson.OPT_INDENT_2).decode()
        for line in text.splitlines():
            print(f"  {visible(line)}")
    attempts = v.get("attempts") or []
    if attempts:
        print("\nattempts:")
    for a in attempts:
        status = f"HTTP {a['response_status']}" if a["response_status"] is not None else ""
        print(
            f"  #{a['number']}  {short_ts(a['started_at'])}  {a['duration_ms']} ms"
            f"  {a['outcome']}  {status}".rstrip()
        )
        if a["error"]:
            print(f"      error:    {visible(a['error'])}")
        if a["response_excerpt"]:
            print(f"      response: {visible(a['response_excerpt'])}")


def print_health(v: dict[str, Any], rate: str) -> None:
    """Under one destination: how it has been answering (the recorder's counters)."""
    print(f"{'last success':12} {short_ts(v['last_success_at']) or '-'}")
    print(f"{'last failure':12} {short_ts(v['last_failure_at']) or '-'}")
    print(f"{'failure rate':12} {rate} over 24 h")


def print_destination(v: dict[str, Any]) -> None:
    """One destination for people: every field, the type's config with secrets masked."""
    for key in ("id", "name", "type", "status", "events", "created_at", "updated_at"):
        value = ", ".join(v[key]) if key == "events" else v[key]
        print(f"{key:12} {visible(str(value))}")
    if v.get("deleted"):
        print(f"{'deleted_at':12} {v['deleted_at']}")
    for field, value in (v.get(v["type"]) or {}).items():
        shown = value if isinstance(value, str) else orjson.dumps(value).decode()
        print(f"{v['type'] + '.' + field:12} {visible(shown)}")
    print_flow(v)


def print_flow(v: dict[str, Any]) -> None:
    """Under one destination: its rate limit and its circuit (docs/flow-control.md)."""
    rate = v.get("rate_limit_per_second")
    print(f"{'rate limit':12} {'-' if rate is None else f'{rate:g}/s'}")
    print(f"{'ordering':12} {v.get('ordering', 'none')}")
    circuit = v.get("circuit")
    if circuit is None:
        print(f"{'circuit':12} breaker off")
        return
    said = circuit["state"]
    if circuit["state"] != "closed":
        opened, probe = short_ts(circuit["opened_at"]), short_ts(circuit["next_probe_at"])
        said += f" since {opened}, next probe {probe}"
    print(f"{'circuit':12} {said}")
