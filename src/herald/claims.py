"""The claim: what one claim query asks for, what it skips, and where it starts reading.

A claim skips destinations and tenants that already have enough outstanding, and starts
past the due deliveries it learnt are all theirs (the floor) instead of reading through
a slow destination's backlog every time. Skipping a saturated tenant is how claims
rotate across tenants: the claim reads on, in due order, to the other tenants' due
deliveries, so one tenant's backlog (older than everyone else's) cannot starve them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from herald.model import DueDelivery
from herald.store import Store

DUE_FLOOR_SECONDS = 2.0
"""How long claims may skip the due deliveries they found to be all of saturated
destinations (see :meth:`Claims.claim`) before one scans from the oldest again."""


@dataclass(frozen=True, slots=True)
class _Floor:
    """What a claim learnt: every due delivery older than ``due_since`` that it did not
    take is of a destination in ``excluded`` or a tenant in ``tenants`` (it reads them
    in due order)."""

    due_since: float
    excluded: frozenset[str]
    tenants: frozenset[str]
    until: float
    """``time.monotonic()`` after which the next claim scans everything again."""


class Claims:
    """The claim queries of one dispatcher, and the floor they start from."""

    def __init__(
        self,
        store: Store,
        *,
        owner: str,
        lease_seconds: float,
        max_per_destination: int,
        max_per_tenant: int,
        claim_batch: int,
    ) -> None:
        self._store = store
        self._owner = owner
        self._lease_seconds = lease_seconds
        self.enough = max(max_per_destination, claim_batch)
        """A claim skips destinations with this many outstanding: the most a claim or a
        relay batch gives one (more than it can run: its next ones wait in memory)."""
        self.tenant_enough = max(max_per_tenant, claim_batch)
        """The same for a tenant: a claim skips tenants with this load (deliveries
        outstanding, less those parked behind their destination's limit)."""
        self._floor: _Floor | None = None
        self._rescans = 0
        """Counts :meth:`rescan` calls: one during a claim voids what that claim learnt."""
        self.read_at = 0.0
        """The ``now`` of the last claim: what was due by then and not taken, it skipped."""
        self.gates: dict[str, float] = {}
        """Destinations under flow control (``herald.flow``) whose gate the last claims
        met shut: destination id → when it opens (the next token, the next probe).
        Claims skip them like saturated ones until then (the claim query would too,
        but reading past their backlog)."""

    def saturated(self, outstanding: Mapping[str, int]) -> list[str]:
        """The destinations a claim skips, given the deliveries outstanding per destination."""
        enough = self.enough
        skipped = [d for d, n in outstanding.items() if n >= enough]
        if self.gates:
            now = time.time()
            for d, until in list(self.gates.items()):
                if until <= now:
                    del self.gates[d]
                elif outstanding.get(d, 0) < enough:
                    skipped.append(d)
        return skipped

    def waits_for_slots(self, outstanding: Mapping[str, int]) -> bool:
        """Whether some destination's due deliveries wait for a slot of its own (it has
        ``enough`` outstanding): then a freed slot is worth a claim."""
        enough = self.enough
        return any(n >= enough for n in outstanding.values())

    def next_gate(self) -> float | None:
        """When the first shut gate opens (None: none is shut)."""
        return min(self.gates.values(), default=None)

    def opened(self, destination_id: str) -> None:
        """``destination_id``'s gate opened early (its circuit closed)."""
        self.gates.pop(destination_id, None)
        self.rescan()

    def recorded(self, destination_ids: Iterable[str]) -> None:
        """Attempts to these destinations were recorded: a circuit may have moved (a
        failed probe reopens it with a sooner gate than the probe's): the next claim
        learns their gates again."""
        gates = self.gates
        if gates:
            for d in destination_ids:
                gates.pop(d, None)

    def saturated_tenants(self, load: Mapping[str, int]) -> list[str]:
        """The tenants a claim skips, given each tenant's load: its deliveries outstanding
        and not parked behind their destination's limit (``herald.slots``), so that a
        slow destination's backlog does not make its tenant's other destinations wait."""
        enough = self.tenant_enough
        return [t for t, n in load.items() if n >= enough]

    async def claim(
        self, want: int, saturated: Sequence[str], tenants: Sequence[str] = ()
    ) -> list[DueDelivery]:
        """Claim what is due, skipping ``saturated`` destinations and ``tenants``.

        Their due deliveries come first in due order (they wait there while the
        destination is busy), and a claim read past them every time: a slow
        destination's backlog of 20,000 made each claim 1.3 ms longer. A claim that
        skipped some tells us that every due delivery older than the first it took is
        theirs; while they stay saturated (and for ``DUE_FLOOR_SECONDS`` at most, a
        bound on what a peer's locked rows or clock could hide), the next claims start
        there. Anything else that makes old deliveries due again clears it
        (:meth:`rescan`); new ones are due from now on, past it.
        """
        now = self.read_at = time.time()
        excluded = frozenset(saturated)
        skipped = frozenset(tenants)
        floor = self._floor
        if floor is not None and not (
            excluded >= floor.excluded
            and skipped >= floor.tenants
            and time.monotonic() < floor.until
        ):
            floor = None
        rescans = self._rescans
        due = await self._store.claim_due(
            now=now,
            limit=want,
            owner=self._owner,
            lease_until=now + self._lease_seconds,
            exclude_destinations=saturated,
            exclude_tenants=tenants,
            due_since=None if floor is None else floor.due_since,
            gates=self.gates,
        )
        # The floor is learnt from the common lane alone: the flow lanes are read per
        # destination, not in due order (herald.flow).
        common = [d.due_at for d in due if not d.flow_lane]
        if (not excluded and not skipped) or rescans != self._rescans:
            # (Asked for a rescan while the claim ran: its snapshot may predate what
            # became due, older than anything it took.)
            self._floor = None
        elif common:
            until = time.monotonic() + DUE_FLOOR_SECONDS if floor is None else floor.until
            self._floor = _Floor(min(common), excluded, skipped, until)
        else:
            self._floor = floor
        return due

    def rescan(self) -> None:
        """Deliveries that were due earlier may be due now: the next claim reads from
        the oldest again."""
        self._floor = None
        self._rescans += 1
