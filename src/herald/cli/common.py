"""What the commands share: exit statuses, the usage error, and reading their input
(``--data`` bodies, times, delivery filters, who runs them)."""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from pathlib import Path
from typing import Any

import orjson

from herald import timeutil
from herald.errors import BadRequest, HeraldError
from herald.model import DeliveryFilter, DeliveryStatus

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class UsageError(HeraldError, code="usage"):
    """The command's arguments do not make sense (exit status 2)."""


def parse_when(value: str) -> float:
    """``--since``/``--until``: :func:`herald.timeutil.parse_when`, as a usage error."""
    try:
        return timeutil.parse_when(value)
    except ValueError as exc:
        raise UsageError(str(exc), code="timestamp_invalid") from exc


def read_body(value: str) -> Any:
    """``--data``: inline JSON, or ``@path`` to read it from a file (``@-`` for stdin)."""
    text: str | bytes = value
    if value.startswith("@"):
        name = value[1:]
        try:
            text = sys.stdin.buffer.read() if name == "-" else Path(name).read_bytes()
        except OSError as exc:
            raise UsageError(f"cannot read {name}: {exc.strerror}") from exc
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(
            f"--data is not valid JSON: {exc}",
            code="invalid_json",
            hint="Give --data one well-formed JSON value inline, or @file.json to read a file.",
        ) from exc


def json_object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadRequest("--data must be a JSON object")
    return body


def delivery_filter(args: argparse.Namespace, *, tenant: str | None) -> DeliveryFilter:
    ids: list[str] = list(getattr(args, "delivery", None) or [])
    if getattr(args, "ids_file", None):
        try:
            text = Path(args.ids_file).read_text()
        except OSError as exc:
            raise UsageError(f"cannot read {args.ids_file}: {exc.strerror}") from exc
        ids.extend(line.strip() for line in text.splitlines() if line.strip())
    return DeliveryFilter(
        tenant_id=tenant,
        destination_id=args.destination,
        status=DeliveryStatus(args.status) if args.status else None,
        event_types=tuple(args.event_type or ()),
        since=parse_when(args.since) if args.since else None,
        until=parse_when(args.until) if args.until else None,
        ids=tuple(ids),
    )


def os_user() -> str:
    """Who runs this command, for the audit lines. A container's uid often has no passwd
    entry, where getpass.getuser() raises: the uid stands in."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.getuid()}"
