"""Every console and portal page's latency at 1,000,000 deliveries and 1,000 destinations.

For each backend (SQLite, then PostgreSQL) a fresh database gets Herald's
migrations and the data set of ``bench/query_plans.py`` (``--rows`` deliveries
over 32 days to 500 busy destinations of 20 tenants, 95 % finished, a retry
backlog in the newest quarter), then 1,000 destination rows (the 500 with
deliveries and 500 idle ones), their counters (24 full hours each), 50 replays
and an operator key. The console is served
in-process on a free port (the same ``herald.console.web.setup`` as ``herald
run``, without the engine: nothing else competes for the database), an HTTP
client signs in as a browser does and fetches each page ``--repeat`` times; then
it opens the portal of the busiest destination's tenant with a session token and
does the same with the portal's pages.
p50, p95 and max per page go to ``bench/results/console.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import grid, iso_now, load_avg, log, machine, percentile, write_named
from bench.query_plans import Shape, load_postgres, load_sqlite, settings_for

NAME = "console"
HELP = "time every console page at 1,000,000 deliveries and 1,000 destinations"
ROWS, QUICK_ROWS = 1_000_000, 20_000
DESTINATIONS = 1_000
REPEAT = 20
BACKENDS = ("sqlite", "postgres")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_ROWS:,} deliveries")
    parser.add_argument("--rows", type=int, default=0, help=f"deliveries (default {ROWS:,})")
    parser.add_argument("--repeat", type=int, default=REPEAT, help="requests per page")
    parser.add_argument("--backend", choices=BACKENDS, action="append", help="default: both")


def _settings(url: str) -> Any:
    """query_plans' settings, with the rate limit out of the way of the measurement."""
    settings = settings_for(url)
    api = settings.api.model_copy(update={"rate_limit_requests": 1_000_000})
    return settings.model_copy(update={"api": api})


def pages(shape: Shape, event_id: str, replay_id: str) -> list[tuple[str, str]]:
    busiest, tenant = Shape.destination(0), Shape.tenant_of(0)
    middle = Shape.delivery_id(shape.rows // 2)
    return [
        ("overview", "/console/"),
        ("deliveries", "/console/deliveries"),
        ("deliveries failed", "/console/deliveries?status=failure"),
        ("deliveries failed, 1 h", "/console/deliveries?status=failure&range=1h"),
        ("deliveries of a destination", f"/console/deliveries?destination={busiest}"),
        ("deliveries of a tenant, failed", f"/console/deliveries?tenant={tenant}&status=failure"),
        ("deliveries of an event type", "/console/deliveries?event_type=task_run.completed"),
        ("delivery", f"/console/deliveries/{middle}"),
        ("destinations", "/console/destinations"),
        ("destinations of a tenant", f"/console/destinations?tenant={tenant}"),
        ("destination", f"/console/destinations/{busiest}"),
        ("event", f"/console/events/{event_id}"),
        ("rejected rows", "/console/outbox/rejected"),
        ("replays", "/console/replays"),
        ("replay", f"/console/replays/{replay_id}"),
        (
            "replay dry run, failed of a destination",
            f"/console/replays/new?status=failure&destination={busiest}",
        ),
        ("replay dry run, failed in 24 h", "/console/replays/new?status=failure&range=24h"),
    ]


def portal_pages(shape: Shape, delivery_id: str) -> list[tuple[str, str]]:
    """The portal's pages for the tenant of the busiest destination (``delivery_id`` is
    one of its deliveries): the overview counts that tenant's destinations only."""
    busiest = Shape.destination(0)
    return [
        ("portal overview", "/portal/"),
        ("portal deliveries", "/portal/deliveries"),
        ("portal deliveries failed", "/portal/deliveries?status=failure"),
        ("portal deliveries of a destination", f"/portal/deliveries?destination={busiest}"),
        ("portal delivery", f"/portal/deliveries/{delivery_id}"),
        ("portal destinations", "/portal/destinations"),
        ("portal destination", f"/portal/destinations/{busiest}"),
        ("portal replays", "/portal/replays"),
        ("portal replay dry run, failed", "/portal/replays/new?status=failure"),
    ]


async def _destinations(settings: Any) -> tuple[str, str]:
    """1,000 destination rows, an operator key and a key of the busiest destination's
    tenant; returns the operator key and the tenant key's hash."""
    from herald.access.keys import OPERATOR_KIND, OPERATOR_TENANT, hash_api_key, new_api_key
    from herald.model import Destination, DestinationStatus
    from herald.wiring import components

    now = time.time()
    async with components(settings) as comp:
        for k in range(DESTINATIONS):
            await comp.store.create_destination(
                Destination(
                    id=Shape.destination(k),
                    tenant_id=Shape.tenant_of(k),
                    name=f"destination {k}",
                    type="webhook",
                    config={"url": f"https://hooks.example.com/{k}"},
                    secrets={"secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"},
                    events=("*",),
                    status=DestinationStatus.INACTIVE if k % 25 == 0 else DestinationStatus.ACTIVE,
                    created_at=now,
                    updated_at=now,
                ),
                verification=None,
            )
        key = new_api_key(operator=True)
        await comp.store.create_api_key(
            key_hash=hash_api_key(key),
            tenant_id=OPERATOR_TENANT,
            hint=key[-4:],
            now=now,
            kind=OPERATOR_KIND,
        )
        tenant_key = hash_api_key(new_api_key())
        await comp.store.create_api_key(
            key_hash=tenant_key, tenant_id=Shape.tenant_of(0), hint="bench", now=now
        )
    return key, tenant_key


async def _time_pages(
    http: Any, base: str, named: list[tuple[str, str]], repeat: int
) -> dict[str, Any]:
    """p50, p95 and max of ``repeat`` requests of each page."""
    out: dict[str, Any] = {}
    for name, path in named:
        seconds = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            async with http.get(base + path) as resp:
                await resp.read()
                assert resp.status == 200, (path, resp.status)
            seconds.append(time.perf_counter() - t0)
        seconds.sort()
        out[name] = {
            "path": path,
            "p50_ms": round(percentile(seconds, 50) * 1000, 1),
            "p95_ms": round(percentile(seconds, 95) * 1000, 1),
            "max_ms": round(seconds[-1] * 1000, 1),
        }
        log(f"  {name}: p95 {out[name]['p95_ms']} ms")
    return out


async def _measure(
    settings: Any, shape: Shape, keys: tuple[str, str], repeat: int
) -> dict[str, Any]:
    import aiohttp
    from aiohttp import web

    from bench.common import free_port
    from herald.console import web as console
    from herald.model import DeliveryFilter
    from herald.wiring import components

    key, tenant_key = keys
    async with components(settings) as comp:
        event = await _any_event(comp)
        replay = await _counters_and_replays(comp)
        theirs, _ = await comp.service.list_deliveries(
            DeliveryFilter(destination_id=Shape.destination(0)), limit=1
        )
        portal_token = await comp.access.tokens.create(Shape.tenant_of(0), key_hash=tenant_key)
        app = web.Application()
        console.setup(app, comp.service, access=comp.access, settings=settings)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        base = f"http://127.0.0.1:{port}"
        try:
            jar = aiohttp.CookieJar(unsafe=True)
            async with aiohttp.ClientSession(cookie_jar=jar) as http:
                async with http.get(f"{base}/console/login") as resp:
                    token = re.search(r'name="csrf_token" value="([^"]+)"', await resp.text())
                assert token is not None
                form = {"csrf_token": token.group(1), "key": key}
                async with http.post(
                    f"{base}/console/login", data=form, allow_redirects=False
                ) as resp:
                    assert resp.status == 303, resp.status
                out = await _time_pages(http, base, pages(shape, event, replay), repeat)
                opened = f"{base}/portal/?token={portal_token.token}"
                async with http.get(opened, allow_redirects=False) as resp:
                    assert resp.status == 303, resp.status
                portal = portal_pages(shape, theirs[0].id)
                return out | await _time_pages(http, base, portal, repeat)
        finally:
            await runner.cleanup()


async def _counters_and_replays(comp: Any) -> str:
    """Every destination's counters full (24 hours of attempts, as a busy one has them)
    and 50 replays (each of one destination's failed deliveries, as the console makes
    them); returns the id of the largest."""
    from herald.model import DeliveryFilter, DeliveryStatus
    from herald.store.counters import HOUR, RATE_HOURS

    now = time.time()
    hour = int(now // HOUR)
    dialect = comp.store.dialect
    async with dialect.tx() as c:
        ids = [Shape.destination(k) for k in range(DESTINATIONS)]
        await dialect.executemany(c, "count_last", [(d, now - 5, now - 60) for d in ids])
        await dialect.executemany(
            c,
            "count_hour",
            [(d, hour - h, 900 + h, 17 * (h % 3)) for d in ids for h in range(RATE_HOURS)],
        )
    largest = ("", -1)
    # Not the busiest destination's: its failed deliveries stay for the pages of them.
    for k in range(1, 51):
        flt = DeliveryFilter(destination_id=Shape.destination(k), status=DeliveryStatus.FAILURE)
        result = await comp.service.replays.run(flt, by="bench")
        if result.replay is not None and result.requeued > largest[1]:
            largest = (result.replay.id, result.requeued)
    return largest[0]


async def _any_event(comp: Any) -> str:
    """An event id of the data set (events are stored for its pending deliveries)."""
    from herald.model import DeliveryFilter, DeliveryStatus

    found, _ = await comp.service.list_deliveries(
        DeliveryFilter(status=DeliveryStatus.PENDING), limit=1
    )
    return str(found[0].event_id)


def run_backend(kind: str, rows: int, repeat: int) -> dict[str, Any]:
    from bench.db import postgres_database

    shape = Shape(rows=rows, now=time.time())
    log(f"{kind}: loading {rows:,} deliveries")
    if kind == "postgres":
        import asyncpg

        from herald.store.postgres import SESSION_SETTINGS
        from herald.wiring import components

        with postgres_database("herald_bench_console") as db:
            settings = _settings(db.url)

            async def go() -> tuple[Any, dict[str, Any]]:
                async with components(settings):
                    pass  # the migrations
                conn = await asyncpg.connect(db.url, server_settings=SESSION_SETTINGS)
                try:
                    loaded = await load_postgres(conn, shape)
                finally:
                    await conn.close()
                keys = await _destinations(settings)
                return loaded, await _measure(settings, shape, keys, repeat)

            loaded, timings = asyncio.run(go())
    else:
        from herald.wiring import components

        with tempfile.TemporaryDirectory(prefix="herald-bench-") as scratch:
            settings = _settings(f"sqlite:///{Path(scratch) / 'herald.db'}")

            async def migrate() -> None:
                async with components(settings):
                    pass

            asyncio.run(migrate())
            assert settings.database.sqlite_path is not None
            loaded = load_sqlite(settings.database.sqlite_path, shape)

            async def go_sqlite() -> dict[str, Any]:
                keys = await _destinations(settings)
                return await _measure(settings, shape, keys, repeat)

            timings = asyncio.run(go_sqlite())
    log(f"{kind}: loaded in {loaded.seconds:.0f} s")
    return {"backend": kind, "rows": rows, "destinations": DESTINATIONS, "pages": timings}


def run(args: argparse.Namespace) -> int:
    from herald.logs import configure

    configure(level="warning")  # one access line per request would drown the figures
    rows = args.rows or (QUICK_ROWS if args.quick else ROWS)
    results = {kind: run_backend(kind, rows, args.repeat) for kind in args.backend or BACKENDS}
    names = list(next(iter(results.values()))["pages"])
    header = ["page", *(f"{k} p95 ms" for k in results)]
    print(grid(header, [[n, *(results[k]["pages"][n]["p95_ms"] for k in results)] for n in names]))
    write_named(
        NAME,
        {
            "benchmark": NAME,
            "at": iso_now(),
            "machine": machine(),
            "load_avg": load_avg(),
            "rows": rows,
            "repeat": args.repeat,
            "results": results,
        },
        quick=args.quick,
    )
    return 0
