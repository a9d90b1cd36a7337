"""The operator console in a real browser: Debian's Chromium driven by Playwright.

One ``herald run`` (SQLite) for the module and one browser for the session keep
these fast; each test opens its own browser context (its own cookies). A browser
that cannot start fails the tests: they never skip (scripts/test-services.sh
installs it).
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect

from tests.support.browser import (
    XSS_NAME,
    Receiver,
    active_webhook,
    collect_dialogs,
    console_daemon,
    refuses_without_csrf,
    sign_in,
    wait_for,
)
from tests.support.daemon import Herald

# One worker runs a module's tests, so its daemon (a module fixture) starts once.
pytestmark = pytest.mark.xdist_group("console")


@pytest.fixture(scope="module")
def herald(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Herald]:
    yield from console_daemon(
        tmp_path_factory,
        "console",
        {
            "delivery": {"max_retries": 1},
        },
    )


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    r.start()
    yield r
    r.stop()


def pause(page: Page, dest: dict[str, Any]) -> None:
    """Pause a destination from its page, as an operator does."""
    page.goto(f"/console/destinations/{dest['id']}")
    page.get_by_role("button", name="Pause").click()
    expect(page.locator("#dest-status")).to_have_text("inactive")


def emit(herald: Herald, event_type: str = "order.created") -> str:
    event_id = f"evt_console_{time.monotonic_ns()}"
    herald.insert_events([(event_id, "default", event_type, '{"n": 1}')])
    return event_id


def delivery_of(herald: Herald, event_id: str, dest: dict[str, Any]) -> tuple[str, str] | None:
    """(id, status) of the event's delivery to ``dest`` (every webhook here takes '*')."""
    rows = herald.query(
        "SELECT id, status FROM herald_deliveries WHERE event_id = ? AND destination_id = ?",
        (event_id, dest["id"]),
    )
    return (rows[0][0], rows[0][1]) if rows else None


# --- sign-in ------------------------------------------------------------------------------
def test_sign_in_with_a_good_a_wrong_and_a_revoked_key_and_sign_out(
    herald: Herald, context: BrowserContext, operator_key: str
) -> None:
    page = context.new_page()
    page.goto("/console/deliveries")
    expect(page).to_have_url(re.compile(r"/console/login$"))  # no session: sign in first

    # Each refusal says what the operator can do about it (issue 31).
    sign_in(page, "hunter2")
    expect(page.get_by_role("alert")).to_contain_text("This is not a Herald key")
    sign_in(page, "sk_op_not-a-key")
    expect(page.get_by_role("alert")).to_contain_text("This operator key is unknown")

    sign_in(page, operator_key)
    expect(page.get_by_role("heading", name="Overview")).to_be_visible()
    cookie = next(c for c in context.cookies() if c["name"] == "herald_console")
    assert cookie["httpOnly"]
    assert cookie["sameSite"] == "Strict"
    assert operator_key not in page.content()  # the key is nowhere in the page...
    assert operator_key not in page.url
    assert operator_key not in herald.log()  # ...nor in a log line

    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_role("status")).to_have_text("You are signed out.")
    page.goto("/console/destinations")
    expect(page).to_have_url(re.compile(r"/console/login$"))

    # A revoked key: its live session ends, and it no longer signs in.
    revoked = herald.cli("keys", "create", "--operator", "--json")
    view = json.loads(revoked.stdout)
    sign_in(page, view["key"])
    expect(page.get_by_role("heading", name="Overview")).to_be_visible()
    herald.cli("keys", "revoke", "--operator", view["id"])
    page.goto("/console/deliveries")
    expect(page).to_have_url(re.compile(r"/console/login$"))
    sign_in(page, view["key"])
    expect(page.get_by_role("alert")).to_contain_text("This operator key is revoked.")
    refused = [e for e in herald.log_events() if e.get("event") == "console_sign_in_refused"]
    assert [e["reason"] for e in refused[-3:]] == ["not_a_key", "unknown", "revoked"]
    audit = [e for e in herald.log_events() if e.get("event") == "console_signed_out"]
    assert audit
    assert audit[-1]["by"].startswith("console:")


def test_a_tenant_key_never_opens_the_console(herald: Herald, context: BrowserContext) -> None:
    page = context.new_page()
    sign_in(page, herald.api_key("default"))
    expect(page.get_by_role("alert")).to_contain_text("This is a tenant's API key")
    page.goto("/console/")
    expect(page).to_have_url(re.compile(r"/console/login$"))


# --- deliveries -----------------------------------------------------------------------
def test_a_failed_delivery_is_found_by_the_filters_and_retried_to_success(
    herald: Herald, page: Page
) -> None:
    receiver = Receiver()
    receiver.start()
    try:
        dest = active_webhook(herald, receiver, name="flaky receiver")
        receiver.stop()  # dead: connections are refused
        event_id = emit(herald, "invoice.paid")
        wait_for(
            lambda: (delivery_of(herald, event_id, dest) or ("", ""))[1] == "failure",
            what="the delivery to fail",
        )
        delivery_id = (delivery_of(herald, event_id, dest) or ("", ""))[0]

        page.goto("/console/")  # the overview names it among those with failed deliveries
        expect(page.locator("#failed-deliveries")).to_contain_text("flaky receiver")
        page.get_by_role("link", name="Deliveries", exact=True).click()
        page.get_by_label("Status").select_option("failure")
        page.get_by_label("Destination id").fill(dest["id"])
        page.get_by_label("Event type").fill("invoice.paid")
        page.get_by_role("button", name="Filter").click()
        expect(page).to_have_url(re.compile(r"status=failure"))
        rows = page.locator("table.list tbody tr")
        expect(rows).to_have_count(1)
        rows.get_by_role("link", name=delivery_id).click()
        expect(page.locator("#delivery-status")).to_have_text("failure")
        expect(page.locator("table.attempts")).to_contain_text("connection failed")

        receiver.start()
        page.get_by_role("button", name="Retry now").click()
        expect(page.locator("#retry-notice")).to_contain_text("Retried")

        def succeeded() -> bool:
            page.reload()
            return page.locator("#delivery-status").inner_text() == "success"

        wait_for(succeeded, what="the retried delivery to succeed")
        audit = [e for e in herald.log_events() if e.get("event") == "delivery_retried"]
        assert audit[-1]["delivery_id"] == delivery_id
        assert audit[-1]["by"].startswith("console:")
    finally:
        receiver.stop()


# --- destinations -----------------------------------------------------------------------
def test_pause_holds_deliveries_and_resume_lets_them_flow(
    herald: Herald, page: Page, receiver: Receiver
) -> None:
    dest = active_webhook(herald, receiver, name="pausable")
    pause(page, dest)

    event_id = emit(herald, "order.paused")
    wait_for(lambda: delivery_of(herald, event_id, dest) is not None, what="the delivery")
    delivery_id = (delivery_of(herald, event_id, dest) or ("", ""))[0]
    held = herald.query("SELECT held, status FROM herald_deliveries WHERE id = ?", (delivery_id,))
    assert held == [(1, "pending")]
    page.goto(f"/console/deliveries/{delivery_id}")
    expect(page.get_by_text("held", exact=True)).to_be_visible()

    page.goto(f"/console/destinations/{dest['id']}")
    page.get_by_role("button", name="Resume").click()
    expect(page.locator("#dest-status")).to_have_text("active")
    wait_for(
        lambda: (delivery_of(herald, event_id, dest) or ("", ""))[1] == "success",
        what="the held delivery to flow",
    )


def test_send_test_shows_the_attempt_and_rotate_shows_the_secret_once(
    herald: Herald, page: Page, receiver: Receiver
) -> None:
    dest = active_webhook(herald, receiver, name="pingable")
    page.goto(f"/console/destinations/{dest['id']}")
    page.get_by_role("button", name="Send test").click()
    expect(page.locator("#test-status")).to_have_text("success")
    expect(page.locator("table.attempts tbody tr")).to_have_count(1)
    expect(page.locator("table.attempts")).to_contain_text("204")

    page.get_by_role("button", name="Rotate secret").click()
    secret = page.locator("#new-secret").inner_text()
    assert secret.startswith("whsec_")
    page.goto(f"/console/destinations/{dest['id']}")
    assert secret not in page.content()  # shown once
    assert secret not in herald.log()
    expect(page.locator("dl.config")).not_to_contain_text("whsec_")


def test_create_shows_a_validation_error_beside_its_field_and_names_render_as_text(
    herald: Herald, page: Page, receiver: Receiver
) -> None:
    dialogs = collect_dialogs(page)
    page.goto("/console/destinations")
    page.get_by_role("link", name="New destination").click()
    page.get_by_label("Name").fill(XSS_NAME)
    page.get_by_label("Events").fill("order.*")
    page.get_by_label("url (required)", exact=True).fill("not a url")
    page.get_by_label("secret", exact=True).fill("whsec_typed-by-the-operator")
    page.get_by_role("button", name="Create").click()
    error = page.locator("#n-config-url-error")
    expect(error).to_contain_text("webhook.url")
    expect(page.get_by_label("url (required)", exact=True)).to_have_attribute(
        "aria-invalid", "true"
    )
    assert "whsec_typed-by-the-operator" not in page.content()  # credentials not echoed

    page.get_by_label("url (required)", exact=True).fill(receiver.url)
    page.get_by_role("button", name="Create").click()
    expect(page.get_by_role("status")).to_contain_text("Created")
    expect(page.locator("#dest-name")).to_have_text(XSS_NAME)
    assert page.locator("img").count() == 0
    page.goto("/console/destinations")
    expect(page.get_by_role("link", name=XSS_NAME).first).to_be_visible()
    assert page.locator("img").count() == 0
    assert dialogs == []


def test_the_rate_limit_and_the_breaker_are_set_in_the_forms_and_shown(
    herald: Herald, page: Page, receiver: Receiver
) -> None:
    page.goto("/console/destinations")
    page.get_by_role("link", name="New destination").click()
    page.get_by_label("Name").fill("partner api")
    page.get_by_label("Events").fill("order.*")
    page.get_by_label("url (required)", exact=True).fill(receiver.url)
    page.get_by_label("Rate limit").fill("zero")
    page.get_by_role("button", name="Create").click()
    expect(page.locator("#n-rate-error")).to_contain_text("rate_limit_per_second")
    page.get_by_label("url (required)", exact=True).fill(receiver.url)
    page.get_by_label("Rate limit").fill("12.5")
    page.get_by_label("Circuit breaker").check()
    page.get_by_role("button", name="Create").click()
    expect(page.get_by_role("status")).to_contain_text("Created")
    expect(page.locator("#rate-limit")).to_have_text("12.5 a second")
    expect(page.locator("#circuit")).to_have_text("closed")
    # The edit form shows them as they are; cleared and unticked, both are off.
    expect(page.locator("#e-rate")).to_have_value("12.5")
    page.locator("#e-rate").fill("")
    page.get_by_label("Circuit breaker").uncheck()
    page.get_by_role("button", name="Save").click()
    expect(page.locator("#rate-limit")).to_have_text("none")
    expect(page.locator("#circuit")).to_have_text("breaker off")


def test_a_post_without_the_csrf_token_is_refused(
    herald: Herald, page: Page, receiver: Receiver
) -> None:
    dest = active_webhook(herald, receiver, name="guarded")
    url = f"/console/destinations/{dest['id']}/pause"
    # The session cookie goes along (same context); the form's token does not.
    refuses_without_csrf(page, url)
    page.goto(f"/console/destinations/{dest['id']}")
    expect(page.locator("#dest-status")).to_have_text("active")
    # The console's headers: no framing, no inline script, no sniffing.
    response = page.request.get("/console/")
    csp = response.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in csp
    assert "script-src 'self' 'nonce-" in csp
    assert "unsafe-inline" not in csp
    assert "unsafe-eval" not in csp
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["referrer-policy"] == "no-referrer"


# --- overview, events, rejected rows ----------------------------------------------------
def test_overview_events_and_rejected_rows(herald: Herald, page: Page, receiver: Receiver) -> None:
    dest = active_webhook(herald, receiver, name="counted")
    event_id = emit(herald, "shipment.sent")
    wait_for(
        lambda: (delivery_of(herald, event_id, dest) or ("", ""))[1] == "success",
        what="the delivery",
    )
    herald.insert_events([("evt_console_bad", "default", "shipment.sent", "[1, 2]")])
    wait_for(
        lambda: bool(herald.query("SELECT 1 FROM herald_outbox_rejected")), what="a rejected row"
    )

    page.goto("/console/")
    expect(page.locator("svg rect.bar.success").first).to_be_attached()
    expect(page.locator("#rejected")).not_to_have_text("0")

    page.get_by_role("link", name="Events").click()
    page.get_by_label("Event id").fill(event_id)
    page.get_by_role("button", name="Look up").click()
    expect(page.get_by_role("heading", name=f"Event {event_id}")).to_be_visible()
    expect(page.locator("pre.json")).to_contain_text('"n": 1')
    # The destination by its name, its id on hover.
    expect(page.locator("table.list").get_by_role("link", name="counted")).to_have_attribute(
        "title", dest["id"]
    )

    page.get_by_role("link", name="Rejected rows").click()
    expect(page.locator("table.list")).to_contain_text("evt_console_bad")
    expect(page.locator("table.list")).to_contain_text("[1, 2]")


def test_operator_keys_are_listed_apart_and_do_not_open_the_api(
    herald: Herald, operator_key: str
) -> None:
    both = herald.cli("keys", "create", "--operator", "--tenant", "acme", check=False)
    assert both.returncode == 2
    assert "belongs to no tenant" in both.stderr
    operators = herald.cli_json("keys", "list", "--operator")["data"]
    assert operators
    assert all(k["kind"] == "operator" and "tenant_id" not in k for k in operators)
    tenants = herald.cli_json("keys", "list")["data"]
    assert {k["id"] for k in tenants}.isdisjoint(k["id"] for k in operators)
    assert herald.get("/v2/event-destinations", key=operator_key)[0] == 401


def test_a_change_writes_the_same_audit_line_from_the_console_and_the_api(
    herald: Herald, page: Page, receiver: Receiver
) -> None:
    dest = active_webhook(herald, receiver, name="audited")
    pause(page, dest)
    request = urllib.request.Request(
        f"http://127.0.0.1:{herald.port}/v2/event-destinations/{dest['id']}",
        data=json.dumps({"status": "active"}).encode(),
        headers={
            "Authorization": f"Bearer {herald.api_key('default')}",
            "Content-Type": "application/json",
        },
        method="PATCH",
    )
    with urllib.request.urlopen(request, timeout=5) as resp:
        assert resp.status == 200

    def lines() -> list[dict[str, Any]]:
        return [
            e
            for e in herald.log_events()
            if e.get("event") == "destination_updated" and e.get("destination_id") == dest["id"]
        ]

    wait_for(lambda: len(lines()) == 2, what="two audit lines")
    console, api = lines()
    assert console["by"].startswith("console:")
    assert api["by"] == "api:default"
    assert (console["status"], api["status"]) == ("inactive", "active")
    assert console.keys() == api.keys()
    assert console["changed"] == api["changed"] == ["status"]
    # The CLI writes it too (to its stderr), with no request to name.
    proc = herald.cli("destinations", "update", dest["id"], "--data", '{"status": "inactive"}')
    [cli] = [
        line
        for line in map(json.loads, filter(None, proc.stderr.splitlines()))
        if line.get("event") == "destination_updated"
    ]
    assert cli["by"].startswith("cli:")
    assert cli.keys() == console.keys() - {"request_id"}
    assert (cli["status"], cli["changed"]) == ("inactive", ["status"])


def test_the_core_flows_work_with_javascript_off(
    browser: Browser, herald: Herald, operator_key: str, receiver: Receiver
) -> None:
    ctx = browser.new_context(base_url=f"http://127.0.0.1:{herald.port}", java_script_enabled=False)
    try:
        page = ctx.new_page()
        sign_in(page, operator_key)
        expect(page.get_by_role("heading", name="Overview")).to_be_visible()
        dest = active_webhook(herald, receiver, name="no script")
        pause(page, dest)
        page.get_by_role("button", name="Resume").click()
        expect(page.locator("#dest-status")).to_have_text("active")
        page.get_by_role("link", name="Deliveries", exact=True).click()
        page.get_by_label("Destination id").fill(dest["id"])
        page.get_by_role("button", name="Filter").click()
        expect(page).to_have_url(re.compile(re.escape(dest["id"])))
        page.get_by_role("button", name="Sign out").click()
        expect(page.get_by_role("status")).to_have_text("You are signed out.")
    finally:
        ctx.close()
