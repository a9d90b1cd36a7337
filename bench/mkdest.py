"""``python -m bench.mkdest --config C --bodies F``: create many destinations in one process.

The same service call as ``herald destinations create`` (validation, egress
check, encryption of credentials), without paying a process start per
destination. Prints the new ids as one JSON list on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from bench.common import TENANT


async def create_all(config: Path, bodies: list[dict[str, Any]]) -> list[str]:
    from herald.config import load_settings
    from herald.wiring import components

    settings = load_settings(config)
    async with components(settings) as comp:
        return [(await comp.service.create(TENANT, body)).id for body in bodies]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.mkdest")
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--bodies", type=Path, required=True, help="a JSON list of API bodies")
    args = parser.parse_args()
    bodies = json.loads(args.bodies.read_text())
    print(json.dumps(asyncio.run(create_all(args.config, bodies))))


if __name__ == "__main__":
    main()
