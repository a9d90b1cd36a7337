"""Prefixed, time-ordered identifiers in the ULID layout, lowercase Crockford base32."""

from __future__ import annotations

import os
import time

__all__ = ["ALPHABET", "id_timestamp", "is_valid_id", "new_id"]

ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"
_BODY_LEN = 26
_RANDOM_BITS = 80
_RANDOM_MAX = (1 << _RANDOM_BITS) - 1
_TIME_MAX = (1 << 48) - 1

# Every pair of characters is 10 bits; 48 time bits take 10 characters (two leading zero
# bits) and 80 random bits take 16, so both halves encode on pair boundaries.
_PAIRS = tuple(a + b for a in ALPHABET for b in ALPHABET)
# int(..., 32) reads digits 0-9a-v; map Crockford's letters onto those to decode in C.
_TO_BASE32HEX = str.maketrans(ALPHABET, "0123456789abcdefghijklmnopqrstuv")
_ALPHABET_SET = frozenset(ALPHABET)

_last_ms = -1
_last_rand = 0
_last_time_text = ""


def _encode_time(ms: int) -> str:
    p = _PAIRS
    return p[ms >> 40] + p[ms >> 30 & 1023] + p[ms >> 20 & 1023] + p[ms >> 10 & 1023] + p[ms & 1023]


def _encode_random(r: int) -> str:
    p = _PAIRS
    return (
        p[r >> 70]
        + p[r >> 60 & 1023]
        + p[r >> 50 & 1023]
        + p[r >> 40 & 1023]
        + p[r >> 30 & 1023]
        + p[r >> 20 & 1023]
        + p[r >> 10 & 1023]
        + p[r & 1023]
    )


def new_id(prefix: str) -> str:
    """A new id: ``prefix`` + 48-bit ms timestamp + 80 random bits, strictly increasing."""
    global _last_ms, _last_rand, _last_time_text
    ms = time.time_ns() // 1_000_000
    if ms > _last_ms:
        rand = int.from_bytes(os.urandom(10), "big")
    elif _last_rand < _RANDOM_MAX:
        # Same millisecond, or the clock stepped back: stay on the last timestamp and
        # count up so ids keep sorting in creation order.
        ms = _last_ms
        rand = _last_rand + 1
    else:
        # 2**80 ids in one millisecond cannot happen by chance; borrow the next one.
        ms = _last_ms + 1
        rand = int.from_bytes(os.urandom(10), "big")
    if ms != _last_ms:
        if ms > _TIME_MAX:
            raise OverflowError("timestamp does not fit in 48 bits")
        _last_time_text = _encode_time(ms)
        _last_ms = ms
    _last_rand = rand
    return prefix + _last_time_text + _encode_random(rand)


def is_valid_id(id_: str, prefix: str) -> bool:
    """True if ``id_`` is ``prefix`` followed by a well-formed 26-character body."""
    if len(id_) != len(prefix) + _BODY_LEN or not id_.startswith(prefix):
        return False
    body = id_[len(prefix) :]
    # The first character carries only 3 bits of the 128; anything above 7 overflows.
    return body[0] <= "7" and _ALPHABET_SET.issuperset(body)


def id_timestamp(id_: str, prefix: str) -> float:
    """Epoch seconds encoded in an id; raises ValueError if the id is malformed."""
    if not is_valid_id(id_, prefix):
        shown = id_ if len(id_) <= 64 else id_[:64] + "…"
        raise ValueError(f"not a valid {prefix!r} id: {shown!r}")
    body = id_[len(prefix) : len(prefix) + 10]
    return int(body.translate(_TO_BASE32HEX), 32) / 1000
