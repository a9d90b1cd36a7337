"""``python -m bench.querytime --config C``: time Herald's own scheduling queries.

Opens the store through Herald's code on its own connection (no daemon
running against it) and times, ``--repeat`` times each:

- ``claim_due`` — the workers' claim (an ``UPDATE … RETURNING`` of up to
  ``delivery.claim_batch_size`` due deliveries) at the current time;
- ``next_due_at`` — when the dispatcher should wake next;
- ``delivery_counts`` — the metrics task's pending counts (every 5 s).

With only future retries in the table the claim takes nothing, so it changes
nothing. Prints one JSON line: per query the median, min and max in ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any


async def measure(config: Path, repeat: int) -> dict[str, dict[str, float]]:
    from herald.config import load_settings
    from herald.wiring import components

    settings = load_settings(config)
    async with components(settings) as comp:
        store = comp.store
        batch = settings.delivery.claim_batch_size

        async def claim() -> Any:
            now = time.time()
            return await store.claim_due(
                now=now, limit=batch, owner="bench-querytime", lease_until=now + 300
            )

        async def next_due() -> Any:
            return await store.next_due_at()

        async def counts() -> Any:
            return await store.delivery_counts(now=time.time())

        queries: dict[str, Callable[[], Awaitable[Any]]] = {
            "claim_due": claim,
            "next_due_at": next_due,
            "delivery_counts": counts,
        }
        out: dict[str, dict[str, float]] = {}
        for name, fn in queries.items():
            await fn()  # warm the page cache and the statement cache
            times = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                result = await fn()
                times.append((time.perf_counter() - t0) * 1000)
            if name == "claim_due" and result:
                raise SystemExit(f"claim_due took {len(result)} deliveries: expected none due")
            out[name] = {
                "median_ms": round(statistics.median(times), 3),
                "min_ms": round(min(times), 3),
                "max_ms": round(max(times), 3),
            }
        return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.querytime")
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(measure(args.config, args.repeat))))


if __name__ == "__main__":
    main()
