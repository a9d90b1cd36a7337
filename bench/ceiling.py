"""The ceiling: a bare uvloop + aiohttp loop that signs and POSTs the same bodies.

It runs in its own process with one ``ClientSession`` whose connector allows
``concurrency`` connections, ``concurrency`` workers, the Standard Webhooks
headers Herald sends, and nothing persisted. The clock runs from the first
request to the last response (body building and signing included, process
start-up excluded); over the same span the process reads its own CPU time
from ``/proc/self/stat`` (``bench/cpu.py``), so the loop's CPU per request
excludes start-up as Herald's excludes its own. ``python -m bench.ceiling …``
prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import dataclass

from bench import cpu
from bench.common import (
    EVENT_TYPE,
    REPO_ROOT,
    BenchError,
    Row,
    envelope,
    event_id,
    iso_ms,
    payload,
    run_cmd,
)

CHILD_TIMEOUT_MARGIN = 30.0


@dataclass(frozen=True, slots=True)
class Ceiling:
    row: Row
    cpu_seconds: float
    """utime + stime of the loop's process from its first request to its last response."""

    @property
    def cpu_us_per_request(self) -> float:
        return cpu.per_item_us(self.cpu_seconds, self.row.events)


def measure(url: str, secret: str, *, events: int, concurrency: int, timeout: float) -> Ceiling:
    """Run the loop in a subprocess and return what it measured."""
    argv = [
        sys.executable,
        "-m",
        "bench.ceiling",
        "--url",
        url,
        "--secret",
        secret,
        "--events",
        str(events),
        "--concurrency",
        str(concurrency),
        "--timeout",
        str(timeout),
    ]
    out = run_cmd(argv, timeout=timeout + CHILD_TIMEOUT_MARGIN, what="ceiling loop", cwd=REPO_ROOT)
    result = json.loads(out.strip().splitlines()[-1])
    if result["errors"]:
        raise BenchError(f"ceiling loop: {result['errors']} requests failed: {result['first']}")
    row = Row("ceiling (uvloop+aiohttp)", int(result["requests"]), float(result["seconds"]))
    return Ceiling(row, float(result["cpu_seconds"]))


async def _post_all(
    url: str, secret: str, events: int, concurrency: int
) -> tuple[int, float, float, int, str]:
    import aiohttp

    from herald.signing import parse_secret, sign

    key = parse_secret(secret)
    created_at = iso_ms(time.time())
    datas = [payload(i) for i in range(events)]
    next_index = 0
    errors = 0
    first_error = ""

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal next_index, errors, first_error
        while next_index < events:
            i = next_index
            next_index += 1
            evt = event_id(i)
            body = envelope(evt, EVENT_TYPE, created_at, datas[i])
            ts = int(time.time())
            headers = {
                "content-type": "application/json",
                "user-agent": "Herald-bench-ceiling",
                "webhook-id": evt,
                "webhook-timestamp": str(ts),
                "webhook-signature": sign(key, evt, ts, body),
            }
            try:
                async with session.post(
                    url, data=body, headers=headers, allow_redirects=False
                ) as resp:
                    await resp.read()
                    ok = 200 <= resp.status < 300
                    problem = f"HTTP {resp.status}"
            except aiohttp.ClientError as exc:
                ok, problem = False, repr(exc)
            if not ok:
                errors += 1
                first_error = first_error or problem

    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=0)
    async with aiohttp.ClientSession(
        connector=connector, skip_auto_headers=("User-Agent",), trust_env=False
    ) as session:
        cpu0 = cpu.cpu_seconds(os.getpid())
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        seconds = time.perf_counter() - t0
        cpu_s = cpu.cpu_seconds(os.getpid()) - cpu0
    return events, seconds, cpu_s, errors, first_error


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.ceiling")
    parser.add_argument("--url", required=True)
    parser.add_argument("--secret", required=True)
    parser.add_argument("--events", type=int, required=True)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args()

    import uvloop

    async def bounded() -> tuple[int, float, float, int, str]:
        async with asyncio.timeout(args.timeout):
            return await _post_all(args.url, args.secret, args.events, args.concurrency)

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        requests, seconds, cpu_s, errors, first = runner.run(bounded())
    out = {"requests": requests, "seconds": seconds, "cpu_seconds": cpu_s}
    print(json.dumps(out | {"errors": errors, "first": first}))


if __name__ == "__main__":
    main()
