"""The pings Herald sends of its own: a destination's verification ping (a new or
repointed destination stays pending until one succeeds) and the test ping an operator
or a tenant sends by hand, attempted at once by the process that was asked.

:class:`Pings` is one room of the service (:class:`herald.service.Operations`)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import orjson
import structlog

from herald.attempt import attempt, log_ids
from herald.catalog import Catalog
from herald.errors import Conflict
from herald.ids import new_id
from herald.model import (
    TEST_EVENT_TYPE,
    VERIFICATION_EVENT_TYPE,
    Attempt,
    Delivery,
    DeliveryFilter,
    DeliveryKind,
    Destination,
    DestinationStatus,
    DueDelivery,
    Event,
    NewDelivery,
)
from herald.retry import RetryPolicy
from herald.store import Store
from herald.timeutil import format_epoch

log = structlog.get_logger("herald.service")


class Pings:
    """Verification and test pings, over the service's store, catalog and policy."""

    store: Store
    catalog: Catalog
    policy: RetryPolicy

    if TYPE_CHECKING:

        async def get(
            self, tenant_id: str | None, dest_id: str, *, deleted: bool = False
        ) -> Destination: ...

    def _verification(self, dest: Destination, now: float) -> tuple[Event, NewDelivery]:
        event = Event(
            id=new_id("evt_"),
            tenant_id=dest.tenant_id,
            type=VERIFICATION_EVENT_TYPE,
            created_at=format_epoch(now),
            created_ts=now,
            data=orjson.dumps({"destination_id": dest.id}),
        )
        delivery = NewDelivery(
            id=new_id("dlv_"),
            tenant_id=dest.tenant_id,
            event_id=event.id,
            event_type=event.type,
            destination_id=dest.id,
            kind=DeliveryKind.VERIFICATION,
            max_attempts=0,  # its first round: the daemon that attempts it decides the budget
            next_attempt_at=now,
            held=False,
            created_at=now,
        )
        return event, delivery

    async def test(self, tenant_id: str, dest_id: str) -> Delivery:
        """Send ``test.ping`` once, no retry, to an active destination; return the delivery."""
        dest = await self.get(tenant_id, dest_id)
        if dest.status is not DestinationStatus.ACTIVE:
            raise Conflict(
                f"test events go only to active destinations; this one is {dest.status.value}",
                code="destination_not_active",
            )
        now = time.time()
        event = Event(
            id=new_id("evt_"),
            tenant_id=tenant_id,
            type=TEST_EVENT_TYPE,
            created_at=format_epoch(now),
            created_ts=now,
            data=b'{"ok":true}',
        )
        new = NewDelivery(
            id=new_id("dlv_"),
            tenant_id=tenant_id,
            event_id=event.id,
            event_type=event.type,
            destination_id=dest.id,
            kind=DeliveryKind.TEST,
            max_attempts=1,
            next_attempt_at=None,
            held=False,
            created_at=now,
        )
        await self.store.insert_deliveries([event], [new])
        await self.catalog.refresh()
        if self.catalog.get(dest.id) is None:
            await self.catalog.refresh(force=True)
        item = DueDelivery(new.id, dest.id, DeliveryKind.TEST, 0, 1, event)
        record, type_id = await attempt(self.catalog, self.policy, item)
        await self.store.record_attempts([record])
        # One line whatever the outcome (with the API's request_id when it asked).
        log.info(
            "test_ping_sent",
            **log_ids(item),
            destination_type=type_id,
            outcome=record.attempt.outcome.value,
            response_status=record.attempt.response_status,
            error=record.attempt.error,
        )
        delivery = await self.store.get_delivery(tenant_id, new.id, with_attempts=True)
        assert delivery is not None
        return delivery

    async def verification_attempt(self, dest: Destination) -> Attempt | None:
        """The last attempt of ``dest``'s newest verification ping (why a pending
        destination is still pending), None without one."""
        flt = DeliveryFilter(destination_id=dest.id, kind=DeliveryKind.VERIFICATION)
        found = await self.store.list_deliveries(flt, before_id=None, limit=1)
        return found[0].last_attempt if found else None
