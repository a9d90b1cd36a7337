"""Prefixed, time-ordered identifiers in the ULID layout, lowercase Crockford base32."""

from __future__ import annotations

import os
import threading
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
# new_id runs on the event loop and in SQLite's writer thread (the relay's plan,
# store.sqlitethread): the last id's state is read and moved on under a lock.
_lock = threading.Lock()
# Randomness read from the system 4 KiB at a time (one system call per 409 ids, not
# one per id), and forgotten in a forked child, which must never repeat its parent's.
_RANDOM_CHUNK = 4096
_pool = b""
_pool_at = 0
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


def _random80() -> int:
    """80 random bits from the system's CSPRNG (called under ``_lock``)."""
    global _pool, _pool_at
    at = _pool_at
    if at + 10 > len(_pool):
        _pool, at = os.urandom(_RANDOM_CHUNK), 0
    _pool_at = at + 10
    return int.from_bytes(_pool[at : at + 10], "big")


def _forget_in_child() -> None:
    """After a fork: the parent's unread randomness and last id are not ours to reuse."""
    global _pool, _pool_at, _last_ms, _last_rand, _lock
    _lock = threading.Lock()
    _pool, _pool_at = b"", 0
    _last_ms, _last_rand = -1, 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def new_id(prefix: str) -> str:
    """A new id: ``prefix`` + 48-bit ms timestamp + 80 random bits, strictly increasing
    within the process (whichever thread asks)."""
    global _last_ms, _last_rand, _last_time_text
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms > _last_ms:
            rand = _random80()
        elif _last_rand < _RANDOM_MAX:
            # Same millisecond, or the clock stepped back: stay on the last timestamp and
            # count up so ids keep sorting in creation order.
            ms = _last_ms
            rand = _last_rand + 1
        else:
            # 2**80 ids in one millisecond cannot happen by chance; borrow the next one.
            ms = _last_ms + 1
            rand = _random80()
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
