"""Opaque pagination cursors, signed and bound to an endpoint and its filters.

A cursor carries the id of the last record of a page (lists are newest first
and ids are time-ordered, so "ids below it" is the next page). It is
HMAC-signed, so a tampered cursor, one from another endpoint or another filter
combination, is refused with ``cursor_invalid``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass

import orjson

from herald.errors import BadRequest


@dataclass(frozen=True, slots=True)
class Pages:
    """One list request's paging: ``after``, the key its page starts after (None: the
    first page), and the scope (endpoint and filters) its cursor was checked against.
    The next page's cursor is made in the same scope, so the cursor a list hands out
    is always one it takes back."""

    codec: CursorCodec
    endpoint: str
    filters: Mapping[str, object]
    after: str | None

    def cursor(self, last_key: str) -> str:
        """The cursor of the page after the one whose last record is ``last_key``."""
        return self.codec.encode(last_key, endpoint=self.endpoint, filters=self.filters)


class CursorCodec:
    def __init__(self, key: bytes) -> None:
        self._key = hmac.new(key, b"herald-pagination-cursor", hashlib.sha256).digest()

    @staticmethod
    def _scope(endpoint: str, filters: Mapping[str, object]) -> str:
        canonical = orjson.dumps(dict(filters), option=orjson.OPT_SORT_KEYS)
        return endpoint + "|" + hashlib.sha256(canonical).hexdigest()[:16]

    def _sign(self, payload: bytes) -> bytes:
        return hmac.new(self._key, payload, hashlib.sha256).digest()[:16]

    def pages(self, cursor: str | None, *, endpoint: str, filters: Mapping[str, object]) -> Pages:
        """A list request's :class:`Pages` from its ``cursor`` (None: the first page)."""
        after = None if cursor is None else self.decode(cursor, endpoint=endpoint, filters=filters)
        return Pages(self, endpoint, filters, after)

    def encode(self, last_id: str, *, endpoint: str, filters: Mapping[str, object]) -> str:
        payload = orjson.dumps({"k": last_id, "s": self._scope(endpoint, filters)})
        raw = payload + self._sign(payload)
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    def decode(self, cursor: str, *, endpoint: str, filters: Mapping[str, object]) -> str:
        """The last id the cursor points after; BadRequest ``cursor_invalid`` otherwise."""
        try:
            raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        except (binascii.Error, ValueError):
            raw = b""
        payload, sig = raw[:-16], raw[-16:]
        ok = len(raw) > 16 and hmac.compare_digest(sig, self._sign(payload))
        data: object = None
        if ok:
            try:
                data = orjson.loads(payload)
            except orjson.JSONDecodeError:
                ok = False
        if (
            not ok
            or not isinstance(data, dict)
            or data.get("s") != self._scope(endpoint, filters)
            or not isinstance(data.get("k"), str)
        ):
            raise BadRequest(
                "the cursor is not valid for this list and filters; restart from the first page",
                field="cursor",
                code="cursor_invalid",
            )
        return str(data["k"])
