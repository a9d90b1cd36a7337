"""`herald replay`: each filter re-delivers exactly the matching deliveries.

What each filter selects is the store's SQL, run on both databases by
tests/integration/test_replays.py; the command's tests here run on SQLite alone
(``backend_neutral``), but for the replay's id and outcome, end to end on both."""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import json
import os
import pty
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from tests.e2e.conftest import SECRET, HeraldFactory
from tests.e2e.test_delivery import wait_active, wait_deliveries
from tests.e2e.test_outage_signals import scrape
from tests.support.api import error_of, eventually, open_api
from tests.support.daemon import Herald
from tests.support.receiver import Received, Receiver

pytestmark = pytest.mark.e2e


API_REPLAY_RATE = 3  # the daemon's delivery.replay_rate_per_second


class Scenario:
    """Two destinations whose receivers fail every event while ``failing`` (max_retries
    = 0), so every delivery ends `failure` after one attempt; a replay's arrivals are
    then exact. The fixture leaves ``failing`` off: replayed deliveries succeed."""

    def __init__(self, h: Herald, receivers: list[Receiver], dests: list[str]) -> None:
        self.h, self.receivers, self.dests = h, receivers, dests
        self.failing = True

    def clear(self) -> None:
        for r in self.receivers:
            r.received.clear()

    def arrivals(self) -> Counter[str]:
        return Counter(
            r.event_id
            for rc in self.receivers
            for r in rc.received
            if not r.type.startswith("destination.")
        )

    async def settle(self, expected_arrivals: int) -> None:
        await self.receivers[0].wait_for(
            lambda: sum(self.arrivals().values()) >= expected_arrivals,
            timeout=20,
            what=f"{expected_arrivals} arrivals",
        )
        await asyncio.sleep(0.4)  # nothing more arrives
        assert sum(self.arrivals().values()) == expected_arrivals

    async def replay(self, *args: str) -> dict[str, object]:
        result: dict[str, object] = await self.h.acli_json("replay", "--rate", "0", *args)
        return result


@pytest.fixture
async def scenario(herald_factory: HeraldFactory) -> AsyncIterator[Scenario]:
    h = herald_factory(
        {
            "delivery": {"max_retries": 0, "replay_rate_per_second": API_REPLAY_RATE},
            "metrics": {"refresh_seconds": 0.2},
        }
    )
    receivers: list[Receiver] = []
    s = Scenario(h, receivers, [])

    def behaviour(item: Received) -> web.StreamResponse:
        if item.type == "destination.verification" or not s.failing:
            return web.Response(status=204)
        return web.Response(status=500)

    receivers += [await Receiver(secrets=[SECRET], behaviour=behaviour).start() for _ in range(2)]
    for i, r in enumerate(receivers):
        dest = await h.acreate_webhook(r.url, secret=SECRET, name=f"d{i}")
        await wait_active(h, dest["id"])
        s.dests.append(dest["id"])
    h.insert_events([(f"evt_a{i}", "default", "order.created", "{}") for i in range(3)])
    h.insert_events([(f"evt_b{i}", "default", "order.paid", "{}") for i in range(2)])
    await wait_deliveries(h, "status = 'failure' AND kind = 'event'", 10)
    await s.settle(10)
    s.failing = False
    s.clear()
    yield s
    for r in receivers:
        await r.stop()


def snapshot(h: Herald) -> list[tuple[object, ...]]:
    return h.query(
        "SELECT id, status, attempt_count, next_attempt_at, max_attempts, updated_at"
        " FROM herald_deliveries ORDER BY id"
    )


@pytest.mark.backend_neutral
async def test_dry_run_changes_nothing(scenario: Scenario) -> None:
    before = snapshot(scenario.h)
    out = await scenario.replay("--status", "failure", "--dry-run")
    assert out["matched"] == 10
    assert out["requeued"] == 0
    assert out["dry_run"] is True
    assert len(out["sample"]) == 5  # type: ignore[arg-type]
    await asyncio.sleep(0.5)
    assert snapshot(scenario.h) == before
    assert scenario.arrivals() == Counter()


@pytest.mark.backend_neutral
async def test_by_destination(scenario: Scenario) -> None:
    out = await scenario.replay("--destination", scenario.dests[1])
    assert out["requeued"] == 5
    await scenario.settle(5)
    assert scenario.receivers[0].received == []
    assert set(scenario.arrivals()) == {"evt_a0", "evt_a1", "evt_a2", "evt_b0", "evt_b1"}


@pytest.mark.backend_neutral
async def test_by_status_and_event_type(scenario: Scenario) -> None:
    out = await scenario.replay("--status", "failure", "--event-type", "order.paid")
    assert out["requeued"] == 4
    await scenario.settle(4)
    assert scenario.arrivals() == Counter({"evt_b0": 2, "evt_b1": 2})
    # Now those are `success`: a second replay by status failure leaves them out.
    out = await scenario.replay("--status", "failure", "--dry-run")
    assert out["matched"] == 6


@pytest.mark.backend_neutral
async def test_by_time_range(scenario: Scenario) -> None:
    h = scenario.h
    cut = time.time()
    await asyncio.sleep(0.05)
    h.insert_events([("evt_late", "default", "order.created", "{}")])
    await scenario.settle(2)  # the new event is delivered (receivers succeed now)
    for r in scenario.receivers:
        r.received.clear()
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(cut)) + f".{int(cut % 1 * 1e6):06d}Z"
    out = await scenario.replay("--since", since)
    assert out["requeued"] == 2
    await scenario.settle(2)
    assert set(scenario.arrivals()) == {"evt_late"}
    for r in scenario.receivers:
        r.received.clear()
    out = await scenario.replay("--until", since, "--destination", scenario.dests[0])
    assert out["requeued"] == 5
    await scenario.settle(5)
    assert "evt_late" not in scenario.arrivals()


@pytest.mark.backend_neutral
async def test_by_delivery_ids_and_file(scenario: Scenario, tmp_path: Path) -> None:
    h = scenario.h
    ids = [
        row[0]
        for row in h.query(
            "SELECT id FROM herald_deliveries WHERE kind = 'event' ORDER BY id LIMIT 3"
        )
    ]
    out = await scenario.replay("--delivery", ids[0])
    assert out["requeued"] == 1
    await scenario.settle(1)
    path = tmp_path / "ids.txt"
    path.write_text(f"{ids[1]}\n\n{ids[2]}\n")
    out = await scenario.replay("--ids-file", str(path))
    assert out["requeued"] == 2
    await scenario.settle(3)
    replayed = h.query("SELECT event_id FROM herald_deliveries WHERE id IN (?, ?, ?)", tuple(ids))
    assert Counter(scenario.arrivals()) == Counter(r[0] for r in replayed)


@pytest.mark.backend_neutral
async def test_by_status_alone_over_mixed_outcomes(scenario: Scenario) -> None:
    # Destination 1's five succeed on a replay, destination 0's five stay `failure`.
    out = await scenario.replay("--destination", scenario.dests[1])
    assert out["requeued"] == 5
    await scenario.settle(5)
    scenario.clear()
    out = await scenario.replay("--status", "failure")
    assert (out["matched"], out["requeued"]) == (5, 5)
    await scenario.settle(5)
    assert scenario.receivers[1].received == []
    assert scenario.arrivals() == Counter(["evt_a0", "evt_a1", "evt_a2", "evt_b0", "evt_b1"])
    failed = scenario.h.query("SELECT COUNT(*) FROM herald_deliveries WHERE status = 'failure'")
    assert failed == [(0,)]


@pytest.mark.backend_neutral
async def test_by_tenant(scenario: Scenario) -> None:
    h = scenario.h
    out = await scenario.replay("--tenant", "someone-else")
    assert out["matched"] == 0
    await asyncio.sleep(0.4)
    assert scenario.arrivals() == Counter()

    # A second tenant with failed deliveries of its own, to the same receiver.
    scenario.failing = True
    other = await h.acreate_webhook(
        scenario.receivers[0].url, secret=SECRET, name="g", tenant="globex"
    )
    await wait_active(h, other["id"])
    h.insert_events([(f"evt_g{i}", "globex", "order.created", "{}") for i in range(2)])
    await wait_deliveries(h, "status = 'failure' AND tenant_id = 'globex'", 2)
    await scenario.settle(2)
    scenario.failing = False
    scenario.clear()

    # The destination's verification is a delivery too, but not a replayable one:
    # neither the count nor a dry run includes it.
    out = await scenario.replay("--tenant", "globex", "--dry-run")
    assert (out["matched"], out["requeued"]) == (2, 0)
    out = await scenario.replay("--tenant", "globex")
    assert (out["matched"], out["requeued"]) == (2, 2)
    await scenario.settle(2)
    assert scenario.arrivals() == Counter(["evt_g0", "evt_g1"])
    scenario.clear()
    out = await scenario.replay("--tenant", "default")
    assert (out["matched"], out["requeued"]) == (10, 10)
    await scenario.settle(10)
    assert scenario.arrivals() == Counter({f"evt_{x}": 2 for x in ("a0", "a1", "a2", "b0", "b1")})


async def deactivate(scenario: Scenario) -> None:
    """Pause both destinations: replayed deliveries are then held, never attempted,
    and keep exactly the ``next_attempt_at`` the replay gave them."""
    for dest_id in scenario.dests:
        await scenario.h.acli("destinations", "update", dest_id, "--data", '{"status": "inactive"}')


def assert_spread(h: Herald, count: int, per_second: int, start: float, end: float) -> None:
    due = sorted(
        r[0]
        for r in h.query(
            "SELECT next_attempt_at FROM herald_deliveries WHERE kind = 'event'"
            " AND status = 'pending' AND held = 1"
        )
    )
    assert len(due) == count
    assert start - 0.5 <= due[0] <= end + 0.5  # the first chunk is due when the replay ran
    # The k-th chunk of `per_second` deliveries is due k seconds after the first.
    assert [round(d - due[0], 3) for d in due] == [i // per_second for i in range(count)]


@pytest.mark.backend_neutral
async def test_cli_replay_is_logged_and_rate_limited(scenario: Scenario) -> None:
    h = scenario.h
    await deactivate(scenario)
    start = time.time()
    proc = await h.acli("replay", "--status", "failure", "--rate", "4")
    end = time.time()
    assert "re-queued 10 of 10" in proc.stdout
    logged = [json.loads(line) for line in proc.stderr.splitlines() if line.startswith("{")]
    entry = next(e for e in logged if e.get("event") == "replay")
    assert entry["by"] == f"cli:{getpass.getuser()}"
    assert (entry["tenant_id"], entry["status"], entry["destination_id"]) == (
        "default",
        "failure",
        None,
    )
    assert (entry["matched"], entry["requeued"], entry["rate_per_second"]) == (10, 10, 4)
    # 10 deliveries at 4 per second: due at +0 s (4), +1 s (4) and +2 s (2).
    assert_spread(h, 10, 4, start, end)


@pytest.mark.backend_neutral
async def test_api_replay_is_logged_and_rate_limited(scenario: Scenario) -> None:
    h = scenario.h
    await deactivate(scenario)
    async with open_api(h, "default") as api:
        key = api.key
        start = time.time()
        status, _, body = await api.post(
            f"/v2/event-destinations/{scenario.dests[0]}/replay", json={"status": "failure"}
        )
        end = time.time()
    assert status == 202, body
    assert (body["matched"], body["requeued"]) == (5, 5)
    # The configured delivery.replay_rate_per_second (3): due at +0 s (3) and +1 s (2).
    assert_spread(h, 5, API_REPLAY_RATE, start, end)
    entry = next(e for e in h.log_events() if e.get("event") == "replay")
    assert entry["by"] == "api:default"
    assert (entry["tenant_id"], entry["destination_id"], entry["status"]) == (
        "default",
        scenario.dests[0],
        "failure",
    )
    assert (entry["matched"], entry["requeued"]) == (5, 5)
    assert entry["rate_per_second"] == API_REPLAY_RATE
    assert key is not None
    assert key not in h.log()  # who asked is the tenant, never the key


@pytest.mark.backend_neutral
async def test_cli_and_api_replays_move_the_daemons_replay_counters(scenario: Scenario) -> None:
    """The service layer counts every replay in the database, so a replay from the CLI
    (another process) moves the daemon's counters as one through its API does; a dry
    run counts nothing. The API replay's log line carries its request's id."""
    h = scenario.h
    await deactivate(scenario)
    async with open_api(h, "default") as api:
        status, headers, body = await api.post(
            f"/v2/event-destinations/{scenario.dests[0]}/replay", json={"status": "failure"}
        )
    assert status == 202, body
    await h.acli("replay", "--status", "failure", "--dry-run")
    proc = await h.acli("replay", "--status", "failure", "--rate", "0")
    assert "re-queued 5 of 5" in proc.stdout

    def counted() -> dict[str, float]:
        got = scrape(h)
        return {
            f"{name.removeprefix('herald_').removesuffix('_total')}:{source}": got.get(
                (name, (("source", source),)), -1
            )
            for name in ("herald_replays_total", "herald_deliveries_replayed_total")
            for source in ("cli", "api", "console")
        }

    expected = {
        "replays:cli": 1,
        "replays:api": 1,
        "replays:console": 0,
        "deliveries_replayed:cli": 5,
        "deliveries_replayed:api": 5,
        "deliveries_replayed:console": 0,
    }
    deadline = time.monotonic() + 10
    while (got := await asyncio.to_thread(counted)) != expected and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert got == expected
    route = (
        ("method", "POST"),
        ("route", "/v2/event-destinations/{id}/replay"),
        ("status", "202"),
    )
    assert (await asyncio.to_thread(scrape, h))[("herald_api_requests_total", route)] == 1
    [entry] = [e for e in h.log_events() if e.get("event") == "replay"]
    assert entry["request_id"] == headers["X-Request-Id"]


@pytest.mark.backend_neutral
async def test_deliveries_list_and_show_print_tables(scenario: Scenario) -> None:
    h = scenario.h
    listed = (await h.acli("deliveries", "list", "--destination", scenario.dests[0])).stdout
    lines = listed.splitlines()
    assert lines[0].split() == [
        "ID",
        "EVENT",
        "TYPE",
        "DESTINATION",
        "STATUS",
        "ATTEMPTS",
        "LAST",
        "HTTP",
        "NEXT",
        "ATTEMPT",
        "CREATED",
    ]
    kinds = {
        r[0]: (r[1], r[2])
        for r in h.query(
            "SELECT id, event_type, kind FROM herald_deliveries WHERE destination_id = ?",
            (scenario.dests[0],),
        )
    }
    assert len(lines) == 1 + len(kinds) == 7  # five events and the verification
    events = [line.split() for line in lines[1:] if kinds[line.split()[0]][1] == "event"]
    assert len(events) == 5
    for cells in events:
        # id, type, destination, status, attempts, last http, next attempt ("-"), created
        assert cells[1:7] == [kinds[cells[0]][0], scenario.dests[0], "failure", "1", "500", "-"]

    delivery_id = events[0][0]
    shown = (await h.acli("deliveries", "show", delivery_id)).stdout
    fields = dict(
        line.split(None, 1) for line in shown.split("\n\n")[0].splitlines() if line.strip()
    )
    assert fields["id"] == delivery_id
    assert fields["destination_id"] == scenario.dests[0]
    assert (fields["status"], fields["attempt_count"]) == ("failure", "1")
    event, attempts = shown.split("\n\n")[1:3]
    assert event.splitlines()[0] == "event:"
    assert f'"id": "{fields["event_id"]}"' in event, "the event's envelope is shown"
    lines = attempts.splitlines()
    assert lines[0] == "attempts:"
    # "#1  2026-11-25 10:00:00  12 ms  failure_retryable  HTTP 500", then its error in full.
    number, _, _, _ms, _, outcome, _, code = lines[1].split()
    assert (number, outcome, code) == ("#1", "failure_retryable", "500")
    assert lines[2].split()[0] == "error:", "the failed attempt's error is shown"


async def test_a_replay_has_an_id_and_its_outcome_is_counted_by_cli_and_api(
    scenario: Scenario,
) -> None:
    """The CLI's replay prints its id; its deliveries carry it; `herald replays show`
    and GET /v2/replays/{id} count them as they finish; a tenant sees only its own."""
    h = scenario.h
    # The dry run says what would go, and stores nothing.
    dry = await scenario.replay("--status", "failure", "--dry-run")
    assert (dry["id"], dry["dry_run"], dry["matched"]) == (None, True, 10)
    assert h.query("SELECT COUNT(*) FROM herald_replays") == [(0,)]

    proc = await h.acli("replay", "--rate", "0", "--destination", scenario.dests[0])
    replay_id = proc.stdout.split("as replay ")[1].split()[0]
    assert replay_id.startswith("rpl_")
    assert "re-queued 5 of 5" in proc.stdout
    carried = h.query(
        "SELECT destination_id, COUNT(*) FROM herald_deliveries WHERE replay_id = ?"
        " GROUP BY destination_id",
        (replay_id,),
    )
    assert carried == [(scenario.dests[0], 5)]
    await scenario.settle(5)

    async def finished() -> bool:
        shown = await h.acli_json("replays", "show", replay_id)
        return bool(shown["outcome"] == {"pending": 0, "succeeded": 5, "failed": 0})

    await eventually(finished, what="the replay's five deliveries to succeed")
    shown = await h.acli_json("replays", "show", replay_id)
    assert shown["object"] == "replay"
    assert (shown["tenant_id"], shown["by"], shown["matched"], shown["requeued"]) == (
        "default",
        f"cli:{getpass.getuser()}",
        5,
        5,
    )
    assert shown["filter"] == {"destination_id": scenario.dests[0]}
    table = (await h.acli("replays", "show", replay_id)).stdout
    assert "succeeded    5" in table
    assert "cut_short    no" in table
    assert shown["cut_short"] is False
    assert replay_id in (await h.acli("replays", "list")).stdout
    hidden = await h.acli("replays", "show", replay_id, "--tenant", "globex", check=False)
    assert (hidden.returncode, hidden.stdout) == (1, "")
    assert f"no replay {replay_id}" in hidden.stderr
    everyone = await h.acli_json("replays", "list", "--all-tenants", "--tenant", "globex")
    assert [r["id"] for r in everyone["data"]] == [replay_id]

    async with open_api(h, "default") as api:
        # An API replay gets an id too, and its deliveries show it.
        status, _, made = await api.post(
            f"/v2/event-destinations/{scenario.dests[1]}/replay", json={"status": "failure"}
        )
        assert status == 202, made
        assert made["id"].startswith("rpl_")
        assert made["request_id"].startswith("req_")
        assert (made["by"], made["requeued"], made["filter"]) == (
            "api:default",
            5,
            {"destination_id": scenario.dests[1], "status": "failure"},
        )
        status, _, page = await api.get(
            f"/v2/event-destinations/{scenario.dests[1]}/event-deliveries",
            params={"status": "pending"},
        )
        assert {d["replay_id"] for d in page["data"]} == {made["id"]}

        status, headers, got = await api.get(f"/v2/replays/{replay_id}")
        assert status == 200, got
        assert got["request_id"] == headers["X-Request-Id"]
        assert got["outcome"] == {"pending": 0, "succeeded": 5, "failed": 0}
        # The CLI's replay, as the tenant reads it: no operator's identity.
        assert got["by"] == "operator"
        listed = await api.pages("/v2/replays", {"limit": 1})
        assert [r["by"] for r in listed] == ["api:default", "operator"]
        assert [r["id"] for r in listed] == [made["id"], replay_id]
        status, _, body = await api.get("/v2/replays", params={"cursor": "nonsense"})
        assert (status, error_of(body)["code"]) == (400, "cursor_invalid")

    async with open_api(h, "globex") as other:
        status, _, body = await other.get(f"/v2/replays/{replay_id}")
        assert (status, error_of(body)["code"]) == (404, "replay_not_found")
        status, _, body = await other.get("/v2/replays")
        assert (status, body["data"]) == (200, [])


@pytest.mark.backend_neutral
async def test_follow_waits_for_the_replays_outcome_and_exits_by_it(scenario: Scenario) -> None:
    """`replay --follow` returns once none of the replay's deliveries is pending, with
    their outcome; exit status 1 when some failed (max_retries 0: one attempt each)."""
    h = scenario.h
    proc = await h.acli(
        "replay",
        "--rate",
        "0",
        "--status",
        "failure",
        "--event-type",
        "order.paid",
        "--follow",
        "--json",
    )
    replay = json.loads(proc.stdout)
    assert replay["object"] == "replay"
    assert replay["outcome"] == {"pending": 0, "succeeded": 4, "failed": 0}
    assert scenario.arrivals() == Counter({"evt_b0": 2, "evt_b1": 2})

    scenario.failing = True
    proc = await h.acli(
        "replay", "--rate", "0", "--destination", scenario.dests[0], "--follow", check=False
    )
    assert proc.returncode == 1, proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("replay rpl_"), proc.stdout
    assert last.endswith("succeeded 0, failed 5, pending 0"), proc.stdout


@pytest.mark.backend_neutral
async def test_the_progress_bar_on_a_terminal_never_shares_a_line_with_a_log_line(
    scenario: Scenario,
) -> None:
    h = scenario.h
    controller, terminal = pty.openpty()
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "herald",
            "replay",
            "--rate",
            "0",
            "--status",
            "failure",
            "--config",
            str(h.config_path),
            stdout=asyncio.subprocess.PIPE,
            stderr=terminal,
            env={**os.environ, "TERM": "dumb"},
        )
        await asyncio.wait_for(proc.wait(), 60)
        os.close(terminal)
        terminal = -1
        seen = b""
        with contextlib.suppress(OSError):  # EIO once the terminal's writer is gone
            while chunk := os.read(controller, 65536):
                seen += chunk
    finally:
        os.close(controller)
        if terminal >= 0:
            os.close(terminal)
    assert proc.returncode == 0
    lines = seen.decode(errors="replace").replace("\r\n", "\n").split("\n")
    bars = [line.rpartition("\r")[2] for line in lines if "re-queued" in line]
    assert bars, seen
    assert bars[-1].endswith("re-queued 10/10"), bars
    logged = [line for line in lines if "replay" in line and "by" in line and "cli:" in line]
    assert logged, seen  # the audit line is there, on a line of its own
    assert not [line for line in logged if "re-queued" in line], seen
