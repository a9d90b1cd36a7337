"""Strict parsing of API request bodies: one clear 400 for each way JSON can be hostile.

orjson parses (and rejects bad syntax, lone surrogates, NaN and a UTF-8 BOM); on top
of it a body must be UTF-8, nest at most :data:`MAX_DEPTH` levels, hold no NUL
character (PostgreSQL cannot store one, and no field of the API needs it) and repeat
no key within an object (orjson would silently keep the last value, so two readers of
the same body could disagree on what it says). The duplicate scan re-reads the body
with the standard library's ``object_pairs_hook``; request bodies are small and
bounded by ``api.max_body_bytes``, and the delivery path never comes through here.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from herald.errors import BadRequest

__all__ = ["MAX_DEPTH", "parse_body"]

MAX_DEPTH = 64
"""Deepest nesting of arrays and objects a body may have (the body object is level 1)."""


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_pairs(pairs: list[tuple[str, Any]]) -> None:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise _DuplicateKey(key)
        seen.add(key)


def parse_body(raw: bytes) -> Any:
    """Parse a request body, or raise BadRequest with a code naming what is wrong.

    Codes: ``invalid_encoding`` (not UTF-8), ``invalid_json``, ``json_too_deep``,
    ``invalid_character`` (a NUL), ``duplicate_key``.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(
            f"the body is not valid UTF-8: byte 0x{raw[exc.start]:02x} at offset {exc.start}",
            code="invalid_encoding",
        ) from None
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if "depth" in str(exc) or "recursion" in str(exc):
            raise _too_deep() from None
        raise BadRequest(f"the body is not valid JSON: {exc}", code="invalid_json") from None
    _check_tree(data)
    try:
        # Safe from RecursionError: the tree is at most MAX_DEPTH deep by now.
        json.loads(text, object_pairs_hook=_unique_pairs)
    except _DuplicateKey as dup:
        raise BadRequest(
            f"the key {dup.key!r} appears more than once in one object",
            code="duplicate_key",
        ) from None
    return data


def _too_deep() -> BadRequest:
    return BadRequest(
        f"the body nests arrays and objects more than {MAX_DEPTH} levels deep",
        code="json_too_deep",
    )


def _check_tree(data: Any) -> None:
    """Depth and NUL checks without recursion (a hostile body must not blow the stack)."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            if depth > MAX_DEPTH:
                raise _too_deep()
            for key, value in node.items():
                _check_text(key)
                stack.append((value, depth + 1))
        elif isinstance(node, list):
            if depth > MAX_DEPTH:
                raise _too_deep()
            stack.extend((value, depth + 1) for value in node)
        elif isinstance(node, str):
            _check_text(node)


def _check_text(text: str) -> None:
    if "\x00" in text:
        raise BadRequest(
            "the body contains a NUL character (\\u0000), which Herald does not accept",
            code="invalid_character",
        )
