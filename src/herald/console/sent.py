"""What one attempt sent and got back, as the delivery page shows it: the request's
line and headers as recorded (``Exchange``), the body rebuilt from the stored event,
the response's status, headers and excerpt, and the request as a ``curl`` command.

The record never holds a credential (the adapter masked them before noting), so the
command carries the mask where one was: it says so, and the reader fills it in."""

from __future__ import annotations

import shlex
from typing import Any

from herald.adapters.base import MASK
from herald.model import Attempt

CURL_BODY_BYTES = 64 * 1024
"""A larger body is left out of the command (``--data-binary @envelope.json``)."""
CURL_SKIPPED = frozenset({"host", "content-length"})
"""Headers curl sets itself from the URL and the body."""


def curl_command(method: str, url: str, headers: Any, body: bytes | None) -> str:
    """The request as one ``curl`` command, each part quoted for a POSIX shell; the body
    byte for byte (``--data-binary``), so that a signature over it still verifies."""
    lines = [f"curl -X {method} {shlex.quote(url)}"]
    lines += [
        f"-H {shlex.quote(f'{name}: {value}')}"
        for name, value in headers
        if name.lower() not in CURL_SKIPPED
    ]
    if body is not None:
        if len(body) <= CURL_BODY_BYTES:
            lines.append(f"--data-binary {shlex.quote(body.decode(errors='replace'))}")
        else:
            lines.append("--data-binary @envelope.json")
    return " \\\n  ".join(lines)


def sent_view(a: Attempt, body: bytes | None) -> dict[str, Any]:
    """One attempt's exchange for the page (``recorded`` False: there is none to show,
    because the type sends no HTTP request or the attempt predates the record)."""
    ex = a.exchange_parsed()
    if ex is None:
        return {"number": a.number, "recorded": False}
    return {
        "number": a.number,
        "recorded": True,
        "method": ex.method,
        "url": ex.url,
        "request_headers": ex.request_headers,
        "masked": any(value == MASK for _, value in ex.request_headers),
        "response_status": a.response_status,
        "response_headers": ex.response_headers,
        "omitted": ex.omitted,
        "excerpt": a.response_excerpt,
        "error": a.error,
        "body_bytes": None if body is None else len(body),
        "curl": curl_command(ex.method, ex.url, ex.request_headers, body),
        "curl_cut": body is not None and len(body) > CURL_BODY_BYTES,
    }
