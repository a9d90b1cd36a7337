"""The overview during an outage, the events list and the next-attempt column, in a
real browser (Debian's Chromium under Playwright) on one ``herald run`` (SQLite).

A delivery ends as ``failure`` only after its last retry, hours later; these tests
check that the overview shows an outage from its first failed attempts: which
destination is failing, since when, why and how many attempts failed, on the
operator's overview and on the tenant's own (never another tenant's).
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest
from playwright.sync_api import BrowserContext, Page, expect

from tests.support.browser import (
    Receiver,
    _Served,
    active_webhook,
    console_daemon,
    wait_for,
)
from tests.support.daemon import Herald

pytestmark = pytest.mark.xdist_group("console")

RELATIVE = re.compile(r"^(just now|in \d+ (s|min)|\d+ (s|min) ago|(in )?\d+ h( \d+ min)?( ago)?)$")
"""How a near time reads on every page."""


class _Failing(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        server: Any = self.server
        self.send_response(server.status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


class Answering(_Served):
    """A receiver answering every POST with ``status`` (204 until told otherwise)."""

    handler = _Failing

    def __init__(self) -> None:
        super().__init__()
        self.status = 204

    def _make(self) -> Any:
        server = super()._make()
        server.status = self.status  # type: ignore[attr-defined]
        return server

    def answer(self, status: int) -> None:
        self.status = status
        if self._server is not None:
            self._server.status = status  # type: ignore[attr-defined]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"


@pytest.fixture(scope="module")
def herald(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Herald]:
    yield from console_daemon(
        tmp_path_factory,
        "overview",
        {
            # Two failed attempts in a row make a failing episode; retries wait long
            # enough (30 s, then more) that a failing delivery stays pending meanwhile.
            "signals": {"failing_after_attempts": 2},
            "delivery": {"backoff_base_seconds": 30.0},
        },
    )


def active(herald: Herald, url: str, *, tenant: str, name: str) -> dict[str, Any]:
    return active_webhook(herald, url, name=name, tenant=tenant, events=[f"{tenant}.*"])


def emit(herald: Herald, tenant: str, count: int) -> list[str]:
    ids = [f"evt_{tenant}_{time.monotonic_ns()}_{i}" for i in range(count)]
    herald.insert_events([(i, tenant, f"{tenant}.order", '{"n": 1}') for i in ids])
    return ids


def failing_since(herald: Herald, dest: dict[str, Any]) -> float | None:
    rows = herald.query("SELECT failing_since FROM herald_destinations WHERE id = ?", (dest["id"],))
    return rows[0][0] if rows else None


def test_an_outage_is_on_the_overview_from_its_first_failed_attempts(
    herald: Herald, page: Page, context: BrowserContext
) -> None:
    with Answering() as answering, Receiver() as refusing:
        erring = active(herald, answering.url, tenant="acme", name="Acme orders")
        dead = active(herald, refusing.url, tenant="globex", name="Globex billing")
        page.goto("/console/")
        expect(page.locator("#failing-now")).to_contain_text("No destination is failing")

        # The outage: one receiver answers 500, the other's port refuses connections.
        answering.answer(500)
        refusing.stop()
        emit(herald, "acme", 2)
        emit(herald, "globex", 2)
        wait_for(
            lambda: (
                failing_since(herald, erring) is not None
                and failing_since(herald, dead) is not None
            ),
            what="both failing episodes",
        )

        # One refresh later (the page refreshes itself every 30 s; here, at once).
        expect(page.locator('meta[http-equiv="refresh"]')).to_have_attribute("content", "30")
        page.reload()
        failing = page.locator("table#failing")
        acme = failing.locator("tr", has_text="Acme orders")
        globex = failing.locator("tr", has_text="Globex billing")
        expect(acme).to_contain_text("HTTP 500")
        expect(acme.get_by_role("link", name="Acme orders")).to_have_attribute(
            "title", erring["id"]
        )
        expect(acme).to_contain_text("acme")
        expect(globex).to_contain_text(re.compile("refused|connect", re.IGNORECASE))
        # Since when: a relative time with the exact UTC time on hover.
        since = acme.locator("td.since time")
        expect(since).to_have_text(RELATIVE)
        expect(since).to_have_attribute("title", re.compile(r"\d{4}-\d\d-\d\dT.*Z"))
        # Its failed attempts, linked to its deliveries still being retried.
        failed = acme.locator("a.failed")
        assert int(failed.inner_text()) >= 2
        assert int(page.locator("#failed-attempts").inner_text()) >= 4
        assert int(page.locator("#failing-count").inner_text()) >= 2
        # No delivery has ended yet: the finished deliveries say so, not "all is well".
        expect(page.locator("#failed-deliveries")).to_have_count(0)
        failed.click()
        expect(page).to_have_url(re.compile(r"/console/deliveries\?status=pending&destination="))
        expect(page.locator("table.list tbody tr").first).to_contain_text("Acme orders")

        # The tenant's portal: its own failing destination, never another tenant's.
        portal = context.new_page()
        token = herald.portal_token("acme")
        portal.goto(f"/portal/?token={token}")
        portal_failing = portal.locator("table#failing")
        expect(portal_failing).to_contain_text("Acme orders")
        expect(portal_failing).to_contain_text("HTTP 500")
        expect(portal_failing).not_to_contain_text("Globex")
        expect(portal.locator("#failing-count")).to_have_text("1")

        # Recovery ends the episode: the overview is clear again.
        answering.answer(204)
        refusing.start()
        for dest in (erring, dead):
            page.goto(f"/console/deliveries?status=pending&destination={dest['id']}")
            page.locator("table.list tbody tr a.id").first.click()
            page.get_by_role("button", name="Retry now").click()
        wait_for(
            lambda: failing_since(herald, erring) is None and failing_since(herald, dead) is None,
            what="both destinations to recover",
        )
        page.goto("/console/")
        expect(page.locator("#failing-now")).to_contain_text("No destination is failing")


def test_the_deliveries_list_shows_the_next_attempt_never_the_lease(
    herald: Herald, page: Page
) -> None:
    with Answering() as answering:
        dest = active(herald, answering.url, tenant="initech", name="Initech hook")
        answering.answer(500)
        [event_id] = emit(herald, "initech", 1)

        def attempted() -> list[tuple[Any, ...]]:
            return herald.query(
                "SELECT id FROM herald_deliveries WHERE event_id = ? AND attempt_count >= 1",
                (event_id,),
            )

        wait_for(lambda: bool(attempted()), what="the first failed attempt")
        [(delivery_id,)] = attempted()
        page.goto(f"/console/deliveries?destination={dest['id']}&status=pending")
        row = page.locator("table.list tbody tr", has_text=delivery_id)
        expect(row.locator("td.next time")).to_have_text(re.compile(r"^in \d+ (s|min)$"))
        expect(row.locator("td.next time")).to_have_attribute(
            "title", re.compile(r"\d{4}-\d\d-\d\dT.*Z")
        )

        # Leased (as the dispatcher leases it while attempting): next_attempt_at is the
        # lease's end then, which is never shown as a next attempt.
        herald.query(
            "UPDATE herald_deliveries SET lease_owner = 'elsewhere', next_attempt_at = ?"
            " WHERE id = ?",
            (time.time() + 3600, delivery_id),
        )
        page.reload()
        expect(row.locator("td.next")).to_have_text("being attempted")
        page.goto(f"/console/deliveries/{delivery_id}")
        expect(page.locator("#next-attempt")).to_have_text("being attempted")
        herald.query(
            "UPDATE herald_deliveries SET lease_owner = NULL, status = 'failure',"
            " next_attempt_at = NULL WHERE id = ?",
            (delivery_id,),
        )


def test_the_events_list_is_newest_first_filtered_paginated_and_linked(
    herald: Herald, page: Page
) -> None:
    tag = f"list{time.monotonic_ns()}"
    older = [(f"evt_{tag}_old_{i:02d}", "default", f"{tag}.old", "{}") for i in range(5)]
    herald.insert_events(older)
    wait_for(
        lambda: (
            len(herald.query("SELECT 1 FROM herald_events WHERE type = ?", (f"{tag}.old",))) == 5
        ),
        what="the first events relayed",
    )
    newer = [(f"evt_{tag}_new_{i:02d}", "default", f"{tag}.new", "{}") for i in range(55)]
    herald.insert_events(newer)
    wait_for(
        lambda: (
            len(herald.query("SELECT 1 FROM herald_events WHERE id LIKE ?", (f"evt_{tag}%",))) == 60
        ),
        what="every event relayed",
    )
    expected = [
        r[0]
        for r in herald.query(
            "SELECT id FROM herald_events WHERE id LIKE ?"
            " ORDER BY ingested_at DESC, id DESC, tenant_id DESC",
            (f"evt_{tag}%",),
        )
    ]
    assert set(expected[:55]) == {r[0] for r in newer}  # newest first

    page.get_by_role("link", name="Events").click()
    expect(page.get_by_role("heading", name="Events")).to_be_visible()
    expect(page.locator("table#events tbody tr td:first-child").first).to_have_text(expected[0])

    # Filtered by type: only that type, newest first.
    page.get_by_label("Type").fill(f"{tag}.old")
    page.get_by_role("button", name="Filter").click()
    ids = page.locator("table#events tbody tr td:first-child")
    expect(ids).to_have_text(expected[55:])

    # Every event of this test, 50 a page: the next page carries on without overlap.
    page.goto("/console/events?range=15m")
    seen: list[str] = []
    for _ in range(10):
        rows = page.locator("table#events tbody tr td:first-child").all_inner_texts()
        seen += [r.strip() for r in rows if r.strip().startswith(f"evt_{tag}")]
        older_link = page.get_by_role("link", name="Older events")
        if not older_link.count():
            break
        older_link.click()
    assert seen == expected
    # A time range that holds none of them.
    page.goto(
        f"/console/events?type={tag}.new&since=2000-01-01T00:00:00Z&until=2000-01-02T00:00:00Z"
    )
    expect(page.locator("table#events")).to_contain_text("No event matches.")
    page.goto("/console/events?since=yesterday")
    expect(page.locator(".field-error")).to_contain_text("RFC 3339")

    # Each event links to its page; the lookup by id stays.
    page.goto(f"/console/events?type={tag}.old")
    page.get_by_role("link", name=expected[55]).click()
    expect(page.get_by_role("heading", name=f"Event {expected[55]}")).to_be_visible()
    page.goto("/console/events")
    page.get_by_label("Event id").fill(expected[0])
    page.get_by_role("button", name="Look up").click()
    expect(page.get_by_role("heading", name=f"Event {expected[0]}")).to_be_visible()


def test_the_portals_events_list_holds_its_tenants_events_only(
    herald: Herald, context: BrowserContext
) -> None:
    tag = f"portal{time.monotonic_ns()}"
    herald.insert_events(
        [
            (f"evt_{tag}_mine", "umbrella", f"{tag}.x", "{}"),
            (f"evt_{tag}_theirs", "other", f"{tag}.x", "{}"),
        ]
    )
    wait_for(
        lambda: len(herald.query("SELECT 1 FROM herald_events WHERE type = ?", (f"{tag}.x",))) == 2,
        what="both events relayed",
    )
    page = context.new_page()
    page.goto(f"/portal/events?token={herald.portal_token('umbrella')}")
    page.goto(f"/portal/events?type={tag}.x&tenant=other")
    events = page.locator("table#events")
    expect(events).to_contain_text(f"evt_{tag}_mine")
    expect(events).not_to_contain_text(f"evt_{tag}_theirs")
    page.get_by_role("link", name=f"evt_{tag}_mine").click()
    expect(page.get_by_role("heading", name=f"Event evt_{tag}_mine")).to_be_visible()


def test_a_pending_destination_says_why_on_its_page_in_the_cli_and_the_api(
    herald: Herald, page: Page
) -> None:
    with Answering() as answering:
        answering.answer(500)
        dest = herald.create_webhook(answering.url, name="Hooli pending", tenant="hooli")
        wait_for(
            lambda: bool(
                herald.query(
                    "SELECT 1 FROM herald_deliveries WHERE destination_id = ?"
                    " AND kind = 'verification' AND attempt_count >= 1",
                    (dest["id"],),
                )
            ),
            what="the verification ping's first attempt",
        )
        page.goto(f"/console/destinations/{dest['id']}")
        expect(page.locator("#dest-status")).to_have_text("pending_verification")
        reason = page.locator("#pending-reason")
        expect(reason).to_contain_text("verification ping's last attempt failed")
        expect(reason).to_contain_text("HTTP 500")
        expect(reason.locator("time")).to_have_text(RELATIVE)

        shown = herald.cli("destinations", "show", dest["id"], "--tenant", "hooli").stdout
        assert re.search(r"^last attempt: .*HTTP 500", shown, re.MULTILINE), shown

        ask = urllib.request.Request(
            f"http://127.0.0.1:{herald.port}/v2/event-destinations/{dest['id']}",
            headers={"Authorization": f"Bearer {herald.api_key('hooli')}"},
        )
        with urllib.request.urlopen(ask, timeout=10) as resp:
            verification = json.loads(resp.read())["verification"]
        assert verification["state"] == "pending"
        last = verification["last_attempt"]
        assert (last["response_status"], last["outcome"]) == (500, "failure_retryable")
        assert last["started_at"].endswith("Z")

        # Verified: no reason any more, on the page or in the API's read.
        answering.answer(204)
        page.get_by_role("button", name="Re-verify").click()
        wait_for(
            lambda: (
                herald.query("SELECT status FROM herald_destinations WHERE id = ?", (dest["id"],))
                == [("active",)]
            ),
            what="the destination's verification",
        )
        page.goto(f"/console/destinations/{dest['id']}")
        expect(page.locator("#pending-reason")).to_have_count(0)
        with urllib.request.urlopen(ask, timeout=10) as resp:
            assert "last_attempt" not in json.loads(resp.read())["verification"]
