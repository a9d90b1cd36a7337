"""What a claim asks for (herald.claims.Claims), against a store that only answers claims."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, cast

from herald.claims import Claims
from herald.model import DeliveryKind, DueDelivery, Event
from herald.store import Store


def due(n: int, tenant: str = "t") -> DueDelivery:
    event = Event(f"evt_{n}", tenant, "a.b", "2026-01-01T00:00:00Z", 0.0, b"{}")
    return DueDelivery(f"dlv_{n}", f"d{n}", DeliveryKind.EVENT, 0, 0, event, due_at=float(n))


class ClaimStore:
    """Answers each claim with the next list of ``answers``; records what it was asked."""

    def __init__(self, *answers: list[DueDelivery]) -> None:
        self.answers = list(answers)
        self.asked: list[dict[str, Any]] = []
        self.gate: asyncio.Event | None = None

    async def claim_due(self, **kwargs: Any) -> list[DueDelivery]:
        self.asked.append(kwargs)
        if self.gate is not None:
            await self.gate.wait()
        return self.answers.pop(0)


def claims(store: ClaimStore, *, per_tenant: int = 4, batch: int = 8) -> Claims:
    return Claims(
        cast(Store, store),
        owner="me",
        lease_seconds=60,
        max_per_destination=2,
        max_per_tenant=per_tenant,
        claim_batch=batch,
    )


def since(store: ClaimStore) -> Sequence[float | None]:
    return [a["due_since"] for a in store.asked]


def test_a_tenant_is_skipped_from_max_of_its_cap_and_the_batch() -> None:
    c = claims(ClaimStore(), per_tenant=4, batch=8)
    assert c.tenant_enough == 8
    assert c.saturated_tenants({"a": 8, "b": 7, "c": 20}) == ["a", "c"]
    assert claims(ClaimStore(), per_tenant=16, batch=8).tenant_enough == 16


async def test_claims_start_past_a_skipped_tenants_backlog_while_it_stays_skipped() -> None:
    store = ClaimStore([due(5), due(7)], [due(9)], [due(11)], [])
    c = claims(store)
    await c.claim(10, [], ["hung"])
    assert store.asked[0]["exclude_tenants"] == ["hung"]
    await c.claim(10, [], ["hung", "other"])  # still skipped: start past its backlog
    await c.claim(10, [], [])  # no longer skipped: read from the oldest again
    await c.claim(10, [], [])
    assert since(store) == [None, 5.0, None, None]


async def test_a_rescan_during_a_claim_voids_what_it_learnt() -> None:
    store = ClaimStore([due(5)], [due(6)])
    store.gate = asyncio.Event()
    c = claims(store)
    claiming = asyncio.create_task(c.claim(10, ["slow"], ["hung"]))
    await asyncio.sleep(0)
    c.rescan()  # deliveries older than what this claim will take became due meanwhile
    store.gate.set()
    await claiming
    await c.claim(10, ["slow"], ["hung"])
    assert since(store) == [None, None]
