"""The daemon: run the relay, the dispatcher and the HTTP server of one Herald process."""

from __future__ import annotations

import asyncio
import errno
import functools
import os
import signal
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import structlog
from aiohttp import web

from herald import __version__
from herald.api import ops, server, v2
from herald.api.ops import ReadinessCheck
from herald.config import Settings, mask_secrets
from herald.console import web as console
from herald.dispatch import Dispatcher
from herald.errors import ConfigError, HeraldError, StorageError
from herald.gctune import settle_after_startup
from herald.ids import new_id
from herald.metrics import DatabaseCounts, Metrics
from herald.model import Instance, Recorded
from herald.outbox import Relay
from herald.replayer import Replayer
from herald.sourcedb import check_driver, open_source
from herald.sources import SourceReader, SourceState
from herald.systemd import Notifier
from herald.wiring import Components, InstanceLock, components, delivery_limits, encryption_key
from herald.workers import Forked, WorkerPool, run_dispatcher

log = structlog.get_logger("herald")

READINESS_TIMEOUT = 2.0


@dataclass(slots=True)
class _Parts:
    """What one daemon runs, as :meth:`Daemon._wire` connects it."""

    comp: Components
    dispatcher: Dispatcher
    relay: Relay
    pool: WorkerPool | None
    replayer: Replayer
    sources: list[SourceReader] = field(default_factory=list)
    """One reader per ``[[outbox.sources]]`` entry (``herald.sources``)."""

    def changed(self) -> None:
        """Destinations or deliveries changed in this process: every part looks again."""
        if self.pool is not None:
            self.pool.changed()
        self.dispatcher.rescan()
        self.relay.wake()
        for reader in self.sources:
            reader.wake()


class Daemon:
    """``herald run``: relay, workers and the HTTP server until SIGTERM/SIGINT."""

    def __init__(
        self,
        settings: Settings,
        *,
        config_path: Path | None = None,
        forked: list[Forked] | None = None,
    ) -> None:
        self.settings = settings
        self.config_path = config_path
        self.forked = forked
        """Attempt processes forked before the event loop started (herald.workers)."""
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{new_id('')[:10]}"
        started = time.time()
        self.instance = Instance(
            self.owner, socket.gethostname(), os.getpid(), __version__, started, started
        )
        self.stop = asyncio.Event()
        self.exit_code = 0
        self.beat_error: str | None = None
        """Why the last heartbeat (a write every delivery.heartbeat_seconds, idle or
        not) failed; None once one succeeds. /readyz reports it."""
        self.key = b""
        self.metrics = Metrics(per_destination=settings.metrics.per_destination)
        self.notifier = Notifier()

    async def run(self) -> int:
        for source in self.settings.outbox.sources:
            check_driver(source)  # one line that says what to install, before anything
        lock = None
        db_path = self.settings.database.sqlite_path
        if db_path is not None:
            lock = InstanceLock(db_path)
            lock.acquire()
        try:
            self.key = encryption_key(self.settings)
            async with components(self.settings) as comp:
                return await self._serve(comp)
        finally:
            if lock is not None:
                lock.release()

    async def _serve(self, comp: Components) -> int:
        parts = self._wire(comp)
        await self._recover(comp)
        await comp.catalog.refresh(force=True)
        expected_schema = await comp.store.schema_version()
        await self._beat(comp, parts.dispatcher, first=True)
        if parts.pool is not None:
            # Before the API and the relay: no attempt waits for a child's start-up.
            await parts.pool.start()
        runners = await self._listen(
            parts, functools.partial(self._problems, parts, expected_schema)
        )
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        loop.add_signal_handler(signal.SIGHUP, self._reload)
        settle_after_startup()
        try:
            await self._run(parts)
            await self._unregister(comp)
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.remove_signal_handler(sig)
            for runner in runners:
                await runner.cleanup()
            log.info("herald_stopped", exit_code=self.exit_code)
        return self.exit_code

    def _wire(self, comp: Components) -> _Parts:
        """The dispatcher, its attempt processes, the relay that feeds it, and the
        service's change signal that tells them all."""
        s = self.settings
        pool = None
        if s.delivery.worker_processes > 1:
            pool = WorkerPool(
                s,
                config_path=self.config_path,
                forked=self.forked,
                pinned=comp.catalog.rate_limited,
            )
        dispatcher = Dispatcher(
            comp.store,
            comp.catalog,
            comp.policy,
            delivery_limits(s.delivery),
            owner=self.owner,
            on_attempt=self.metrics.attempt_recorded,
            submit=None if pool is None else pool.submit,
            on_storage=self.metrics.database_result,
            on_recorded=lambda recorded: self._recorded(recorded, relay),
        )
        relay = Relay(
            comp.store,
            comp.catalog,
            comp.policy,
            batch_size=s.relay.batch_size,
            poll_interval=s.relay.poll_interval_seconds,
            idle_poll=s.relay.idle_poll_seconds,
            max_payload_bytes=s.relay.max_payload_bytes,
            on_deliveries=dispatcher.wake,
            on_batch=self.metrics.relayed,
            # New deliveries go straight to this instance's dispatcher, leased in the
            # relay's transaction, as far as it has room (herald.handover).
            handover=dispatcher.handover,
            on_storage=self.metrics.database_result,
        )
        self.metrics.track_inflight(lambda: dispatcher.inflight)
        self.metrics.track_taken(lambda: dispatcher.taken)

        # Up = running and able to use the database; /readyz says the same in words.
        # "workers" is the dispatcher's old label, reported beside it for one release
        # (README, Changes): dashboards and alerts built on it keep working meanwhile.
        def dispatching() -> bool:
            return dispatcher.running and dispatcher.storage_error is None

        self.metrics.track_components(
            relay=lambda: relay.running and relay.storage_error is None,
            dispatcher=dispatching,
            workers=dispatching,
            recorder=lambda: dispatcher.running and dispatcher.recorder.storage_error is None,
        )
        # The console's replays run in the background at the API's pace.
        rate = s.delivery.replay_rate_per_second or None
        parts = _Parts(
            comp, dispatcher, relay, pool, Replayer(comp.service.replays, rate_per_second=rate)
        )
        # A change made through the service (by the API, the console, a replay) wakes
        # every part once; the faces signal nothing themselves.
        comp.service.when_changed = parts.changed
        parts.sources = [
            SourceReader(
                open_source(source),
                relay,
                comp.store,
                owner=self.owner,
                batch_size=s.relay.batch_size,
                poll_interval=source.poll_interval_seconds,
                idle_poll=s.relay.idle_poll_seconds,
                on_state=self._source_state,
                on_error=lambda name: self.metrics.source_failed(),
            )
            for source in s.outbox.sources
        ]
        return parts

    def _source_state(self, state: SourceState) -> None:
        self.metrics.source_state(
            state.name,
            up=state.state in ("up", "standby"),
            pending=state.pending if state.state == "up" else None,
            oldest=state.oldest,
        )

    def _recorded(self, recorded: Recorded, relay: Relay) -> None:
        """A recording committed deliveries exhausted or operational events (which wait
        in the outbox: the relay takes them now rather than at its next poll)."""
        self.metrics.signals_recorded(recorded)
        if recorded.signals:
            relay.wake()

    async def _recover(self, comp: Components) -> None:
        if self.settings.database.sqlite_path is not None:
            # Single instance: any lease or instance row left behind is a previous run's.
            now = time.time()
            await comp.store.reap_instances(stale_before=now, now=now)
            released = await comp.store.release_leases(owner=None, now=now)
            if released:
                log.info("recovered_inflight_deliveries", count=released)
            # A replay the previous run was re-queuing (killed: a stop ends its own).
            ended = await comp.store.end_unfinished_replays(now=now)
            if ended:
                log.warning("replays_cut_short_by_a_previous_run", count=ended)

    async def _problems(self, parts: _Parts, expected_schema: int) -> dict[str, str]:
        """/readyz: what keeps this instance from doing its work, by component."""
        store, relay, dispatcher = parts.comp.store, parts.relay, parts.dispatcher
        problems: dict[str, str] = {}
        try:
            async with asyncio.timeout(READINESS_TIMEOUT):
                await store.ping()
                if await store.schema_version() < expected_schema:
                    problems["migrations"] = "schema is behind this Herald"
            self.metrics.database_result("readiness", True)
        except TimeoutError:
            self.metrics.database_result("readiness", False)
            problems["database"] = f"no answer within {READINESS_TIMEOUT:g} s"
        except StorageError as exc:
            self.metrics.database_result("readiness", False)
            problems["database"] = exc.message
        if "database" not in problems and self.beat_error is not None:
            # Reads (the ping) can work while every write fails, and an idle pipeline
            # writes nothing but the heartbeat (every delivery.heartbeat_seconds): it is
            # the write probe, at no round trip of /readyz's own, and its next success
            # clears it. (herald_database_up remembers a failed loop up to 30 s.)
            problems["database"] = f"cannot write to the database: {self.beat_error}"
        if not relay.running:
            problems["relay"] = "not running"
        elif relay.storage_error is not None:
            # Reads can work while writes fail (disk full, read-only database).
            problems["relay"] = f"cannot write to the database: {relay.storage_error}"
        if not dispatcher.running:
            problems["dispatcher"] = "not running"
        elif dispatcher.storage_error is not None:
            problems["dispatcher"] = f"cannot use the database: {dispatcher.storage_error}"
        if "dispatcher" in problems:
            problems["workers"] = problems["dispatcher"]  # the old name, for one release
        return problems

    async def _listen(self, parts: _Parts, readiness: ReadinessCheck) -> list[web.AppRunner]:
        """Serve the API, and /metrics on a listener of its own when metrics.listen says
        so; a port that cannot be had stops the start (and the children)."""
        s = self.settings
        app = web.Application(client_max_size=s.api.max_body_bytes)
        own = s.metrics.listen is not None
        ops.add_routes(app, readiness=readiness, metrics=self.metrics, scrape=not own)
        api = v2.Api(
            parts.comp.service,
            access=parts.comp.access,
            settings=s,
            cursor_key=self.key,
            metrics=self.metrics,
        )
        api.setup(app)
        # One budget per tenant (the process's access): the portal's pages count against
        # the tenant's API limit.
        console.setup(
            app,
            parts.comp.service,
            access=parts.comp.access,
            settings=s,
            replayer=parts.replayer,
            sources=lambda: [reader.state.as_dict() for reader in parts.sources],
        )
        runners: list[web.AppRunner] = [server.Runner(app, s.api)]
        sites = [("api.listen", s.api.listen, s.api.host, s.api.port)]
        if own:
            scrape = web.Application()
            ops.add_routes(scrape, readiness=readiness, metrics=self.metrics)
            # Caps of its own: a flood of the API's port leaves the probes answering here.
            runners.append(server.Runner(scrape, s.api))
            sites.append(("metrics.listen", s.metrics.listen or "", s.metrics.host, s.metrics.port))
        for runner, (key, listen, host, port) in zip(runners, sites, strict=True):
            await runner.setup()
            try:
                await web.TCPSite(runner, host, port, reuse_address=True).start()
            except OSError as exc:
                for started in runners:
                    await started.cleanup()
                if parts.pool is not None:
                    await parts.pool.stop()
                in_use = exc.errno == errno.EADDRINUSE
                raise ConfigError(
                    f"{key}: cannot listen on {listen}: {exc.strerror}",
                    hint=(
                        f"Stop what listens on {listen} (another herald run?), or give"
                        f" this one another port with {key} (HERALD_"
                        f"{key.upper().replace('.', '__')}=127.0.0.1:PORT)."
                        if in_use
                        else None
                    ),
                ) from exc
        return runners

    async def _run(self, parts: _Parts) -> None:
        """Run the parts until a signal or the first of them to end; then stop them all."""
        tasks, side = self._start(parts)
        s = self.settings
        log.info(
            "herald_started",
            listen=s.api.listen,
            database=mask_secrets(s.database.url).split("@")[-1],
            destinations=len(parts.comp.catalog),
            pid=os.getpid(),
        )
        self.notifier.ready(f"serving on {s.api.listen}")
        done, _ = await asyncio.wait(
            [*tasks, *side, asyncio.ensure_future(self.stop.wait())],
            return_when=asyncio.FIRST_COMPLETED,
        )
        for task in [*tasks, *side]:
            if task in done and not self.stop.is_set():
                # A side task must never die quietly and leave a zombie daemon.
                log.error("task_died", task=task.get_name(), error=repr(task.exception()))
                self.exit_code = 1
        self.stop.set()
        self.notifier.stopping()
        # Before the engine: a replay still re-queuing ends between two batches.
        await parts.replayer.stop()
        for task in side:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*side, return_exceptions=True)
        for task, result in zip(tasks, results, strict=True):
            if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                error = result.message if isinstance(result, HeraldError) else repr(result)
                log.error("task_failed", task=task.get_name(), error=error)
                self.exit_code = 1

    def _start(self, parts: _Parts) -> tuple[list[asyncio.Task[None]], list[asyncio.Task[None]]]:
        """The tasks of the engine, and the side tasks that only serve it."""
        comp, relay, dispatcher = parts.comp, parts.relay, parts.dispatcher
        tasks = [
            asyncio.create_task(relay.run(self.stop), name="herald-relay"),
            asyncio.create_task(
                run_dispatcher(dispatcher, parts.pool, self.stop), name="herald-dispatcher"
            ),
            *(
                asyncio.create_task(reader.run(self.stop), name=f"herald-source-{reader.name}")
                for reader in parts.sources
            ),
        ]
        side = [
            asyncio.create_task(self._refresh_gauges(comp), name="herald-gauges"),
            asyncio.create_task(self._watchdog(relay, dispatcher), name="herald-watchdog"),
            asyncio.create_task(self._retention(comp), name="herald-retention"),
            asyncio.create_task(self._heartbeat(comp, dispatcher), name="herald-heartbeat"),
        ]
        return tasks, side

    async def _unregister(self, comp: Components) -> None:
        try:
            # The dispatcher released its leases when it stopped; the relay's last
            # batch may have leased more to it after that (herald.handover).
            released = await comp.store.release_leases(owner=self.owner, now=time.time())
            if released:
                log.info("unfinished_deliveries_released", count=released)
            # Nothing is left to reap.
            await comp.store.remove_instance(self.owner)
        except StorageError as exc:
            self.metrics.database_result("shutdown", False)
            log.warning("instance_unregister_failed", error=exc.message)

    async def _refresh_gauges(self, comp: Components) -> None:
        """Database-backed gauges on an interval, so a scrape never costs a query."""
        interval = self.settings.metrics.refresh_seconds
        store = comp.store
        while not self.stop.is_set():
            try:
                now = time.time()
                pending, oldest = await store.outbox_stats()
                counts = DatabaseCounts(
                    outbox_pending=pending,
                    outbox_oldest=oldest,
                    deliveries=await store.delivery_counts(now=now),
                    next_due_at=await store.next_due_at(),
                    destinations=await store.destination_counts(),
                    replays=await store.replay_counts(),
                    failing=await store.failing_count(),
                    open_circuits=await store.open_circuits(),
                )
            except StorageError as exc:
                # Dropped, not frozen: a stale count would hide the outage it comes from.
                self.metrics.database_count_failed()
                self.metrics.database_result("gauges", False)
                log.warning("gauge_refresh_failed", error=exc.message)
            else:
                self.metrics.database_counted(counts, now=now)
                self.metrics.database_result("gauges", True)
            await asyncio.sleep(interval)

    async def _heartbeat(self, comp: Components, dispatcher: Dispatcher) -> None:
        while not self.stop.is_set():
            await asyncio.sleep(self.settings.delivery.heartbeat_seconds)
            await self._beat(comp, dispatcher)

    async def _beat(self, comp: Components, dispatcher: Dispatcher, *, first: bool = False) -> None:
        """Tell peers this instance lives; release what dead peers had leased.

        Leases alone would bring a killed instance's deliveries back after
        ``lease_seconds``; heartbeats bring them back after ``instance_timeout_seconds``.
        """
        d = self.settings.delivery
        now = time.time()
        try:
            known = await comp.store.heartbeat(self.instance, now=now)
            reaped = await comp.store.reap_instances(
                stale_before=now - d.instance_timeout_seconds, now=now
            )
            instances = await comp.store.list_instances()
        except StorageError as exc:
            self.beat_error = exc.message
            self.metrics.database_result("heartbeat", False)
            self.metrics.instances_unknown()
            log.warning("heartbeat_failed", error=exc.message)
            return
        self.beat_error = None
        self.metrics.database_result("heartbeat", True)
        if not known and not first:
            # Peers took us for dead (a stall longer than instance_timeout_seconds) and
            # released our leases: attempts we still run may also be made by them.
            log.warning("instance_was_presumed_dead", instance=self.owner)
        for instance_id, released in reaped.items():
            log.warning("instance_presumed_dead", instance=instance_id, released=released)
        if reaped:
            self.metrics.reaped(reaped)
            dispatcher.rescan()
        self.metrics.instances_seen(instances, now=now, timeout=d.instance_timeout_seconds)

    async def _retention(self, comp: Components) -> None:
        """Delete finished history older than ``retention.days``, a batch at a time."""
        cfg = self.settings.retention
        if cfg.days <= 0:
            await self.stop.wait()
            return
        while not self.stop.is_set():
            cutoff = time.time() - cfg.days * 86400
            total = 0
            try:
                while not self.stop.is_set():
                    removed = await comp.store.purge(before=cutoff, limit=cfg.batch_size)
                    total += removed
                    if removed < cfg.batch_size:
                        break
                    await asyncio.sleep(0)  # let deliveries interleave between batches
                self.metrics.database_result("retention", True)
            except StorageError as exc:
                self.metrics.database_result("retention", False)
                log.warning("retention_failed", error=exc.message)
            if total:
                log.info("retention_purged", deliveries=total, older_than_days=cfg.days)
            await asyncio.sleep(cfg.interval_seconds)

    async def _watchdog(self, relay: Relay, dispatcher: Dispatcher) -> None:
        """Ping systemd's watchdog only while the loop turns and the workers live."""
        interval = self.notifier.watchdog_interval
        if interval is None:
            await self.stop.wait()
            return
        while not self.stop.is_set():
            if relay.running and dispatcher.running:
                self.notifier.watchdog()
            await asyncio.sleep(interval)

    def _reload(self) -> None:
        """SIGHUP: re-read the log level from the config file."""
        from herald.config import load_settings
        from herald.logs import set_level

        try:
            level = load_settings(self.config_path).log.level
        except ConfigError as exc:
            log.error("reload_failed", error=exc.message)
            return
        set_level(level)
        log.info("reloaded", log_level=level)

    def _on_signal(self, sig: signal.Signals) -> None:
        log.info("shutdown_requested", signal=sig.name)
        self.stop.set()
