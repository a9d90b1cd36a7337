"""Ordered delivery per key, the bookkeeping (docs/ordering.md): pure, no I/O.

For a destination with ``ordering = "key"``, each delivery of an event with an
ordering key carries the key and an ``order_seq``, the relay's order. Of one
(destination, key)'s pending deliveries only the head, the lowest ``order_seq``, may
be claimed: the others wait (``held = WAITING``) and the recording that ends the head
(success, or failure after its last retry) releases the next one. So a claim never
reads past a waiting delivery, and the rule costs one index probe per delivery ended
or planned, not one per delivery scanned.

These functions decide, for deliveries entering ``pending`` (planned by the relay,
re-queued by a replay or a retry), which become heads and which wait, and in which
order re-queued ones join their key. The store runs them inside the transaction that
writes the rows, under the key's lock (``herald.store.part``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence, Set
from dataclasses import dataclass

WAITING = 2
"""``herald_deliveries.held`` of a delivery waiting behind the head of its key (0:
claimable when due; 1: its destination is not active)."""

ORDERINGS = ("none", "key")
"""A destination's ``ordering``: ``none`` (no order), ``key`` (serial per key)."""

Key = tuple[str, str]
"""(destination id, ordering key)."""


def heads(keys: Sequence[Key | None], busy: Set[Key]) -> list[bool]:
    """For deliveries entering ``pending`` in their order (``None``: not ordered),
    whether each is the head of its key: nothing of its key is pending already
    (``busy``) nor earlier in ``keys``. An unordered one is always its own head."""
    seen: set[Key] = set(busy)
    out: list[bool] = []
    for key in keys:
        if key is None:
            out.append(True)
        elif key in seen:
            out.append(False)
        else:
            seen.add(key)
            out.append(True)
    return out


def take(first: int, keys: Sequence[Key | None]) -> list[int | None]:
    """The ``order_seq`` of each delivery in ``keys`` (None for an unordered one), from
    ``first`` on, in their order."""
    out: list[int | None] = []
    n = first
    for key in keys:
        if key is None:
            out.append(None)
        else:
            out.append(n)
            n += 1
    return out


@dataclass(frozen=True, slots=True)
class Requeued:
    """A delivery a replay or a retry makes pending again, as the store read it."""

    id: str
    key: Key | None
    """(destination, the event's ordering key) when its destination is ordered now."""
    order_seq: int | None
    """Its order so far (None: it was planned unordered)."""
    pending: bool
    """Still pending: it keeps its place (and its ``order_seq``)."""


def requeue_order(rows: Iterable[Requeued]) -> list[Requeued]:
    """The order in which re-queued deliveries join their keys: finished ones only (a
    pending one keeps its place), by their original order (``order_seq``, then id,
    which is time-ordered), so a key's replayed events go out as they first did, after
    what of that key is pending."""
    finished = [r for r in rows if not r.pending and r.key is not None]
    return sorted(finished, key=lambda r: (r.order_seq is None, r.order_seq or 0, r.id))
