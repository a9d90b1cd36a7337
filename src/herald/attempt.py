"""One delivery attempt: call the destination's adapter, decide what comes next.

The whole decision of one attempt stands on one screen. The dispatcher, the worker
processes and the test ping all make their attempts here.
"""

from __future__ import annotations

import asyncio
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import replace

import structlog

from herald import tracing
from herald.adapters.base import Result, noting_exchange, waiting_turn
from herald.catalog import Catalog
from herald.deadlines import Deadline
from herald.flow import Pacers
from herald.ids import new_id
from herald.model import (
    Attempt,
    AttemptRecord,
    DeliveryKind,
    DeliveryStatus,
    Destination,
    DueDelivery,
    Exchange,
    Outcome,
)
from herald.retry import RetryPolicy

log = structlog.get_logger("herald.attempt")

AttemptOutcome = tuple[AttemptRecord, str] | BaseException
"""An attempt's record and its destination type id, or why it has none."""
AttemptDone = Callable[[DueDelivery, AttemptOutcome], None]
Submit = Callable[[DueDelivery, AttemptDone], None]
"""Starts an attempt elsewhere (herald.workers) and calls back once, with its outcome."""


_PACERS = Pacers()
"""This process's pacing of rate-limited destinations (herald.flow.Pacer)."""


def _turn(
    dest: Destination, item: DueDelivery, deadline: Deadline
) -> Callable[[], Awaitable[None]] | None:
    """What a request of this attempt waits for before it goes out: its place in the
    destination's rate (event deliveries only: the pings pass the limit). The wait is
    not the attempt's time: its deadline moves on by as much."""
    rate = dest.rate_limit_per_second
    if rate is None or item.kind is not DeliveryKind.EVENT:
        return None
    pacer = _PACERS.get(dest.id, rate)

    async def turn() -> None:
        wait = pacer.turn(time.monotonic())
        if wait > 0:
            when = deadline.when()
            if when is not None:
                deadline.reschedule(when + wait)
            await asyncio.sleep(wait)

    return turn


async def attempt(
    catalog: Catalog, policy: RetryPolicy, item: DueDelivery
) -> tuple[AttemptRecord, str]:
    """Run one attempt of ``item`` and build its record; also its destination type id."""
    if catalog.behind(item):
        await catalog.refresh()
    number = item.attempt_count + 1
    entry = catalog.get(item.destination_id)
    started = time.time()
    t0 = time.perf_counter()
    type_id = entry.dest.type if entry is not None else "unknown"
    event, span = item.event, None
    if tracing.enabled():
        # The receiver's parent is this attempt's span, itself the producer's child.
        span, sent = tracing.start(
            tracing.ATTEMPT_SPAN, started=started, traceparent=event.traceparent
        )
        if sent != event.traceparent:
            event = replace(event, traceparent=sent)
    noted: list[Exchange] = []
    if entry is None:
        result = Result.permanent("destination no longer exists")
    elif entry.config is None:
        result = Result.permanent(f"stored destination config is invalid: {entry.error}")
    else:
        try:
            # What went out is noted as it goes: a timeout still leaves the request.
            with noting_exchange() as noted:
                async with Deadline.after(entry.adapter.timeout) as deadline:
                    with waiting_turn(_turn(entry.dest, item, deadline)):
                        result = await entry.adapter.deliver(entry.dest, entry.config, event)
        except TimeoutError:
            result = Result(
                Outcome.TIMEOUT, error=f"no response within {entry.adapter.timeout:g} s"
            )
        except ValueError as exc:
            # What cannot be put on the wire as it is (a control character in a header,
            # a value the SDK refuses): no retry changes that, and it is no crash.
            log.warning("attempt_unsendable", **log_ids(item), error=catalog.redact(repr(exc)))
            result = Result.permanent(f"cannot be sent by the {type_id} adapter: {exc!r}")
        except Exception as exc:  # an adapter bug must not kill the engine
            # The traceback as text, masked: a library's message may quote a URL with
            # an operator's password in it.
            log.error(
                "adapter_crashed",
                **log_ids(item),
                destination_type=type_id,
                error=catalog.redact(repr(exc)),
                traceback=catalog.redact("".join(traceback.format_exception(exc))),
            )
            result = Result.retryable(f"internal error in {type_id} adapter: {exc!r}")
    duration_ms = (time.perf_counter() - t0) * 1000
    # No operator secret (a proxy's or the database's password) in anything a tenant
    # or the log sees, whatever a library quoted.
    error, excerpt = catalog.redact(result.error), catalog.redact(result.excerpt)
    attempt = Attempt(
        id=new_id("att_"),
        delivery_id=item.id,
        number=number,
        started_at=started,
        duration_ms=round(duration_ms, 3),
        outcome=result.outcome,
        response_status=result.status,
        error=error,
        response_excerpt=excerpt,
        exchange=noted[-1] if noted else None,
    )
    if span is not None:
        tracing.finish(
            span,
            ended=started + duration_ms / 1000,
            attributes={
                "herald.destination.type": type_id,
                "herald.destination.id": item.destination_id,
                "herald.tenant.id": item.event.tenant_id,
                "herald.event.id": item.event.id,
                "herald.event.type": item.event.type,
                "herald.delivery.id": item.id,
                "herald.delivery.kind": item.kind.value,
                "herald.attempt": number,
                "herald.outcome": result.outcome.value,
                "http.response.status_code": result.status,
                "herald.error": error,
            },
        )
    if result.outcome is Outcome.SUCCESS:
        activates = item.destination_id if item.kind is DeliveryKind.VERIFICATION else None
        record = AttemptRecord(attempt, DeliveryStatus.SUCCESS, None, activates, item)
    else:
        nxt = policy.next_attempt_at(
            failed_attempt=number,
            round_start=policy.round_start(item.max_attempts, item.attempt_count),
            now=time.time(),
            retry_after=result.retry_after,
        )
        status = DeliveryStatus.FAILURE if nxt is None else DeliveryStatus.PENDING
        record = AttemptRecord(attempt, status, nxt, None, item)
    return record, type_id


def log_ids(item: DueDelivery) -> dict[str, str]:
    """What every log line about an attempt of ``item`` names."""
    return {
        "tenant_id": item.event.tenant_id,
        "destination_id": item.destination_id,
        "event_id": item.event.id,
        "delivery_id": item.id,
    }
