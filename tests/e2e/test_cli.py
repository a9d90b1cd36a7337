"""The CLI as an operator meets it: help and examples on every command, completion,
listings across tenants, and commands that show everything and say what they did."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from aiohttp import web

from herald.cli.parser import build_parser
from tests.e2e.conftest import SECRET, HeraldFactory
from tests.e2e.test_delivery import wait_active, wait_deliveries
from tests.support.daemon import Herald
from tests.support.receiver import Received, Receiver

pytestmark = [pytest.mark.e2e, pytest.mark.backend_neutral]


def leaf_parsers(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> list[tuple[str, argparse.ArgumentParser]]:
    """Every command that runs something (``destinations create``, ``replay``, …)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [(" ".join(path), parser)]
    out = []
    for name, child in subs[0].choices.items():
        if name != "worker":
            out += leaf_parsers(child, (*path, name))
    return out


def test_every_command_has_help_an_example_and_helped_options() -> None:
    leaves = leaf_parsers(build_parser())
    assert len(leaves) >= 20
    for name, parser in leaves:
        text = parser.format_help()
        assert "example" in text, name
        assert f"herald {name}" in (parser.epilog or ""), f"{name}: an example of itself"
        for action in parser._actions:
            assert action.help, f"herald {name} {action.option_strings or action.dest}: no help"


def test_the_internal_worker_is_not_listed() -> None:
    top = build_parser().format_help()
    assert "worker" not in top
    assert "SUPPRESS" not in top


def test_the_shell_completes_commands_and_options(tmp_path: Path) -> None:
    def complete(line: str) -> list[str]:
        out = tmp_path / "completions"
        subprocess.run(
            [sys.executable, "-m", "herald"],
            env={
                **os.environ,
                "_ARGCOMPLETE": "1",
                "_ARGCOMPLETE_IFS": "\n",
                "_ARGCOMPLETE_STDOUT_FILENAME": str(out),  # instead of file descriptor 8
                "COMP_LINE": line,
                "COMP_POINT": str(len(line)),
            },
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=60,
            check=False,
        )
        return out.read_text().split()

    assert "destinations" in complete("herald dest")
    assert "--status" in complete("herald replay --st")
    assert {"create", "list", "show"} <= set(complete("herald destinations "))


async def test_ops_commands_see_every_tenant_and_say_what_they_did(
    herald_factory: HeraldFactory,
) -> None:
    h = herald_factory({"delivery": {"max_retries": 0}})

    def behaviour(item: Received) -> web.StreamResponse:
        if item.type == "destination.verification":
            return web.Response(status=204)
        return web.Response(status=503, text="upstream unavailable: " + "x" * 200)

    receiver = await Receiver(secrets=[SECRET], behaviour=behaviour).start()
    try:
        dests = {}
        for tenant in ("default", "acme"):
            dest = await h.acreate_webhook(receiver.url, secret=SECRET, tenant=tenant)
            await wait_active(h, dest["id"])
            dests[tenant] = dest["id"]
        h.insert_events(
            [
                ("evt_d1", "default", "order.paid", '{"n": 1}'),
                ("evt_a1", "acme", "order.paid", '{"n": 2}'),
                ("evt_a2", "acme", "order.paid", '{"n": 3}'),
            ]
        )
        await wait_deliveries(h, "kind = 'event' AND status = 'failure'", 3)

        # replay: one tenant by default, every tenant when asked.
        one = await h.acli_json("replay", "--status", "failure", "--dry-run")
        every = await h.acli_json("replay", "--status", "failure", "--dry-run", "--all-tenants")
        assert (one["matched"], every["matched"]) == (1, 3)

        listed = (await h.acli("deliveries", "list", "--all-tenants")).stdout
        assert listed.splitlines()[0].split()[0] == "TENANT"
        assert "acme" in listed
        assert "default" in listed

        # deliveries show: the event's envelope, every attempt's full error and response.
        [delivery_id] = [
            row[0]
            for row in h.query(
                "SELECT id FROM herald_deliveries WHERE event_id = 'evt_a2' AND kind = 'event'"
            )
        ]
        shown = (await h.acli("deliveries", "show", delivery_id, "--all-tenants")).stdout
        assert "tenant_id        acme" in shown
        assert '"n": 3' in shown
        assert "HTTP 503" in shown
        assert "upstream unavailable: " + "x" * 150 in shown  # not cut at 60 characters

        # destinations show: the whole destination, the secret masked.
        shown = (await h.acli("destinations", "show", dests["acme"], "--tenant", "acme")).stdout
        assert f"webhook.url  {receiver.url}" in shown
        assert "webhook.secret ********" in shown
        assert SECRET not in shown
        # With how it has been answering: the verification's success, the failures since.
        lines = {line[:12]: line[12:].strip() for line in shown.splitlines()}
        assert lines["last success"][:2] == "20"
        assert lines["last failure"][:2] == "20"
        assert re.fullmatch(r"\d+(\.\d)? % \(\d+ of \d+\) over 24 h", lines["failure rate"])

        # Commands that change something say so.
        proc = await h.acli("destinations", "verify", dests["default"])
        assert f"queued a new verification ping for {dests['default']}" in proc.stdout
        proc = await h.acli("destinations", "delete", dests["default"])
        assert f"deleted {dests['default']}" in proc.stdout

        # outbox rejected honours --tenant, and --all-tenants shows both.
        h.insert_events([("", "acme", "order.paid", "{}"), ("", "default", "order.paid", "{}")])
        await wait_rejected(h, 2)
        acme = await h.acli_json("outbox", "rejected", "--tenant", "acme")
        both = await h.acli_json("outbox", "rejected", "--all-tenants")
        assert [r["tenant_id"] for r in acme["data"]] == ["acme"]
        assert sorted(r["tenant_id"] for r in both["data"]) == ["acme", "default"]
    finally:
        await receiver.stop()


async def wait_rejected(h: Herald, count: int) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if h.query("SELECT COUNT(*) FROM herald_outbox_rejected")[0][0] >= count:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("rows were not rejected")


def test_a_duration_past_the_calendar_is_a_usage_error(tmp_path: Path) -> None:
    """``--since 999…9h`` was an ``OverflowError`` (a crash) once written back; now the
    CLI says why and exits 2, as for any bad time."""
    h = Herald(tmp_path)  # its config and database; no daemon needed
    for args in (
        ("deliveries", "list", "--since", "9" * 400 + "h"),
        ("replay", "--dry-run", "--until", "9" * 30 + "d"),
    ):
        done = h.cli(*args, check=False)
        assert done.returncode == 2, (args, done.stderr)
        assert "reaches back before the year 0001" in done.stderr, done.stderr
