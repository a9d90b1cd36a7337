"""Isolation: nine healthy destinations, with and without one that answers after 4.9 s.

Healthy destinations are nginx paths; the slow one is an aiohttp process
(nginx cannot delay) that answers events 204 after 4.9 s — inside the 5 s
webhook timeout, so every one of its attempts holds a connection and a
concurrency slot for 4.9 s — and the verification ping at once.

Each run is a fresh SQLite Herald with N pre-loaded events subscribed by every
destination. Healthy throughput = healthy deliveries / (spawn → last healthy
success), with the slow destination vs without it; the ratio is the share of
healthy throughput that survives a slow neighbour. The slow destination's own
progress during the run is reported too (at most
``delivery.max_per_destination`` = 64 in flight: 64 / 4.9 s ≈ 13/s).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from bench import receiver
from bench.common import (
    DEFAULT_PHASE_TIMEOUT,
    Deadline,
    grid,
    iso_now,
    load_avg,
    log,
    machine,
    write_named,
)
from bench.daemon import HeraldInstance
from bench.runs import Burst, burst, setup_webhooks
from bench.throughput import SECRET

NAME = "isolation"
HELP = "healthy throughput with vs without one destination answering after 4.9 s"
HEALTHY = 9
EVENTS, QUICK_EVENTS = 5_000, 500
SLOW_SECONDS = 4.9


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--events", type=int, default=None, help=f"events ({EVENTS})")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_EVENTS} events")
    parser.add_argument("--timeout", type=float, default=DEFAULT_PHASE_TIMEOUT)


def _run(
    workdir: Path, urls: list[str], events: int, slow_url: str | None, timeout: float
) -> tuple[Burst, dict[str, Any]]:
    inst = HeraldInstance(workdir)
    all_urls = [*urls, slow_url] if slow_url else urls
    ids = setup_webhooks(inst, all_urls, SECRET, Deadline("setup", timeout))
    healthy = ", ".join(f"'{i}'" for i in ids[: len(urls)])
    inst.preload(events)
    in_healthy = f"destination_id IN ({healthy})"
    result = burst(
        [inst],
        deliveries=events * len(urls),
        events=events,
        deadline=Deadline("isolation", timeout),
        done_sql="SELECT COUNT(*) FROM herald_deliveries WHERE status = 'success'"
        f" AND kind = 'event' AND {in_healthy}",
        delivery_filter=in_healthy,
    )
    slow: dict[str, Any] = {}
    if slow_url:
        slow_id = ids[-1]
        slow["successes"] = inst.db.count(
            "SELECT COUNT(*) FROM herald_deliveries WHERE destination_id = ? AND kind = 'event'"
            " AND status = 'success'",
            (slow_id,),
        )
        slow["attempts_by_outcome"] = dict(
            inst.db.query(
                "SELECT a.outcome, COUNT(*) FROM herald_attempts a JOIN herald_deliveries d"
                " ON d.id = a.delivery_id WHERE d.destination_id = ? AND d.kind = 'event'"
                " GROUP BY a.outcome",
                (slow_id,),
            )
        )
        slow["per_s"] = round(slow["successes"] / result.seconds, 1)
    return result, slow


def run(args: argparse.Namespace) -> int:
    events = args.events or (QUICK_EVENTS if args.quick else EVENTS)
    load_before = load_avg()
    with tempfile.TemporaryDirectory(prefix="herald-bench-") as scratch:
        workdir = Path(scratch)
        with (
            receiver.start("auto", workdir) as recv,
            receiver.aiohttp_receiver(
                workdir, delay=SLOW_SECONDS, delay_prefix="evt_bench", name="slow"
            ) as slow_recv,
        ):
            urls = [f"{recv.base}/healthy/{i}" for i in range(HEALTHY)]
            (workdir / "without").mkdir()
            (workdir / "with").mkdir()
            without, _ = _run(workdir / "without", urls, events, None, args.timeout)
            log(f"without the slow destination: {without.per_s:,.0f} healthy deliveries/s")
            with_slow, slow = _run(workdir / "with", urls, events, slow_recv.url, args.timeout)
            log(f"with the slow destination: {with_slow.per_s:,.0f} healthy deliveries/s")
    load_after = load_avg()
    ratio = with_slow.per_s / without.per_s
    print(
        f"\nisolation, SQLite, {HEALTHY} healthy destinations (nginx) x {events} events;"
        f" {machine()}"
    )
    print(f"load average (1 min) before/after: {load_before}/{load_after}")
    print(
        grid(
            ["run", "healthy deliveries", "seconds", "healthy/s", "slow ok", "slow/s"],
            [
                [
                    "without the slow one",
                    without.deliveries,
                    round(without.seconds, 2),
                    without.per_s,
                    "-",
                    "-",
                ],
                [
                    f"with one answering in {SLOW_SECONDS} s",
                    with_slow.deliveries,
                    round(with_slow.seconds, 2),
                    with_slow.per_s,
                    slow["successes"],
                    slow["per_s"],
                ],
            ],
        )
    )
    print(f"\nhealthy throughput with / without the slow destination: {ratio:.3f}")
    result: dict[str, Any] = {
        "events": events,
        "healthy_destinations": HEALTHY,
        "slow_seconds": SLOW_SECONDS,
        "healthy_per_s_without": round(without.per_s, 1),
        "healthy_per_s_with": round(with_slow.per_s, 1),
        "ratio_with_over_without": round(ratio, 3),
        "slow_destination": slow,
        "rss_peak_mb": {"without": without.rss_mb[0], "with": with_slow.rss_mb[0]},
        "date": iso_now(),
        "machine": machine(),
        "receiver": recv.kind,
        "load_avg_1m": [load_before, load_after],
    }
    if args.quick:
        result["quick"] = True
    write_named(NAME, result, quick=args.quick)
    return 0
