"""Measurements shared by several benchmarks: a pre-loaded burst, and a steady flow.

- :func:`burst`: N outbox rows already waiting; start the instance(s), wait for
  every delivery to succeed. Herald's clocks (``updated_at`` of the last
  delivery, ``ingested_at`` of the last event) against the wall time the first
  instance was spawned, so polling only decides when to stop waiting.
- :func:`steady`: instances running and ready; a producer process writes a
  steady rate into the outbox; the receiver's access log gives each event's
  arrival (``$msec``); latency = arrival - ``created_at`` (set at insert).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from bench import cpu
from bench.common import (
    REPO_ROOT,
    BenchError,
    Child,
    Deadline,
    event_id,
    latency_summary,
    log,
    run_cmd,
)
from bench.daemon import HeraldInstance, vm_hwm_mb, wait_count
from bench.db import Database
from bench.receiver import AccessLog, Receiver

EVENT_DONE_SQL = (
    "SELECT COUNT(*) FROM herald_deliveries WHERE status = 'success' AND kind = 'event'"
)


@dataclass(slots=True)
class Burst:
    events: int
    deliveries: int
    seconds: float
    """Spawn of the first instance to the last successful delivery."""
    relay_seconds: float
    """Spawn of the first instance to the last event ingested."""
    rss_mb: list[float]
    relay_steady_per_s: float = 0.0
    """Events ingested per second after the first relay batch committed (start-up excluded)."""
    phase: cpu.Phase | None = None
    """CPU of the ``cpu_groups`` over the delivery phase (first delivery seen to the last)."""

    @property
    def per_s(self) -> float:
        return self.deliveries / self.seconds if self.seconds > 0 else 0.0

    @property
    def relay_per_s(self) -> float:
        return self.events / self.relay_seconds if self.relay_seconds > 0 else 0.0


def start_all(instances: Sequence[HeraldInstance]) -> list[Child]:
    return [inst.start() for inst in instances]


def stop_all(instances: Sequence[HeraldInstance], children: Sequence[Child]) -> None:
    errors = []
    for inst, child in zip(instances, children, strict=True):
        try:
            inst.stop(child)
        except BenchError as exc:
            errors.append(str(exc))
    if errors:
        raise BenchError("; ".join(errors))


def burst(
    instances: Sequence[HeraldInstance],
    *,
    deliveries: int,
    events: int,
    deadline: Deadline,
    done_sql: str = EVENT_DONE_SQL,
    event_filter: str = "1 = 1",
    delivery_filter: str = "1 = 1",
    cpu_groups: Callable[[Sequence[Child]], Mapping[str, cpu.Finder]] | None = None,
) -> Burst:
    """Start ``instances`` and wait until ``done_sql`` counts ``deliveries``; then stop them.

    With ``cpu_groups`` (the groups of processes to meter, given the instances'
    children), the result's ``phase`` holds their CPU over the delivery phase.
    """
    db = instances[0].db
    children = start_all(instances)
    t_spawn = children[0].started_wall
    meter = cpu.CpuMeter(cpu_groups(children)) if cpu_groups else None
    first: list[float] = []  # deliveries done and monotonic time at the phase's start

    def on_poll(done: int) -> None:
        if meter is None:
            return
        if meter.started:
            meter.sample()
        elif done > 0:
            meter.start()
            first.extend((done, time.monotonic()))

    try:
        wait_count(
            db,
            done_sql,
            deliveries,
            children=children,
            deadline=deadline,
            what="delivered",
            on_poll=on_poll,
        )
        phase = None
        if meter is not None:
            if not meter.started:  # everything done by the first poll that saw any
                meter.start()
                first.extend((deliveries, time.monotonic()))
            used = meter.stop()
            phase = cpu.Phase(
                deliveries - int(first[0]), time.monotonic() - first[1], used, meter.machine_busy_s
            )
        rss = [round(vm_hwm_mb(c.pid), 1) for c in children]
    except BaseException:
        for c in children:
            c.stop(timeout=10)
        raise
    stop_all(instances, children)
    last = db.scalar(
        "SELECT MAX(updated_at) FROM herald_deliveries WHERE status = 'success'"
        f" AND kind = 'event' AND {delivery_filter}"
    )
    relayed = db.scalar(f"SELECT MAX(ingested_at) FROM herald_events WHERE {event_filter}")
    return Burst(
        events,
        deliveries,
        float(last) - t_spawn,
        float(relayed) - t_spawn,
        rss,
        relay_steady_rate(db, event_filter),
        phase,
    )


def relay_steady_rate(db: Database, event_filter: str) -> float:
    """Events/s between the first and the last relay commit (the first batch not counted)."""
    first, last = db.query(
        f"SELECT MIN(ingested_at), MAX(ingested_at) FROM herald_events WHERE {event_filter}"
    )[0]
    if first is None or last is None or last <= first:
        return 0.0
    after_first = db.count(
        f"SELECT COUNT(*) FROM herald_events WHERE {event_filter} AND ingested_at > ?", (first,)
    )
    return round(after_first / (float(last) - float(first)), 1)


@dataclass(slots=True)
class Steady:
    events: int
    rate: float
    """What the producer achieved."""
    latency: dict[str, float]
    arrived: int
    producer_max_lag_ms: float
    rss_mb: list[float] = field(default_factory=list)
    delivered_per_s: float = 0.0
    """Arrivals per second between the first and the last arrival."""


def run_producer(db: Database, *, rate: float, seconds: float, start: int) -> dict[str, float]:
    argv = [sys.executable, "-m", "bench.producer", "--db-url", db.url]
    argv += ["--rate", str(rate), "--seconds", str(seconds), "--start", str(start)]
    out = run_cmd(argv, timeout=seconds * 3 + 60, what="bench.producer", cwd=REPO_ROOT)
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def steady(
    instances: Sequence[HeraldInstance],
    recv: Receiver,
    path: str,
    *,
    rate: float,
    seconds: float,
    start: int,
    deadline: Deadline,
    drain_timeout: float = 120.0,
) -> Steady:
    """Instances up and ready, a producer at ``rate`` for ``seconds``, every event received.

    The destination must point at ``recv.base + path``.
    """
    if recv.access_log is None:
        raise BenchError("the latency measurement needs a receiver with an access log")
    db = instances[0].db
    accesses = AccessLog(recv.access_log)
    accesses.read_new()
    children = start_all(instances)
    arrivals: dict[str, float] = {}
    try:
        for inst, child in zip(instances, children, strict=True):
            inst.wait_ready(child, deadline)
        log(f"producer: {rate:g} events/s for {seconds:g} s into {db.kind}")
        produced = run_producer(db, rate=rate, seconds=seconds, start=start)
        total = int(produced["inserted"])
        expected = {event_id(start + i) for i in range(total)}
        drain = Deadline("drain", min(drain_timeout, max(1.0, deadline.remaining)))
        while True:
            for hit in accesses.read_new():
                if (
                    hit.uri == path
                    and 200 <= hit.status < 300
                    and hit.webhook_id in expected
                    and hit.webhook_id not in arrivals
                ):
                    arrivals[hit.webhook_id] = hit.ts
            if len(arrivals) >= total:
                break
            for c in children:
                if not c.alive():
                    raise BenchError(f"{c.name} exited:\n{c.log_tail()}")
            drain.check(f"{len(arrivals)}/{total} arrived")
            time.sleep(0.25)
        rss = [round(vm_hwm_mb(c.pid), 1) for c in children]
    except BaseException:
        for c in children:
            c.stop(timeout=10)
        raise
    stop_all(instances, children)
    created = dict(
        db.query(
            "SELECT id, created_ts FROM herald_events WHERE id >= ? AND id <= ?",
            (min(arrivals), max(arrivals)),
        )
    )
    lat = [ts - float(created[i]) for i, ts in arrivals.items() if i in created]
    if len(lat) != total:
        raise BenchError(f"{total - len(lat)} received events have no stored created_at")
    span = max(arrivals.values()) - min(arrivals.values())
    return Steady(
        events=total,
        rate=round(float(produced["rate"]), 1),
        latency=latency_summary(lat),
        arrived=len(arrivals),
        producer_max_lag_ms=float(produced["max_lag_ms"]),
        rss_mb=rss,
        delivered_per_s=round(total / span, 1) if span > 0 else 0.0,
    )


def setup_webhooks(
    inst: HeraldInstance,
    urls: Sequence[str],
    secret: str,
    deadline: Deadline,
    events: Sequence[Sequence[str]] | None = None,
) -> list[str]:
    """Migrate, create one signed webhook per URL (bulk when many), run until all are active."""
    inst.migrate()
    patterns = events or [["*"]] * len(urls)
    if len(urls) == 1:
        ids = [inst.create_webhook(urls[0], secret, patterns[0])]
    else:
        bodies = [
            {
                "name": f"bench {n}",
                "type": "webhook",
                "events": list(p),
                "webhook": {"url": url, "secret": secret},
            }
            for n, (url, p) in enumerate(zip(urls, patterns, strict=True))
        ]
        ids = inst.create_destinations(bodies)
    inst.activate(ids, deadline)
    return ids


def id_range(start: int, count: int, column: str) -> str:
    """SQL: ``column`` is one of the bench event ids ``start``…``start+count-1``."""
    return f"{column} BETWEEN '{event_id(start)}' AND '{event_id(start + count - 1)}'"


def burst_range(
    inst: HeraldInstance,
    *,
    start: int,
    events: int,
    deliveries: int,
    deadline: Deadline,
    extra: str = "1 = 1",
) -> Burst:
    """:func:`burst` counting only the deliveries of events ``start``…``start+events-1``."""
    done = f"{id_range(start, events, 'event_id')} AND {extra}"
    return burst(
        [inst],
        deliveries=deliveries,
        events=events,
        deadline=deadline,
        done_sql="SELECT COUNT(*) FROM herald_deliveries WHERE status = 'success'"
        f" AND kind = 'event' AND {done}",
        event_filter=id_range(start, events, "id"),
        delivery_filter=done,
    )
