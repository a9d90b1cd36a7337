"""Issue 26's scenario: a partner API at 50 requests a second behind an OAuth2 token
server and a client certificate, a backlog of 100,000 events, and a dead destination
beside it.

One SQLite Herald (``delivery.worker_processes`` at its default) with two webhook
destinations subscribed to the workload's event type:

- ``partner`` — ``rate_limit_per_second`` = ``--rate`` (50), OAuth2 client
  credentials against a token server built on Authlib's authorization server
  (``tests/support/receiverauth.py``), a client certificate of a test CA, and the
  CA's certificate as its trust anchor. The receiver is HTTPS with
  ``CERT_REQUIRED``, accepts only the token server's tokens (401 otherwise) and
  enforces the partner's own limit: a token bucket of ``--rate`` a second holding
  one second's worth (what Herald's limit promises), its arrival times compared
  with ``--jitter-ms`` of tolerance for the loopback's scheduling jitter (a request
  Herald started on time may arrive a few milliseconds late, the next one on time).
  Past the bucket it answers 429 with ``Retry-After: 1``.
- ``dead`` — ``circuit_breaker`` on; its receiver answers 200 while the destination
  is verified, then 503 to everything: a partner that went down.

``--events`` (100,000) outbox rows are written before ``herald run`` starts. The run
ends when the partner has accepted every event. Figures: the partner's arrival rate
(first → last accepted delivery) and its ratio to ``--rate``, its 429s and 401s
(the goal: none), the most requests it saw in any one-second window, the token
requests; the dead receiver's requests, split into the first wave (before the
circuit opened: the attempts already in flight, at most
``delivery.max_per_destination``) and the probes after it, against the probes the
cooldown schedule allows (``breaker_cooldown_seconds`` doubling up to
``breaker_max_cooldown_seconds``) over the run; and what sending at the partner's pace
costs: the CPU of ``herald run`` and its attempt processes over the run, as a share of
one core.

100,000 events at 50/s take 2,000 s (about 34 minutes with the start): ``--events``
makes it shorter; ``--quick`` is 500 events.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from tests.support.receiverauth import OAuthClient, TestCA, TokenServer

from bench import cpu
from bench.common import (
    EVENT_TYPE,
    BenchError,
    Deadline,
    grid,
    iso_now,
    log,
    machine,
    write_named,
)
from bench.daemon import HeraldInstance
from herald.config import Settings

NAME = "partner"
HELP = "100,000 events to a 50/s partner behind OAuth2 + mTLS, a dead destination beside"
EVENTS, QUICK_EVENTS = 100_000, 500
RATE = 50.0
JITTER_MS = 50.0
CLIENT_SECRET = "bench-partner-client-secret"
START_TIMEOUT = 120.0
PROGRESS_SECONDS = 30.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--events", type=int, default=EVENTS, help="backlog (%(default)s)")
    parser.add_argument("--rate", type=float, default=RATE, help="partner's limit per second")
    parser.add_argument(
        "--jitter-ms",
        type=float,
        default=JITTER_MS,
        help="the partner's tolerance for arrival jitter (%(default)s ms)",
    )
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_EVENTS} events")


@dataclass
class Bucket:
    """The partner's limit as a GCRA: ``rate`` a second, one second's worth at once,
    ``jitter`` seconds of tolerance on the arrival time."""

    rate: float
    jitter: float
    tat: float = 0.0

    def take(self, now: float) -> bool:
        interval = 1.0 / self.rate
        tolerance = (max(1.0, self.rate) - 1.0) * interval + self.jitter
        tat = max(self.tat, now)
        if tat - now > tolerance + 1e-9:  # float sums of the interval
            return False
        self.tat = tat + interval
        return True


@dataclass
class Partner:
    """The partner API: mTLS, bearer tokens of ``tokens``, a rate limit."""

    tokens: TokenServer
    bucket: Bucket
    statuses: Counter[int] = field(default_factory=Counter)
    accepted: list[float] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)
    ids: set[str] = field(default_factory=set)

    async def hook(self, request: web.Request) -> web.Response:
        now = time.monotonic()  # as the request arrives, before its body is read
        self.arrivals.append(now)
        await request.read()
        token = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if token not in self.tokens.valid:
            self.statuses[401] += 1
            return web.Response(status=401, headers={"WWW-Authenticate": "Bearer"})
        if not self.bucket.take(now):
            self.statuses[429] += 1
            return web.Response(status=429, headers={"Retry-After": "1"})
        self.statuses[200] += 1
        event_id = request.headers.get("webhook-id", "")
        if event_id not in self.ids:
            self.ids.add(event_id)
            self.accepted.append(now)
        return web.Response(status=200, text="ok")


@dataclass
class Dead:
    """A receiver that answers 200 until :attr:`down`, then 503."""

    down: bool = False
    hits: list[float] = field(default_factory=list)

    async def hook(self, request: web.Request) -> web.Response:
        await request.read()
        if not self.down:
            return web.Response(status=200, text="ok")
        self.hits.append(time.monotonic())
        return web.Response(status=503, text="down")


@dataclass
class Servers:
    tokens: TokenServer
    partner: Partner
    dead: Dead
    partner_url: str
    dead_url: str
    ca: TestCA
    loop: asyncio.AbstractEventLoop


@contextmanager
def servers(workdir: Path, rate: float, jitter: float) -> Iterator[Servers]:
    """The token server, the partner and the dead receiver on an event loop of their
    own thread (Herald runs as a subprocess; the bench only counts)."""
    loop = asyncio.new_event_loop()
    ready: list[Servers] = []
    runners: list[web.AppRunner] = []
    failed: list[BaseException] = []
    started = threading.Event()

    async def setup() -> None:
        tokens = await TokenServer().start()
        tokens.add(OAuthClient("herald", secret=CLIENT_SECRET))
        ca = TestCA("Herald bench CA")
        (workdir / "tls").mkdir()
        partner = Partner(tokens, Bucket(rate, jitter))
        dead = Dead()
        urls: list[str] = []
        for handler, tls in ((partner.hook, ca.server_context(workdir / "tls")), (dead.hook, None)):
            app = web.Application()
            app.router.add_post("/hook", handler)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
            await site.start()
            runners.append(runner)
            port = runner.addresses[0][1]
            urls.append(f"{'https' if tls else 'http'}://127.0.0.1:{port}/hook")
        ready.append(Servers(tokens, partner, dead, urls[0], urls[1], ca, loop))

    def main() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(setup())
        except BaseException as exc:
            failed.append(exc)
            started.set()
            return
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=main, name="bench-partner", daemon=True)
    thread.start()
    started.wait(START_TIMEOUT)
    if failed or not ready:
        raise BenchError(f"the partner's servers did not start: {failed!r}")
    try:
        yield ready[0]
    finally:

        async def teardown() -> None:
            for runner in runners:
                await runner.cleanup()
            await ready[0].tokens.stop()

        asyncio.run_coroutine_threadsafe(teardown(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)


def max_in_window(times: list[float], window: float = 1.0) -> int:
    """The most of ``times`` (sorted) in any half-open window of ``window`` seconds."""
    best = 0
    for i, start in enumerate(times):
        best = max(best, bisect.bisect_left(times, start + window, lo=i) - i)
    return best


def probes_allowed(seconds: float, cooldown: float, ceiling: float) -> int:
    """Probes the breaker's schedule lets through in ``seconds`` after it first opened:
    one per cooldown, the cooldown doubling after each failed probe up to ``ceiling``."""
    count, elapsed, wait = 0, 0.0, cooldown
    while elapsed + wait <= seconds:
        elapsed += wait
        count += 1
        wait = min(wait * 2, ceiling)
    return count


def run(args: argparse.Namespace) -> int:
    events = QUICK_EVENTS if args.quick else args.events
    rate, jitter = float(args.rate), float(args.jitter_ms) / 1000
    with tempfile.TemporaryDirectory(prefix="herald-bench-partner-") as tmp:
        workdir = Path(tmp)
        with servers(workdir, rate, jitter) as srv:
            herald = HeraldInstance(workdir)
            herald.migrate()
            client = srv.ca.issue("herald-bench")
            partner_id = herald.create_destination(
                {
                    "name": "partner",
                    "type": "webhook",
                    "events": [EVENT_TYPE],
                    "rate_limit_per_second": rate,
                    "webhook": {
                        "url": srv.partner_url,
                        "oauth2_token_url": srv.tokens.token_url,
                        "oauth2_client_id": "herald",
                        "oauth2_client_secret": CLIENT_SECRET,
                        "tls_client_certificate": client.certificate,
                        "tls_client_key": client.key,
                        "tls_ca_certificate": srv.ca.pem,
                    },
                }
            )
            dead_id = herald.create_destination(
                {
                    "name": "dead",
                    "type": "webhook",
                    "events": [EVENT_TYPE],
                    "circuit_breaker": True,
                    "webhook": {"url": srv.dead_url},
                }
            )
            herald.activate([partner_id, dead_id], Deadline("activation", START_TIMEOUT))
            srv.dead.down = True
            srv.partner.statuses.clear()
            srv.partner.arrivals.clear()
            srv.partner.accepted.clear()
            srv.partner.ids.clear()
            srv.tokens.requests.clear()
            herald.preload(events)
            log(f"{events:,} events in the outbox; partner at {rate:g}/s, dead beside it")
            budget = events / rate * 1.5 + START_TIMEOUT
            deadline = Deadline("delivery", budget)
            child = herald.start()
            began = time.monotonic()
            last = began
            meter = cpu.CpuMeter({"herald": cpu.tree(child.pid)})
            meter.start()
            try:
                while len(srv.partner.ids) < events:
                    meter.sample()
                    if not child.alive():
                        raise BenchError(f"herald run exited:\n{child.log_tail()}")
                    deadline.check(f"{len(srv.partner.ids):,}/{events:,} accepted")
                    if time.monotonic() - last >= PROGRESS_SECONDS:
                        last = time.monotonic()
                        log(
                            f"partner {len(srv.partner.ids):,}/{events:,}, "
                            f"429s {srv.partner.statuses[429]}, dead hits {len(srv.dead.hits)}"
                        )
                    time.sleep(0.2)
                ended = time.monotonic()
                herald_cpu = meter.stop()["herald"]
            finally:
                herald.stop(child)
        partner, dead = srv.partner, srv.dead
        accepted = sorted(partner.accepted)
        arrivals = sorted(partner.arrivals)
        span = accepted[-1] - accepted[0] if len(accepted) > 1 else 0.0
        achieved = (len(accepted) - 1) / span if span > 0 else float("nan")
        hits = sorted(dead.hits)
        # The circuit opens at the fifth consecutive failure; what was already in flight
        # then still lands: the first wave is every hit within a second of the first.
        wave = [t for t in hits if hits and t - hits[0] < 1.0]
        probes = len(hits) - len(wave)
        after_open = ended - (wave[-1] if wave else began)
        delivery = Settings().delivery
        allowed = probes_allowed(
            after_open, delivery.breaker_cooldown_seconds, delivery.breaker_max_cooldown_seconds
        )
    result: dict[str, Any] = {
        "when": iso_now(),
        "machine": machine(),
        "events": events,
        "rate_limit_per_second": rate,
        "partner_jitter_ms": jitter * 1000,
        "seconds": round(ended - began, 1),
        "herald_cpu_share_of_a_core": round(herald_cpu / (ended - began), 3),
        "partner": {
            "accepted": len(accepted),
            "per_second": round(achieved, 2),
            "ratio_to_rate": round(achieved / rate, 3),
            "status_429": partner.statuses[429],
            "status_401": partner.statuses[401],
            "max_in_any_second": max_in_window(arrivals),
            "token_requests": len(srv.tokens.requests),
        },
        "dead": {
            "requests": len(hits),
            "first_wave": len(wave),
            "probes": probes,
            "probes_allowed_by_schedule": allowed,
        },
    }
    print(
        grid(
            ("figure", "value"),
            [
                ("events", f"{events:,}"),
                ("partner rate (first → last)", f"{achieved:,.2f}/s of {rate:g}/s"),
                ("partner 429s / 401s", f"{partner.statuses[429]} / {partner.statuses[401]}"),
                ("most requests in any 1 s", str(result["partner"]["max_in_any_second"])),
                ("token requests", str(len(srv.tokens.requests))),
                ("dead: first wave", str(len(wave))),
                ("dead: probes (schedule allows)", f"{probes} ({allowed})"),
                ("run", f"{ended - began:,.0f} s"),
                (
                    "herald run's CPU (with its attempt processes)",
                    f"{herald_cpu / (ended - began):.1%} of a core",
                ),
            ],
        )
    )
    write_named(NAME, result, quick=args.quick)
    failures = []
    if partner.statuses[429]:
        failures.append(f"{partner.statuses[429]} × 429")
    if partner.statuses[401]:
        failures.append(f"{partner.statuses[401]} × 401")
    if probes > allowed + 1:
        failures.append(f"{probes} probes where the schedule allows {allowed}")
    if failures:
        log("NOT MET: " + ", ".join(failures))
        return 1
    return 0
