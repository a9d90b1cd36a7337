"""Event-type patterns and the index that maps an event type to its subscribers."""

from __future__ import annotations

import functools
import re
from collections.abc import Hashable, Iterable
from typing import Generic, TypeVar

from herald.errors import ValidationError
from herald.model import OPERATIONAL_PREFIX, OPERATIONAL_TYPES

__all__ = [
    "WILDCARD",
    "SubscriptionIndex",
    "validate_event_type",
    "validate_pattern",
    "validate_subscription",
]

WILDCARD = "*"
_FAMILY_SUFFIX = ".*"
_MAX_TYPE_LEN = 128
_TYPE = re.compile(r"[a-z0-9_-]+(?:\.[a-z0-9_-]+)*", re.ASCII)

K = TypeVar("K", bound=Hashable)


@functools.lru_cache(maxsize=4096)  # the relay checks every event; types repeat
def _type_problem(t: str) -> str | None:
    """Why ``t`` is not a valid event type, or None if it is."""
    if not t:
        return "event type is empty"
    if len(t) > _MAX_TYPE_LEN:
        return f"event type is longer than {_MAX_TYPE_LEN} characters"
    if _TYPE.fullmatch(t) is None:
        return (
            f"event type {t!r} must be dot-separated segments of lowercase letters, "
            "digits, '_' and '-'"
        )
    return None


def validate_event_type(t: str) -> str:
    """Return ``t`` if it is an exact event type such as ``workflow_run.completed``."""
    problem = _type_problem(t)
    if problem is not None:
        raise ValueError(problem)
    return t


_OPERATIONAL_FAMILIES = frozenset(
    t.rsplit(".", n)[0] for t in OPERATIONAL_TYPES for n in range(1, t.count(".") + 1)
)
"""``herald`` and ``herald.delivery``, ``herald.destination``: the families a pattern
under the reserved prefix may name."""


def validate_pattern(p: str) -> str:
    """Return ``p`` if it is ``*``, an exact event type, or a family such as ``invoice.*``."""
    if p == WILDCARD:
        return p
    base = p[: -len(_FAMILY_SUFFIX)] if p.endswith(_FAMILY_SUFFIX) else p
    problem = _type_problem(base)
    if problem is not None:
        raise ValidationError(f"invalid pattern {p[: _MAX_TYPE_LEN + 2]!r}: {problem}")
    return p


def validate_subscription(p: str) -> str:
    """:func:`validate_pattern`, and under the reserved ``herald.`` prefix only the
    operational event types and their families: a misspelt one would never match.

    For what callers send; the index itself takes any valid pattern, so that a
    destination stored before a type was renamed still loads."""
    validate_pattern(p)
    if p.endswith(_FAMILY_SUFFIX) and (p[: -len(_FAMILY_SUFFIX)] + ".").startswith(
        OPERATIONAL_PREFIX
    ):
        unknown = p[: -len(_FAMILY_SUFFIX)] not in _OPERATIONAL_FAMILIES
    else:
        unknown = p.startswith(OPERATIONAL_PREFIX) and p not in OPERATIONAL_TYPES
    if unknown:
        raise ValidationError(
            f"unknown operational event pattern {p[: _MAX_TYPE_LEN + 2]!r}: under"
            f" {OPERATIONAL_PREFIX!r} there are {', '.join(OPERATIONAL_TYPES)}"
            " and their families ('herald.*', 'herald.destination.*', 'herald.delivery.*')"
        )
    return p


class SubscriptionIndex(Generic[K]):
    """Maps event types to the keys subscribed to them.

    A lookup costs one dictionary probe per dot-segment of the event type, whatever the
    number of keys or patterns.
    """

    __slots__ = ("_exact", "_families", "_patterns", "_wildcard")

    def __init__(self) -> None:
        self._exact: dict[str, set[K]] = {}
        self._families: dict[str, set[K]] = {}  # "a.b" for the pattern "a.b.*"
        self._wildcard: set[K] = set()
        self._patterns: dict[K, set[str]] = {}

    def add(self, key: K, patterns: Iterable[str]) -> None:
        """Subscribe ``key`` to ``patterns`` (added to any it already has)."""
        # Validate everything first so a bad pattern leaves the index untouched.
        checked = [validate_pattern(p) for p in patterns]
        owned = self._patterns.setdefault(key, set())
        for p in checked:
            owned.add(p)
            if p == WILDCARD:
                self._wildcard.add(key)
            elif p.endswith(_FAMILY_SUFFIX):
                self._families.setdefault(p[: -len(_FAMILY_SUFFIX)], set()).add(key)
            else:
                self._exact.setdefault(p, set()).add(key)

    def remove(self, key: K) -> None:
        """Forget ``key`` and all its patterns; unknown keys are ignored."""
        for p in self._patterns.pop(key, ()):
            if p == WILDCARD:
                self._wildcard.discard(key)
                continue
            if p.endswith(_FAMILY_SUFFIX):
                table, name = self._families, p[: -len(_FAMILY_SUFFIX)]
            else:
                table, name = self._exact, p
            keys = table.get(name)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del table[name]

    def match(self, event_type: str) -> set[K]:
        """All keys with a pattern matching ``event_type``.

        ``*`` matches every type but Herald's operational events (``herald.…``): a
        receiver of everything must not start receiving operational noise. Those go
        only to keys naming ``herald.*``, a family under it, or the type itself."""
        found = set() if event_type.startswith(OPERATIONAL_PREFIX) else set(self._wildcard)
        exact = self._exact.get(event_type)
        if exact:
            found |= exact
        if self._families:
            # Each proper prefix ending before a dot names a family: "a.b.c" -> "a", "a.b".
            families = self._families
            dot = event_type.find(".")
            while dot > 0:
                keys = families.get(event_type[:dot])
                if keys:
                    found |= keys
                dot = event_type.find(".", dot + 1)
        return found

    def patterns(self, key: K) -> frozenset[str]:
        """The patterns ``key`` is subscribed to (empty if unknown)."""
        return frozenset(self._patterns.get(key, ()))

    def __len__(self) -> int:
        return len(self._patterns)

    def __contains__(self, key: object) -> bool:
        return key in self._patterns
