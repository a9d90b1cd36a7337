"""The console's replay pages, destination counters and chart, and the config edit,
in a real browser (Debian's Chromium driven by Playwright) against ``herald run``.

A browser that cannot start fails the tests: they never skip.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.e2e import test_console
from tests.e2e.conftest import SECRET
from tests.e2e.test_console_http import Client
from tests.support.browser import Receiver, active_webhook, wait_for
from tests.support.daemon import Herald

# One worker runs a module's tests, so its daemon (a module fixture) starts once.
pytestmark = pytest.mark.xdist_group("console")


# The console tests' daemon (a module fixture: this module gets its own); the operator
# key and the signed-in page are tests/support/browser.py's.
herald = test_console.herald


emit = test_console.emit


def status_of(herald: Herald, event_id: str, dest: dict[str, Any]) -> str:
    return (test_console.delivery_of(herald, event_id, dest) or ("", ""))[1]


def status_of_destination(herald: Herald, dest: dict[str, Any]) -> str:
    rows = herald.query("SELECT status FROM herald_destinations WHERE id = ?", (dest["id"],))
    return str(rows[0][0])


def test_a_failed_delivery_is_found_replayed_and_followed_to_success(
    herald: Herald, page: Page
) -> None:
    receiver = Receiver()
    receiver.start()
    try:
        dest = active_webhook(herald, receiver, name="dead receiver")
        receiver.stop()  # dead: connections are refused
        event_id = emit(herald, "invoice.refunded")
        wait_for(lambda: status_of(herald, event_id, dest) == "failure", what="its failure")

        # Found through the filters, then "Replay these" carries them to a dry run.
        page.get_by_role("link", name="Deliveries", exact=True).click()
        page.get_by_label("Status").select_option("failure")
        page.get_by_label("Destination id").fill(dest["id"])
        page.get_by_label("Event type").fill("invoice.refunded")
        page.get_by_role("button", name="Filter").click()
        expect(page.locator("table.list tbody tr")).to_have_count(1)
        page.get_by_role("link", name="Replay these").click()
        expect(page).to_have_url(re.compile(r"/console/replays/new\?.*status=failure"))
        expect(page.get_by_role("heading", level=1)).to_have_text("Replay: dry run")
        expect(page.locator("#replay-matched")).to_contain_text("1 delivery matches")
        expect(page.locator("table.list tbody tr")).to_have_count(1)
        expect(page.locator("table.list")).to_contain_text("invoice.refunded")
        assert herald.query("SELECT COUNT(*) FROM herald_replays") == [(0,)]  # dry: nothing

        receiver.start()  # back before the replay
        page.get_by_role("button", name="Replay").click()
        expect(page).to_have_url(re.compile(r"/console/replays/rpl_\w+$"))
        replay_id = page.url.rsplit("/", 1)[1]
        expect(page.locator("#replay-progress")).to_contain_text("1 of 1 matched")
        # The page refreshes itself: no reload here, only waiting for what it shows.
        expect(page.locator("#replay-succeeded")).to_have_text("1", timeout=20_000)
        expect(page.locator("#replay-state")).to_have_text("done")
        expect(page.locator("#replay-pending")).to_have_text("0")
        assert status_of(herald, event_id, dest) == "success"
        page.get_by_role("link", name="Its deliveries").click()
        expect(page.get_by_label("Replay id")).to_have_value(replay_id)
        expect(page.locator("table.list tbody tr")).to_have_count(1)
        expect(page.locator("table.list tbody")).to_contain_text("success")

        page.get_by_role("link", name="Replays", exact=True).click()
        row = page.locator("table.list tbody tr", has_text=replay_id)
        expect(row).to_contain_text("done")
        expect(row).to_contain_text("1 of 1")
        audit = [
            e
            for e in herald.log_events()
            if e.get("event") == "replay" and e.get("replay_id") == replay_id
        ]
        assert len(audit) == 1
        assert audit[0]["by"].startswith("console:")
        assert (audit[0]["matched"], audit[0]["requeued"]) == (1, 1)
        assert audit[0]["destination_id"] == dest["id"]
    finally:
        receiver.stop()


def test_the_replay_form_refuses_a_bad_filter_beside_its_field(herald: Herald, page: Page) -> None:
    page.goto("/console/replays")
    page.get_by_label("Since (RFC 3339)").fill("yesterday")
    page.get_by_role("button", name="Preview").click()
    expect(page.locator(".field-error")).to_be_visible()
    expect(page.get_by_role("button", name="Replay")).to_have_count(0)


def test_counters_show_in_the_list_and_the_page_with_a_chart(herald: Herald, page: Page) -> None:
    receiver = Receiver()
    receiver.start()
    try:
        dest = active_webhook(herald, receiver, name="counted receiver")
        ok = emit(herald, "order.counted")
        wait_for(lambda: status_of(herald, ok, dest) == "success", what="the success")
        receiver.stop()
        bad = emit(herald, "order.counted")
        wait_for(lambda: status_of(herald, bad, dest) == "failure", what="the failure")

        page.goto("/console/destinations")
        headers = page.locator("table.list thead th")
        for name in ("Last success", "Last failure", "Failure rate"):
            expect(headers.filter(has_text=name)).to_have_count(1)
        row = page.locator("table.list tbody tr", has_text=dest["id"])
        # The verification and the event succeeded; two attempts of the other failed.
        expect(row).to_contain_text("50 % (2 of 4)")
        assert row.locator("time").count() == 2

        row.get_by_role("link", name="counted receiver").click()
        expect(page.locator("#failure-rate")).to_have_text("50 % (2 of 4)")
        expect(page.locator("#last-failure time")).to_have_count(1)
        chart = page.get_by_role("img", name=re.compile(r"2 succeeded and 2 failed"))
        expect(chart).to_be_visible()
        expect(chart.locator("rect.bar.success")).to_have_count(1)
        expect(chart.locator("rect.bar.failure")).to_have_count(1)
    finally:
        receiver.stop()


def test_the_edit_form_changes_the_config_and_keeps_a_masked_secret(
    herald: Herald, page: Page
) -> None:
    receiver, moved = Receiver(), Receiver()
    receiver.start()
    moved.start()
    try:
        dest = herald.create_webhook(receiver.url, name="editable", secret=SECRET)
        page.goto(f"/console/destinations/{dest['id']}")
        secret = page.get_by_label("secret", exact=True)
        expect(secret).to_have_value(re.compile(r"^\*+$"))  # masked, never the secret
        page.get_by_label("url (required)", exact=True).fill("not a url")
        page.get_by_role("button", name="Save").click()
        error = page.locator("#e-url-error")
        expect(error).to_be_visible()
        expect(page.get_by_label("url (required)", exact=True)).to_have_attribute(
            "aria-invalid", "true"
        )

        page.get_by_label("url (required)", exact=True).fill(moved.url)
        page.get_by_role("button", name="Save").click()
        expect(page.get_by_role("status")).to_have_text("Saved.")
        [(config, secrets)] = herald.query(
            "SELECT config, secrets FROM herald_destinations WHERE id = ?", (dest["id"],)
        )
        assert moved.url in str(config)
        assert secrets  # the masked secret came back and was kept
        assert SECRET not in page.content()
        # A new target is verified again: the moved receiver gets the ping, signed
        # with the secret kept.
        wait_for(lambda: bool(moved.hits), what="the verification at the new url")
        wait_for(
            lambda: status_of_destination(herald, dest) == "active", what="the re-verification"
        )
        expect(page.locator("dl.config")).to_contain_text(moved.url)
    finally:
        receiver.stop()
        moved.stop()


def test_the_portal_replays_its_own_tenants_deliveries_only(
    browser: Browser, herald: Herald, page: Page
) -> None:
    """The same pages under /portal/: a tenant's session sees, dry-runs and replays its
    own failed deliveries, never another tenant's, whatever the query string says."""
    receiver = Receiver()
    receiver.start()
    try:
        acme = herald.create_webhook(receiver.url, name="acme hook", tenant="acme")
        globex = herald.create_webhook(receiver.url, name="globex hook", tenant="globex")
        wait_for(
            lambda: {status_of_destination(herald, d) for d in (acme, globex)} == {"active"},
            what="both destinations' verification",
        )
        receiver.stop()
        events = {}
        for tenant in ("acme", "globex"):
            events[tenant] = f"evt_portal_replay_{tenant}_{time.monotonic_ns()}"
            herald.insert_events([(events[tenant], tenant, "order.lost", '{"n": 1}')])
        wait_for(
            lambda: (
                status_of(herald, events["acme"], acme) == "failure"
                and status_of(herald, events["globex"], globex) == "failure"
            ),
            what="both failures",
        )
        # The operator replays globex's: a replay the acme portal must not see.
        page.goto(f"/console/replays/new?tenant=globex&destination={globex['id']}")
        page.get_by_role("button", name="Replay").click()
        expect(page).to_have_url(re.compile(r"/console/replays/rpl_\w+$"))
        globex_replay = page.url.rsplit("/", 1)[1]

        ctx = browser.new_context(base_url=f"http://127.0.0.1:{herald.port}")
        ctx.set_default_timeout(10_000)
        try:
            portal = ctx.new_page()
            portal.goto(f"/portal/replays?token={herald.portal_token('acme')}")
            expect(portal).to_have_url(re.compile(r"/portal/replays$"))
            expect(portal.get_by_label("Tenant")).to_have_count(0)  # the tenant is the session's
            expect(portal.locator("table.list")).not_to_contain_text(globex_replay)
            portal.goto(f"/portal/replays/{globex_replay}")
            expect(portal.get_by_role("heading", level=1)).not_to_contain_text("Replay rpl_")
            # A tenant in the query string changes nothing: acme's failure alone matches.
            portal.goto("/portal/replays/new?status=failure&event_type=order.lost&tenant=globex")
            expect(portal.locator("#replay-matched")).to_contain_text("1 delivery matches")
            sample = portal.locator("table.list")
            expect(sample.get_by_role("link", name="acme hook")).to_have_attribute(
                "title", acme["id"]
            )
            expect(sample).not_to_contain_text("globex hook")
            expect(sample.locator(f'[title="{globex["id"]}"]')).to_have_count(0)
            receiver.start()
            portal.get_by_role("button", name="Replay").click()
            expect(portal).to_have_url(re.compile(r"/portal/replays/rpl_\w+$"))
            expect(portal.locator("#replay-succeeded")).to_have_text("1", timeout=20_000)
            acme_replay = portal.url.rsplit("/", 1)[1]
        finally:
            ctx.close()
        assert status_of(herald, events["acme"], acme) == "success"
        [(tenant,)] = herald.query(
            "SELECT tenant_id FROM herald_replays WHERE id = ?", (acme_replay,)
        )
        assert tenant == "acme"
        audit = [
            e
            for e in herald.log_events()
            if e.get("event") == "replay" and e.get("replay_id") == acme_replay
        ]
        assert [(e["by"], e["tenant_id"]) for e in audit] == [("portal:acme", "acme")]
    finally:
        receiver.stop()


def test_a_stop_ends_a_running_console_replay_and_it_says_so(tmp_path: Path) -> None:
    """``herald run`` stopped (SIGTERM) while a replay started from the console still
    re-queues: the replay ends between two batches, stored with ``finished_at``,
    and cut short unless it had already re-queued every match."""
    h = Herald(tmp_path, {"api": {"rate_limit_requests": 100_000}})
    h.start()
    try:
        # Twenty destinations still pending verification (their URL is dead) hold
        # every delivery: 600 events make 12,000 pending deliveries, none attempted.
        for k in range(20):
            h.create_webhook(f"http://127.0.0.1:9/{k}", name=f"held {k}")
        h.insert_events(
            [(f"evt_held_{i}", "default", "order.created", '{"n": 1}') for i in range(600)]
        )
        wait_for(
            lambda: (
                h.query("SELECT COUNT(*) FROM herald_deliveries WHERE kind = 'event'")
                == [(12_000,)]
            ),
            timeout=30,
            what="the fan-out",
        )
        client = Client(h)
        assert client.sign_in(h.cli("keys", "create", "--operator").stdout.strip()) == 303
        _, page = client.request("/console/replays/new?status=pending")
        token = re.search(r'name="csrf_token" value="([^"]+)"', page)
        assert token is not None
        replay = {"status": "pending", "csrf_token": token.group(1)}
        assert client.request("/console/replays", replay)[0] == 303
    finally:
        assert h.stop() == 0
    [(matched, requeued, finished_at, cut_short)] = h.query(
        "SELECT matched, requeued, finished_at, cut_short FROM herald_replays"
    )
    assert matched == 12_000
    assert finished_at is not None
    assert bool(cut_short) == (requeued < matched)
    [line] = [e for e in h.log_events() if e.get("event") == "replay" and not e["dry_run"]]
    assert (line["requeued"], line.get("cut_short", False)) == (requeued, bool(cut_short))
