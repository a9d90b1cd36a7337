"""Fan-out: one event to many destinations, and many destinations that mostly do not match.

Two Herald instances (SQLite, fresh files), every destination a signed
webhook on its own nginx path:

- **narrow**: 10 destinations, destination *i* subscribed to ``fan.all`` and
  ``fan.k{i}``.
  1. 10,000 ``fan.all`` events → 100,000 deliveries (deliveries/s);
  2. 10,000 events ``fan.k{j % 10}`` → each matches 1 destination.
- **wide**: 1,000 destinations, destination *i* subscribed to ``fan.k{i}``
  and ``fan.g{i // 3}``.
  1. 1,000 events ``fan.g{j % 333}`` → each matches 3 of the 1,000;
  2. 10,000 events ``fan.k{j % 1000}`` → each matches 1 of the 1,000.

Step 2 of both is the same work (10,000 events, one delivery each); only the
number of destinations that do not match differs, 9 vs 999. Their relay rates
(events ingested per second after the first batch, Herald's own
``ingested_at``) and delivery rates are compared: a ratio near 1 means
subscription matching is not linear in the destinations. The end-to-end
rates include everything else that has per-destination state (catalog,
per-destination limits, adapters), so the matching itself is also timed
alone, in this process: Herald's ``SubscriptionIndex.match`` over the same
patterns and event types, 10 vs 1,000 destinations.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
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
from bench.runs import Burst, burst_range, setup_webhooks
from bench.throughput import SECRET

NAME = "fanout"
HELP = "10,000 events x 10 destinations; 1,000 destinations where few match"
SECOND_PHASE = 1_000_000
"""Event numbers of step 2 start here (ids stay unique per database)."""


@dataclass(frozen=True, slots=True)
class Sizes:
    narrow_dests: int = 10
    narrow_events: int = 10_000
    wide_dests: int = 1_000
    wide_events: int = 1_000
    group: int = 3
    match_events: int = 10_000


QUICK = Sizes(
    narrow_dests=10, narrow_events=1_000, wide_dests=100, wide_events=200, match_events=2_000
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="1,000 x 10; 100 wide; 2,000 to match")
    parser.add_argument("--timeout", type=float, default=DEFAULT_PHASE_TIMEOUT)


def _phase(
    inst: HeraldInstance,
    *,
    start: int,
    events: int,
    deliveries: int,
    type_of: Callable[[int], str],
    timeout: float,
) -> Burst:
    inst.preload(events, start=start, type_of=type_of)
    return burst_range(
        inst,
        start=start,
        events=events,
        deliveries=deliveries,
        deadline=Deadline(f"fan-out from {start}", timeout),
    )


def match_cost(destinations: int, group: int, lookups: int) -> float:
    """Nanoseconds per ``SubscriptionIndex.match`` of a type matching one destination."""
    import time

    from herald.match import SubscriptionIndex

    index: SubscriptionIndex[str] = SubscriptionIndex()
    for i in range(destinations):
        index.add(f"evtd_{i}", [f"fan.k{i}", f"fan.g{i // group}"])
    types = [f"fan.k{j % destinations}" for j in range(lookups)]
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for t in types:
            index.match(t)
        best = min(best, time.perf_counter() - t0)
    return best / lookups * 1e9


def run(args: argparse.Namespace) -> int:
    size = QUICK if args.quick else Sizes()
    load_before = load_avg()
    phases: dict[str, Burst] = {}
    with tempfile.TemporaryDirectory(prefix="herald-bench-") as scratch:
        workdir = Path(scratch)
        with receiver.start("auto", workdir) as recv:
            # --- narrow: 10 destinations ------------------------------------------
            sub = workdir / "narrow"
            sub.mkdir()
            inst = HeraldInstance(sub)
            n = size.narrow_dests
            setup_webhooks(
                inst,
                [f"{recv.base}/narrow/{i}" for i in range(n)],
                SECRET,
                Deadline("setup narrow", args.timeout),
                [["fan.all", f"fan.k{i}"] for i in range(n)],
            )
            phases["narrow_all"] = _phase(
                inst,
                start=0,
                events=size.narrow_events,
                deliveries=size.narrow_events * n,
                type_of=lambda j: "fan.all",
                timeout=args.timeout,
            )
            log(f"{size.narrow_events} events x {n}: {phases['narrow_all'].per_s:,.0f}/s")
            phases["narrow_one"] = _phase(
                inst,
                start=SECOND_PHASE,
                events=size.match_events,
                deliveries=size.match_events,
                type_of=lambda j: f"fan.k{j % n}",
                timeout=args.timeout,
            )
            # --- wide: 1,000 destinations -----------------------------------------
            sub = workdir / "wide"
            sub.mkdir()
            inst = HeraldInstance(sub)
            w, g = size.wide_dests, size.group
            setup_webhooks(
                inst,
                [f"{recv.base}/wide/{i}" for i in range(w)],
                SECRET,
                Deadline("setup wide", args.timeout * 2),
                [[f"fan.k{i}", f"fan.g{i // g}"] for i in range(w)],
            )
            groups = w // g  # only full groups: every event matches exactly g
            phases["wide_few"] = _phase(
                inst,
                start=0,
                events=size.wide_events,
                deliveries=size.wide_events * g,
                type_of=lambda j: f"fan.g{j % groups}",
                timeout=args.timeout,
            )
            phases["wide_one"] = _phase(
                inst,
                start=SECOND_PHASE,
                events=size.match_events,
                deliveries=size.match_events,
                type_of=lambda j: f"fan.k{j % w}",
                timeout=args.timeout,
            )
    load_after = load_avg()
    lookups = 20_000 if args.quick else 200_000
    match_ns = {d: match_cost(d, size.group, lookups) for d in (size.narrow_dests, size.wide_dests)}
    labels = {
        "narrow_all": f"{size.narrow_events} events x {n} destinations (all match)",
        "narrow_one": f"{size.match_events} events, {n} destinations, 1 matches",
        "wide_few": f"{size.wide_events} events, {w} destinations, {g} match",
        "wide_one": f"{size.match_events} events, {w} destinations, 1 matches",
    }
    print(f"\nfan-out, SQLite; {machine()}")
    print(f"receiver {recv.kind}; load average (1 min) before/after: {load_before}/{load_after}")
    print(
        grid(
            ["run", "deliveries", "seconds", "deliveries/s", "relay ev/s", "RSS MiB"],
            [
                [
                    labels[k],
                    b.deliveries,
                    round(b.seconds, 2),
                    b.per_s,
                    b.relay_steady_per_s,
                    b.rss_mb[0],
                ]
                for k, b in phases.items()
            ],
        )
    )
    relay_ratio = phases["wide_one"].relay_steady_per_s / phases["narrow_one"].relay_steady_per_s
    delivery_ratio = phases["wide_one"].per_s / phases["narrow_one"].per_s
    print(
        f"\n1 matching of {w} vs 1 matching of {n}: relay rate ratio {relay_ratio:.2f},"
        f" delivery rate ratio {delivery_ratio:.2f} (1.0 = matching cost independent of"
        " non-matching destinations)"
    )
    match_ratio = match_ns[w] / match_ns[n]
    print(
        f"SubscriptionIndex.match alone: {match_ns[n]:.0f} ns with {n} destinations,"
        f" {match_ns[w]:.0f} ns with {w} ({match_ratio:.2f}x)"
    )
    result: dict[str, Any] = {
        "match_ns": {str(k): round(v, 1) for k, v in match_ns.items()},
        "match_ratio_wide_over_narrow": round(match_ratio, 3),
        "runs": {
            k: {
                "label": labels[k],
                "events": b.events,
                "deliveries": b.deliveries,
                "seconds": round(b.seconds, 3),
                "deliveries_per_s": round(b.per_s, 1),
                "relay_events_per_s": b.relay_steady_per_s,
                "rss_peak_mb": b.rss_mb[0],
            }
            for k, b in phases.items()
        },
        "relay_ratio_wide_over_narrow": round(relay_ratio, 3),
        "delivery_ratio_wide_over_narrow": round(delivery_ratio, 3),
        "date": iso_now(),
        "machine": machine(),
        "receiver": recv.kind,
        "load_avg_1m": [load_before, load_after],
    }
    if args.quick:
        result["quick"] = True
    write_named(NAME, result, quick=args.quick)
    return 0
