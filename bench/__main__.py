"""``python -m bench [--quick] [NAME] [options]``: run one benchmark, or all of them with no NAME.

A benchmark is a module with ``NAME``, ``HELP``, ``add_arguments(parser)`` and
``run(args) -> int``; add it to ``BENCHMARKS`` to make it runnable. Every
benchmark takes ``--quick`` (a small smoke-test size whose result goes to the
git-ignored ``bench/results/quick/``); ``python -m bench --quick`` runs them all
that way.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bench import (
    adapters,
    console,
    fairshare,
    fanout,
    idle,
    isolation,
    latency,
    ordering,
    partner,
    postgres,
    query_plans,
    retention,
    retry_backlog,
    schemas,
    sources,
    throughput,
)
from bench.common import BenchError


@dataclass(frozen=True, slots=True)
class Benchmark:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


BENCHMARKS = [
    Benchmark(throughput.NAME, throughput.HELP, throughput.add_arguments, throughput.run),
    Benchmark(fanout.NAME, fanout.HELP, fanout.add_arguments, fanout.run),
    Benchmark(latency.NAME, latency.HELP, latency.add_arguments, latency.run),
    Benchmark(
        retry_backlog.NAME, retry_backlog.HELP, retry_backlog.add_arguments, retry_backlog.run
    ),
    Benchmark(idle.NAME, idle.HELP, idle.add_arguments, idle.run),
    Benchmark(isolation.NAME, isolation.HELP, isolation.add_arguments, isolation.run),
    Benchmark(fairshare.NAME, fairshare.HELP, fairshare.add_arguments, fairshare.run),
    Benchmark(postgres.NAME, postgres.HELP, postgres.add_arguments, postgres.run),
    Benchmark(adapters.NAME, adapters.HELP, adapters.add_arguments, adapters.run),
    Benchmark(retention.NAME, retention.HELP, retention.add_arguments, retention.run),
    Benchmark(query_plans.NAME, query_plans.HELP, query_plans.add_arguments, query_plans.run),
    Benchmark(console.NAME, console.HELP, console.add_arguments, console.run),
    Benchmark(sources.NAME, sources.HELP, sources.add_arguments, sources.run),
    Benchmark(schemas.NAME, schemas.HELP, schemas.add_arguments, schemas.run),
    Benchmark(ordering.NAME, ordering.HELP, ordering.add_arguments, ordering.run),
    Benchmark(partner.NAME, partner.HELP, partner.add_arguments, partner.run),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description="Herald benchmarks (all of them when no NAME is given)"
    )
    parser.add_argument(
        "--quick",
        dest="quick_all",
        action="store_true",
        help="with no NAME: run every benchmark in its --quick (smoke) size",
    )
    sub = parser.add_subparsers(dest="benchmark", metavar="NAME")
    for bench in BENCHMARKS:
        bench.add_arguments(sub.add_parser(bench.name, help=bench.help))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    chosen = [b for b in BENCHMARKS if args.benchmark in (None, b.name)]
    status = 0
    for bench in chosen:
        bench_args = args
        if args.benchmark is None:
            defaults = argparse.ArgumentParser()
            bench.add_arguments(defaults)
            bench_args = defaults.parse_args(["--quick"] if args.quick_all else [])
        try:
            status = max(status, bench.run(bench_args))
        except BenchError as exc:
            print(f"bench {bench.name}: FAILED: {exc}", file=sys.stderr)
            status = 1
        except KeyboardInterrupt:
            print(f"bench {bench.name}: interrupted", file=sys.stderr)
            return 130
    return status


if __name__ == "__main__":
    raise SystemExit(main())
