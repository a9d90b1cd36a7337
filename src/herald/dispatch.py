"""Delivery scheduling: which claimed or handed-over delivery runs when, within the limits.

Concurrency is bounded globally, per tenant and per destination, so one slow or dead
destination holds at most ``max_per_destination`` of the global slots, and one
tenant's at most ``max_per_tenant``, while the others keep flowing. The loop never
busy-polls: it sleeps until the next due time, a wake-up from the relay or a finished
attempt, or the idle poll that notices changes made by other processes. The slot
arithmetic lives in herald.slots, what a claim asks for in herald.claims, the attempt
in herald.attempt, the writing of outcomes in herald.recorder, the relay's hand-over
in herald.handover.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from herald.attempt import AttemptDone, AttemptOutcome, Submit, attempt, log_ids
from herald.catalog import Catalog
from herald.claims import Claims
from herald.errors import StorageError
from herald.flow import Held
from herald.handover import Handover
from herald.logs import debug_enabled
from herald.model import (
    CIRCUIT_CLOSED,
    AttemptRecord,
    DeliveryKind,
    DeliveryStatus,
    DueDelivery,
    Outcome,
    Recorded,
)
from herald.recorder import Recorder
from herald.retry import RetryPolicy, retry_storage
from herald.slots import Slots
from herald.store import Store

log = structlog.get_logger("herald.dispatch")


@dataclass(frozen=True, slots=True)
class Limits:
    max_concurrency: int = 256
    max_per_destination: int = 64
    max_per_tenant: int = 128
    claim_batch: int = 512
    lease_seconds: float = 300.0
    idle_poll: float = 1.0
    shutdown_grace: float = 10.0
    breaker_failures: int = 5


UNWRITTEN_FACTOR = 4
"""Finished attempts that may wait for the writer, in multiples of max_concurrency.
At full load on 2 cores the records of 260-560 attempts (with max_concurrency 256)
routinely wait for the SQLite writer; a window of 1x or 2x throttled the steady state
by 5-10 % in the throughput benchmark. At 4x it only stops a stall or an outage."""


RENEWAL_RETRY_SECONDS = 0.25
"""After a failed lease renewal, the next try (sooner than the usual third of a lease)."""


class Dispatcher:
    """The delivery engine of one Herald process.

    Claimed deliveries start as slots allow (:class:`herald.slots.Slots`): at most
    ``max_per_destination`` of one destination, ``max_per_tenant`` of one tenant and
    ``max_concurrency`` in all run at once; the others wait in queues, in claim order.
    Slots are handed on by the completion callbacks themselves: no task per waiting
    delivery, and none at all when attempts run in worker processes.
    """

    def __init__(
        self,
        store: Store,
        catalog: Catalog,
        policy: RetryPolicy,
        limits: Limits,
        *,
        owner: str,
        on_attempt: Callable[[str, AttemptRecord, DueDelivery], None] = lambda t, r, d: None,
        submit: Submit | None = None,
        on_storage: Callable[[str, bool], None] = lambda component, ok: None,
        on_recorded: Callable[[Recorded], None] = lambda recorded: None,
    ) -> None:
        self._store = store
        self._on_storage = on_storage
        """Told of each database round trip: ``(component, ok)`` (for metrics)."""
        self._catalog = catalog
        self._policy = policy
        self._limits = limits
        self.owner = owner
        self._on_attempt = on_attempt
        # Where attempts run: here, a task each, or in worker processes (herald.workers).
        self._submit = submit
        self._done_cb: AttemptDone = self._done
        self._wake = asyncio.Event()
        self._slot = asyncio.Event()
        self._claims = Claims(
            store,
            owner=owner,
            lease_seconds=limits.lease_seconds,
            max_per_destination=limits.max_per_destination,
            max_per_tenant=limits.max_per_tenant,
            claim_batch=limits.claim_batch,
        )
        self._on_recorded = on_recorded
        self.recorder = Recorder(
            store, on_flush=self._flushed, on_storage=on_storage, on_recorded=self._recorded
        )
        recorder = self.recorder
        self._slots = Slots(
            max_concurrency=limits.max_concurrency,
            max_per_destination=limits.max_per_destination,
            max_per_tenant=limits.max_per_tenant,
            destination_enough=self._claims.enough,
            tenant_enough=self._claims.tenant_enough,
            begin=self._begin,
            unwritten=lambda: recorder.unwritten,
            max_unwritten=UNWRITTEN_FACTOR * limits.max_concurrency,
        )
        # New deliveries the relay stores leased to us (herald.handover), within our room.
        self.handover = Handover(
            owner,
            lease_seconds=limits.lease_seconds,
            cap=self._claims.enough,
            tenant_cap=self._claims.tenant_enough,
            free=self._slots.free,
            outstanding=self._slots.outstanding,
            tenant_load=self._slots.tenant_load,
            launch=self._handed_over,
        )
        self._idle = asyncio.Event()
        self._idle.set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._recording: set[str] = set()
        """Attempted, their records waiting for the recorder: still ours. Their leases are
        renewed, and a claim that returns one of them (its lease ran out during a
        database outage) starts nothing: the record being written settles it."""
        self._given_up = False
        """Stopping, the grace period is over: outcomes that still arrive are ignored."""
        self._recorder_task: asyncio.Task[None] | None = None
        self.running = False
        self._claim_error: str | None = None
        self._held = Held(limits.breaker_failures)
        """What of the breaker destinations' claimed deliveries must not begin."""
        self.taken = {"handover": 0, "claim": 0}
        """Deliveries taken to attempt, by how they came: stored leased by the relay
        (the hand-over) or claimed from the table (``herald_deliveries_taken_total``)."""
        # Looked up once: asyncio.get_running_loop() makes a getpid() system call.
        self._event_loop: asyncio.AbstractEventLoop | None = None

    @property
    def inflight(self) -> int:
        return self._slots.total

    @property
    def storage_error(self) -> str | None:
        """Why claiming or recording keeps failing, while it does (/readyz shows it)."""
        return self.recorder.storage_error or self._claim_error

    def wake(self) -> None:
        """New or re-queued work exists: look now."""
        self._wake.set()

    def _flushed(self, batch: list[AttemptRecord]) -> None:
        self._recording.difference_update(r.attempt.delivery_id for r in batch)
        if self._held.suspecting:
            # Settled once what the batch signals (a circuit opened) is known here too:
            # the recorder tells that right after this (see Held).
            loop = self._event_loop or asyncio.get_running_loop()
            loop.call_soon(self._held.written, {r.attempt.id for r in batch})
        self._claims.recorded(r.item.destination_id for r in batch if r.item is not None)
        # Room for records again: start what waited for it (see Slots.can_begin).
        self._slots.start_ready()
        if any(r.activates_destination for r in batch):
            self.rescan()  # its held deliveries are due, since they were written
        elif any(
            r.next_attempt_at is not None
            # An ordered delivery that ended let the next of its key go (herald.ordering):
            # it is due now.
            or (r.item is not None and r.item.ordering_key is not None)
            for r in batch
        ):
            self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Claim and attempt until ``stop``; then drain within the grace period."""
        self.running = True
        self._event_loop = asyncio.get_running_loop()
        # The recorder outlives the claim loop: attempts finishing during the
        # drain must still be written before the process exits.
        recorder_stop = asyncio.Event()
        recorder = asyncio.create_task(self.recorder.run(recorder_stop), name="herald-recorder")
        self._recorder_task = recorder
        renewer = asyncio.create_task(self._renew_leases(stop), name="herald-lease-renewal")
        self.handover.open = True
        try:
            await self._loop(stop)
        finally:
            self.running = False
            self.handover.open = False  # what the relay leases from now on, it releases
            await self._drain()
            renewer.cancel()
            await asyncio.gather(renewer, return_exceptions=True)
            recorder_stop.set()
            await recorder
            await self._release_unfinished()

    async def _loop(self, stop: asyncio.Event) -> None:
        lim = self._limits
        while not stop.is_set():
            if self._recorder_task is not None and self._recorder_task.done():
                raise RuntimeError("the attempt recorder stopped unexpectedly")
            # Clear the signals before reading any state: a wake-up or a freed slot
            # that happens while we claim must end the sleep that follows, not be lost.
            self._wake.clear()
            self._slot.clear()
            free = self._slots.free()
            if free <= 0:
                await self._sleep(stop, lim.idle_poll, slot=True)
                continue
            want = min(free, lim.claim_batch)
            saturated = self._claims.saturated(self._slots.outstanding)
            # Whether a destination was skipped for its count: its release below it may
            # come while the claim runs, and must then end the wait that follows.
            crowded = self._claims.waits_for_slots(self._slots.outstanding)
            if self._held.suspecting:  # their circuits may be opening (herald.flow.Held)
                saturated += [d for d in self._held.suspects if d not in saturated]
            tenants = self._claims.saturated_tenants(self._slots.tenant_load)
            # Claims are transactional: a failed one leased nothing, so it is retried
            # as it is (a retry only ever asks for less than there is room for). The
            # retry waits out its backoff: wake-ups that keep coming while the database
            # is away must not turn it into a loop hammering the database.
            retrying = functools.partial(
                retry_storage,
                on_error=self._claim_trouble,
                sleep=functools.partial(self._sleep, stop, slot=False, wake=False),
                until=stop.is_set,
            )
            due = await retrying(functools.partial(self._claims.claim, want, saturated, tenants))
            if due is None:
                continue  # stopping
            self._on_storage("claim", True)
            self.taken["claim"] += len(due)
            await self._start(due)
            if len(due) >= want:
                self._claim_error = None
                continue
            next_due = await retrying(self._store.next_due_at)
            if stop.is_set():
                continue
            self._claim_error = None
            if next_due is None:
                await self._sleep(stop, lim.idle_poll, slot=False)
            elif next_due <= self._claims.read_at:
                # Due when the claim read, and not taken: due work exists but only for
                # saturated destinations (or rows a peer holds, or destinations waiting
                # for their rate or their circuit's probe): wait for a slot or a gate.
                # A freed slot wakes the claim only if a destination or tenant waits for
                # one: a backlog behind a shut gate alone would have every finished
                # attempt's claim read past it for nothing.
                gate = self._claims.next_gate()
                wait = lim.idle_poll if gate is None else min(gate - time.time(), lim.idle_poll)
                by_slots = bool(tenants) or crowded
                await self._sleep(stop, wait, slot=by_slots)
            else:
                # Not yet due when the claim read; it may be by now (a timer that fired
                # a little early, a slow query): then claim again at once. Compared with
                # the time of the query instead, it looked like saturated work and
                # waited a whole idle poll (retries up to a second late on PostgreSQL).
                await self._sleep(stop, min(next_due - time.time(), lim.idle_poll), slot=False)

    def rescan(self) -> None:
        """Deliveries that were due earlier may be due now (destinations activated or
        changed, deliveries re-queued): the next claim reads from the oldest again."""
        self._claims.rescan()
        self._wake.set()

    def _claim_trouble(self, exc: StorageError, delay: float) -> None:
        self._claim_error = exc.message
        self._on_storage("claim", False)
        log.warning("claim_storage_error", error=exc.message, retry_in=delay)

    async def _sleep(
        self, stop: asyncio.Event, timeout: float, *, slot: bool, wake: bool = True
    ) -> None:
        events = [stop] + ([self._wake] if wake else []) + ([self._slot] if slot else [])
        waiters = [asyncio.ensure_future(e.wait()) for e in events]
        try:
            await asyncio.wait(
                waiters, timeout=max(timeout, 0), return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for w in waiters:
                w.cancel()

    async def _start(self, due: list[DueDelivery]) -> None:
        missing = [d for d in due if self._catalog.get(d.destination_id) is None]
        if missing:
            await self._catalog.refresh(force=True)
        self._launch(due)

    def _handed_over(self, due: list[DueDelivery]) -> None:
        self.taken["handover"] += len(due)
        self._launch(due)

    def _launch(self, due: list[DueDelivery]) -> None:
        if due:
            self._idle.clear()
        admit = self._slots.admit
        recording = self._recording
        claimed_at = time.time()
        for item in due:
            if item.kind is DeliveryKind.EVENT and self._breaker(item):
                self._held.claimed(item.id, claimed_at)
            # Claimed again while still ours (its lease ran out while the database was
            # away): the claim only renewed the lease; one attempt is enough.
            if item.id not in recording:
                admit(item)

    def _begin(self, item: DueDelivery) -> None:
        """``item`` has its slots (herald.slots): attempt it, here or in a worker."""
        if not self._held.may_begin(item.id, item.destination_id):
            # Its circuit opened (or is about to) since it was claimed: no attempt (the
            # slot is freed once the caller is done with the slots), due again as it was.
            loop = self._event_loop or asyncio.get_running_loop()
            loop.call_soon(self._postpone, item)
            return
        if self._submit is not None:
            self._submit(item, self._done_cb)
            return
        loop = self._event_loop or asyncio.get_running_loop()
        task = loop.create_task(self._attempt_here(item), name=f"herald-attempt-{item.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _attempt_here(self, item: DueDelivery) -> None:
        try:
            outcome = await attempt(self._catalog, self._policy, item)
        except BaseException as exc:  # cancelled at shutdown, or a bug of ours
            self._done(item, exc)
            raise
        self._done(item, outcome)

    def _done(self, item: DueDelivery, outcome: AttemptOutcome) -> None:
        """An attempt ended: record it, free its slots, start who waits for them."""
        if item.id not in self._slots:
            if not self._given_up:  # given up at shutdown: it goes again later
                log.error("attempt_outcome_unexpected", delivery_id=item.id)
            return
        try:
            if isinstance(outcome, BaseException):
                if not isinstance(outcome, asyncio.CancelledError):
                    log.error("attempt_lost", delivery_id=item.id, error=repr(outcome))
            else:
                record, type_id = outcome
                if item.kind is not DeliveryKind.VERIFICATION and self._breaker(item):
                    ok = record.attempt.outcome is Outcome.SUCCESS
                    self._held.ended(item.destination_id, record.attempt.id, ok)
                self._recording.add(item.id)
                self.recorder.add(record)
                self._on_attempt(type_id, record, item)
                log_attempt(record, item, type_id)
        finally:
            self._release(item)

    def _breaker(self, item: DueDelivery) -> bool:
        entry = self._catalog.get(item.destination_id)
        return entry is not None and entry.dest.circuit_breaker

    def _recorded(self, recorded: Recorded) -> None:
        """A recording committed operational events, or attempts of breaker
        destinations: what this process claimed before their circuit opened does not
        begin (herald.flow); a circuit that closed opens its gate."""
        for dest_id, opened_at in recorded.circuits.items():
            # As the database has it (another instance may have opened or closed it).
            if opened_at is None:
                self._held.closed(dest_id)
            else:
                self._held.opened(dest_id, opened_at)
        for s in recorded.signals:
            if s.type == CIRCUIT_CLOSED:
                self._claims.opened(s.destination_id)
                self._wake.set()
        if recorded.signals or recorded.exhausted:
            self._on_recorded(recorded)

    def _postpone(self, item: DueDelivery) -> None:
        """``item`` took a slot but its circuit is open: free the slot, unclaim it."""
        if item.id not in self._slots:
            return
        self._release(item)
        loop = self._event_loop or asyncio.get_running_loop()
        task = loop.create_task(self._unclaim(item), name=f"herald-unclaim-{item.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _unclaim(self, item: DueDelivery) -> None:
        # Cancelled when stopping: its lease is released with the others.
        await retry_storage(
            functools.partial(self._store.unclaim, [(item.id, item.due_at)], owner=self.owner),
            on_error=lambda exc, delay: log.warning(
                "unclaim_failed", error=exc.message, retry_in=delay
            ),
            until=lambda: self._given_up,
        )

    def _release(self, item: DueDelivery) -> None:
        # Wake the claim loop only when this completion makes room it can use (a parked
        # delivery's end frees no room: it took none).
        if self._slots.release(item):
            self._slot.set()
        if self._slots.total == 0:
            self._idle.set()

    async def _renew_leases(self, stop: asyncio.Event) -> None:
        """Keep the leases of claimed deliveries alive while they wait, run or wait to be
        recorded, so another instance takes them over only when this one is gone.
        A failed renewal is tried again soon: the leases are running out."""
        interval = self._limits.lease_seconds / 3
        wait = interval
        while not stop.is_set():
            await asyncio.sleep(wait)
            ours = self._slots.ids() | self._recording
            if not ours:
                continue
            try:
                await self._store.renew_leases(
                    list(ours),
                    owner=self.owner,
                    until=time.time() + self._limits.lease_seconds,
                )
                wait = interval
                self._on_storage("renewal", True)
            except StorageError as exc:
                wait = min(interval, RENEWAL_RETRY_SECONDS)
                self._on_storage("renewal", False)
                log.warning("lease_renewal_failed", error=exc.message, retry_in=wait)

    async def _drain(self) -> None:
        """Let the attempts in flight finish within the grace period; then give up the
        rest (their leases are released: they go again, here or elsewhere)."""
        self._unqueue()
        if self._slots.total == 0:
            return
        try:
            async with asyncio.timeout(self._limits.shutdown_grace):
                await self._idle.wait()
            return
        except TimeoutError:
            pass
        given_up = len(self._slots)
        self._given_up = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        self._slots.abandon()  # what a worker process still answers is ignored
        log.warning("attempts_cancelled_at_shutdown", count=given_up)

    def _unqueue(self) -> None:
        """Stopping: claimed deliveries that wait for a slot are not started now (each
        could take a whole deadline, and a black-holed destination has dozens queued);
        they stay leased to this instance until its leases are released at the end."""
        queued = self._slots.unqueue()
        if queued:
            log.info("queued_deliveries_not_started_at_shutdown", count=len(queued))
        if self._slots.total == 0:
            self._idle.set()

    async def _release_unfinished(self) -> None:
        try:
            released = await self._store.release_leases(owner=self.owner, now=time.time())
        except StorageError as exc:
            self._on_storage("shutdown", False)
            log.error("release_leases_failed", error=exc.message)
            return
        if released:
            log.info("unfinished_deliveries_released", count=released)


def log_attempt(record: AttemptRecord, item: DueDelivery, type_id: str) -> None:
    """The lines of one attempt's outcome: a failure at info, a success only at debug,
    and the lifecycle it ends — a destination verified, a delivery exhausted — at info.

    Here, in the process that records it: an attempt made in a worker process has
    its outcome logged once, with the parent's log."""
    attempt = record.attempt
    if attempt.outcome is Outcome.SUCCESS:
        if debug_enabled():
            log.debug(
                "attempt_succeeded",
                **log_ids(item),
                destination_type=type_id,
                kind=item.kind.value,
                attempt=attempt.number,
                response_status=attempt.response_status,
                duration_ms=attempt.duration_ms,
            )
        if record.activates_destination is not None:
            log.info(
                "destination_verified",
                tenant_id=item.event.tenant_id,
                destination_id=item.destination_id,
                destination_type=type_id,
                status="active",
                attempt=attempt.number,
            )
        return
    log.info(
        "attempt_failed",
        **log_ids(item),
        destination_type=type_id,
        kind=item.kind.value,
        attempt=attempt.number,
        outcome=attempt.outcome.value,
        response_status=attempt.response_status,
        error=attempt.error,
        next_attempt_at=record.next_attempt_at,
    )
    if record.status is DeliveryStatus.FAILURE:
        log_exhausted(record, item, type_id)


def log_exhausted(record: AttemptRecord, item: DueDelivery, type_id: str) -> None:
    """A delivery (or a verification ping) ran out of attempts: nothing resends it."""
    name = (
        "verification_exhausted" if item.kind is DeliveryKind.VERIFICATION else "delivery_exhausted"
    )
    log.info(
        name,
        **log_ids(item),
        destination_type=type_id,
        event_type=item.event.type,
        attempts=record.attempt.number,
        error=record.attempt.error,
    )
