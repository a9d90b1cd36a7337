"""Fair share: a healthy tenant's latency alone, and beside a tenant whose receivers hang.

Tenant ``default`` (the healthy one) has one webhook destination on the usual
receiver (nginx, or the aiohttp fallback); a producer writes its events at a steady
``--rate`` for ``--seconds``, and latency is outbox to receiver, per event, as in
``bench latency``. Tenant ``hung`` has five destinations on an aiohttp receiver that
holds every event request open for an hour (and answers the verification ping at
once): each of its attempts holds a slot for the whole ``webhook_timeout_seconds``
(5 s), and ``--hung-events`` events (1,000: 5,000 deliveries, far more than its slots
take in a run) wait in the outbox ahead of the healthy tenant's, due first.

Three phases, each a fresh Herald (SQLite by default) with the default config:

- ``alone``: the healthy tenant only;
- ``beside``: the hung tenant's backlog too, under the default
  ``delivery.max_per_tenant`` (half of ``max_concurrency``);
- ``beside, no cap``: the same with ``max_per_tenant = max_concurrency``, as before
  the cap existed: the hung tenant's five destinations may take every slot
  (5 × ``max_per_destination`` 64 > 256).

The figure is the healthy tenant's p99 beside / alone (the goal: at most 2).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import receiver
from bench.common import (
    DEFAULT_PHASE_TIMEOUT,
    EVENT_TYPE,
    Deadline,
    grid,
    iso_ms,
    iso_now,
    load_avg,
    log,
    machine,
    payload,
    write_named,
)
from bench.daemon import HeraldInstance
from bench.db import database
from bench.latency import LATENCY_HEADER, latency_row, steady_json
from bench.runs import Steady, setup_webhooks, steady
from bench.throughput import SECRET

NAME = "fairshare"
HELP = "a healthy tenant's latency p99 alone vs beside a tenant with hanging receivers"
RATE, SECONDS = 200.0, 20.0
QUICK_RATE, QUICK_SECONDS = 100.0, 5.0
HUNG_TENANT = "hung"
HUNG_DESTINATIONS = 5
HUNG_EVENTS, QUICK_HUNG_EVENTS = 1000, 300
HUNG_PREFIX = "evt_hung"
HANG_SECONDS = 3600.0
PHASES = ("alone", "beside", "beside, no cap")
MAX_CONCURRENCY = 256
"""``delivery.max_concurrency``'s default, set explicitly in the no-cap phase."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rate", type=float, default=None, help=f"events/s ({RATE:g})")
    parser.add_argument("--seconds", type=float, default=None, help=f"duration ({SECONDS:g})")
    parser.add_argument(
        "--hung-events", type=int, default=None, help=f"the hung tenant's ({HUNG_EVENTS})"
    )
    parser.add_argument("--backend", default="sqlite", choices=("sqlite", "postgres"))
    parser.add_argument("--quick", action="store_true", help="100 events/s for 5 s")
    parser.add_argument("--timeout", type=float, default=DEFAULT_PHASE_TIMEOUT)


def hung_destinations(inst: HeraldInstance, url: str) -> list[str]:
    """The hung tenant's five destinations (created as an operator does, per tenant)."""
    ids = []
    for n in range(HUNG_DESTINATIONS):
        body = {
            "name": f"hung {n}",
            "type": "webhook",
            "events": ["*"],
            "webhook": {"url": f"{url}/{n}", "secret": SECRET},
        }
        out = inst.cli(
            "destinations", "create", "--tenant", HUNG_TENANT, "--json", "--data", json.dumps(body)
        )
        ids.append(str(json.loads(out)["id"]))
    return ids


def phase(
    name: str,
    workdir: Path,
    recv: receiver.Receiver,
    *,
    backend: str,
    rate: float,
    seconds: float,
    hung_events: int,
    start: int,
    timeout: float,
) -> Steady:
    sub = workdir / name.replace(", ", "-").replace(" ", "-")
    sub.mkdir()
    overrides: dict[str, dict[str, object]] = {}
    if name == "beside, no cap":
        overrides["delivery"] = {
            "max_concurrency": MAX_CONCURRENCY,
            "max_per_tenant": MAX_CONCURRENCY,
        }
    with database(backend, sub) as db, contextlib.ExitStack() as stack:
        inst = HeraldInstance(sub, overrides, db=db)
        path = f"/fair-{sub.name}"
        setup = Deadline("setup", timeout)
        if name == "alone":
            setup_webhooks(inst, [recv.base + path], SECRET, setup)
        else:
            hung = stack.enter_context(
                receiver.aiohttp_receiver(
                    sub, delay=HANG_SECONDS, delay_prefix=HUNG_PREFIX, name="hung"
                )
            )
            inst.migrate()
            ids = hung_destinations(inst, hung.base)
            ids.append(inst.create_webhook(recv.base + path, SECRET))
            inst.activate(ids, setup)
            # Due first: the backlog is in the outbox before the daemon starts.
            stamp = iso_ms(time.time())
            inst.db.insert_outbox(
                (f"{HUNG_PREFIX}{i:010d}", HUNG_TENANT, EVENT_TYPE, payload(i).decode(), stamp)
                for i in range(hung_events)
            )
            log(f"{name}: {hung_events} events x {HUNG_DESTINATIONS} hung destinations")
        return steady(
            [inst],
            recv,
            path,
            rate=rate,
            seconds=seconds,
            start=start,
            deadline=Deadline(f"fairshare {name}", seconds + timeout),
        )


def run(args: argparse.Namespace) -> int:
    rate = args.rate or (QUICK_RATE if args.quick else RATE)
    seconds = args.seconds or (QUICK_SECONDS if args.quick else SECONDS)
    hung_events = args.hung_events or (QUICK_HUNG_EVENTS if args.quick else HUNG_EVENTS)
    load_before = load_avg()
    results: dict[str, Steady] = {}
    with tempfile.TemporaryDirectory(prefix="herald-bench-") as scratch:
        workdir = Path(scratch)
        with receiver.start("auto", workdir) as recv:
            for n, name in enumerate(PHASES):
                results[name] = phase(
                    name,
                    workdir,
                    recv,
                    backend=args.backend,
                    rate=rate,
                    seconds=seconds,
                    hung_events=hung_events,
                    start=n * 10_000_000,
                    timeout=args.timeout,
                )
                log(f"{name}: {results[name].latency}")
    load_after = load_avg()
    alone = results["alone"].latency["p99_ms"]
    ratios = {name: round(s.latency["p99_ms"] / alone, 2) for name, s in results.items()}
    print(
        f"\nfair share ({args.backend}): the healthy tenant at {rate:g} events/s for"
        f" {seconds:g} s, alone and beside {HUNG_DESTINATIONS} hung destinations of another"
        f" tenant ({hung_events} events); {machine()}"
    )
    print(f"receiver {recv.kind}; load average (1 min) before/after: {load_before}/{load_after}")
    print(
        grid(
            [*LATENCY_HEADER, "p99 / alone"],
            [[*latency_row(name, s), ratios[name]] for name, s in results.items()],
        )
    )
    result: dict[str, Any] = {
        "backend": args.backend,
        "rate_per_s": rate,
        "seconds": seconds,
        "hung_events": hung_events,
        "hung_destinations": HUNG_DESTINATIONS,
        **{name: steady_json(s) for name, s in results.items()},
        "p99_beside_over_alone": ratios["beside"],
        "p99_beside_no_cap_over_alone": ratios["beside, no cap"],
        "date": iso_now(),
        "machine": machine(),
        "receiver": recv.kind,
        "load_avg_1m": [load_before, load_after],
    }
    if args.quick:
        result["quick"] = True
    write_named(f"{NAME}_{args.backend}", result, quick=args.quick)
    return 0
