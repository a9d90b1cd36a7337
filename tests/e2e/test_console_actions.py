"""The console's actions in a real browser (Debian's Chromium through Playwright): every
form redirects after its POST (a reload repeats nothing; an action's address opened
later leads to its page), "Retry now" followed to its outcome by a notice that
reloads itself without JavaScript, every field's error at once, the fields a type
uses and no other, and custom headers as name/value rows through create and edit.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect

from tests.support.browser import console_daemon, sign_in, wait_for
from tests.support.daemon import Herald, free_port
from tests.support.receiverauth import TestCA

pytestmark = pytest.mark.xdist_group("console")

MASK = "********"
PEM_FIELDS = (
    "tls_client_certificate",
    "tls_client_key",
    "tls_ca_certificate",
    "oauth2_private_key",
)


class Gated(ThreadingHTTPServer):
    """A receiver answering ``status`` to every POST once ``gate`` is open, keeping the
    headers of each request."""

    status: int
    gate: threading.Event
    seen: list[dict[str, str]]


class _Answer(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        server: Gated = self.server  # type: ignore[assignment]
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        server.gate.wait(30)
        server.seen.append(dict(self.headers.items()))
        self.send_response(server.status)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def receiver() -> Iterator[Gated]:
    server = Gated(("127.0.0.1", free_port()), _Answer)
    server.status, server.gate, server.seen = 204, threading.Event(), []
    server.gate.set()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.gate.set()
    server.shutdown()
    server.server_close()


def url_of(receiver: Gated) -> str:
    return f"http://127.0.0.1:{receiver.server_address[1]}/hook"


@pytest.fixture(scope="module")
def herald(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Herald]:
    yield from console_daemon(
        tmp_path_factory,
        "console_actions",
        {"delivery": {"backoff_base_seconds": 600}},
    )


def audited(herald: Herald, event: str, dest_id: str) -> int:
    return sum(
        1
        for e in herald.log_events()
        if e.get("event") == event and e.get("destination_id") == dest_id
    )


def create(page: Page, name: str, url: str, headers: dict[str, str] | None = None) -> str:
    """Create a webhook through the form; its id."""
    page.goto("/console/destinations/new?type=webhook")
    page.get_by_label("Name").fill(name)
    page.get_by_label("Events").fill("*")
    page.get_by_label("url (required)", exact=True).fill(url)
    for i, (key, value) in enumerate((headers or {}).items(), start=1):
        page.get_by_label(f"custom headers {i} key").fill(key)
        page.get_by_label(f"custom headers {i} value").fill(value)
    page.get_by_role("button", name="Create").click()
    expect(page.get_by_role("status")).to_contain_text("Created")
    return page.locator("dl.facts code").first.inner_text()


def wait_active(herald: Herald, dest_id: str) -> None:
    def active() -> bool:
        rows = herald.query("SELECT status FROM herald_destinations WHERE id = ?", (dest_id,))
        return bool(rows and rows[0][0] == "active")

    wait_for(active, what="the destination's verification")


def test_every_form_redirects_after_its_post_and_a_reload_repeats_nothing(
    herald: Herald, page: Page, receiver: Gated
) -> None:
    name = f"prg {time.monotonic_ns()}"
    dest_id = create(page, name, url_of(receiver))
    page.reload()
    assert herald.query("SELECT COUNT(*) FROM herald_destinations WHERE name = ?", (name,)) == [
        (1,)
    ]
    wait_active(herald, dest_id)
    here = f"/console/destinations/{dest_id}"

    page.goto(here)
    page.get_by_role("button", name="Pause").click()
    expect(page.locator("#dest-status")).to_have_text("inactive")
    page.get_by_role("button", name="Resume").click()
    expect(page.locator("#dest-status")).to_have_text("active")
    page.reload()
    assert audited(herald, "destination_updated", dest_id) == 2

    page.get_by_role("button", name="Send test").click()
    expect(page.locator("#test-status")).to_have_text("success")
    expect(page).to_have_url(re.compile(r"\?test=dlv_"))
    page.reload()
    expect(page.locator("#test-status")).to_have_text("success")  # read again, not sent
    tests = "SELECT COUNT(*) FROM herald_deliveries WHERE destination_id = ? AND kind = 'test'"
    assert herald.query(tests, (dest_id,)) == [(1,)]

    page.get_by_role("button", name="Rotate secret").click()
    secret = page.locator("#new-secret").inner_text()
    assert secret.startswith("whsec_")
    expect(page).to_have_url(re.compile(re.escape(here) + "$"))
    page.reload()
    expect(page.locator("#new-secret")).to_have_count(0)  # shown once
    assert secret not in page.content()
    assert audited(herald, "destination_secret_rotated", dest_id) == 1

    page.get_by_label("Name").fill(name + " renamed")
    page.get_by_role("button", name="Save").click()
    expect(page.get_by_role("status")).to_contain_text("Saved")
    page.reload()
    page.get_by_role("button", name="Re-verify").click()
    expect(page.get_by_role("status")).to_contain_text("verification ping")
    page.reload()
    assert audited(herald, "destination_updated", dest_id) == 3
    assert audited(herald, "destination_verification_sent", dest_id) == 1
    wait_active(herald, dest_id)

    page.goto(f"{here}/delete")
    page.get_by_role("button", name="Delete").last.click()
    expect(page.get_by_role("status")).to_contain_text("deleted")
    page.reload()
    assert audited(herald, "destination_deleted", dest_id) == 1


def test_an_actions_address_opened_with_get_leads_to_its_page(
    herald: Herald, page: Page, receiver: Gated
) -> None:
    dest = herald.create_webhook(url_of(receiver), name="opened later")
    wait_active(herald, dest["id"])
    here = f"/console/destinations/{dest['id']}"
    for action in ("edit", "pause", "resume", "test", "verify", "rotate-secret"):
        answer = page.goto(f"{here}/{action}")
        assert answer is not None
        assert answer.status == 200, action
        expect(page).to_have_url(re.compile(re.escape(here) + "$"))
        expect(page.locator("#dest-name")).to_have_text("opened later")
    assert audited(herald, "destination_updated", dest["id"]) == 0
    assert audited(herald, "destination_secret_rotated", dest["id"]) == 0

    event_id = f"evt_get_{time.monotonic_ns()}"
    herald.insert_events([(event_id, "default", "order.created", "{}")])
    wait_for(
        lambda: bool(
            herald.query("SELECT id FROM herald_deliveries WHERE event_id = ?", (event_id,))
        ),
        what="the delivery",
    )
    delivery_id = herald.query("SELECT id FROM herald_deliveries WHERE event_id = ?", (event_id,))[
        0
    ][0]
    answer = page.goto(f"/console/deliveries/{delivery_id}/retry")
    assert answer is not None
    assert answer.status == 200
    expect(page).to_have_url(re.compile(re.escape(f"/console/deliveries/{delivery_id}") + "$"))
    expect(page.locator("#retry-notice")).to_have_count(0)
    # Signing out is a POST too; its address opened leads home, still signed in.
    answer = page.goto("/console/logout")
    assert answer is not None
    assert answer.status == 200
    expect(page.get_by_role("heading", name="Overview")).to_be_visible()


def test_retry_now_shows_the_outcome_in_a_notice_that_refreshes_itself_without_javascript(
    browser: Browser, herald: Herald, operator_key: str, receiver: Gated
) -> None:
    dest = herald.create_webhook(url_of(receiver), name="retried")
    wait_active(herald, dest["id"])
    receiver.status = 500  # the receiver fails
    event_id = f"evt_retry_{time.monotonic_ns()}"
    herald.insert_events([(event_id, "default", "order.created", "{}")])
    failed = "SELECT id FROM herald_deliveries WHERE event_id = ? AND attempt_count >= 1"
    wait_for(lambda: bool(herald.query(failed, (event_id,))), what="the first failed attempt")
    delivery_id = herald.query(failed, (event_id,))[0][0]

    ctx = browser.new_context(base_url=f"http://127.0.0.1:{herald.port}", java_script_enabled=False)
    ctx.set_default_timeout(15_000)
    try:
        page = ctx.new_page()
        sign_in(page, operator_key)
        page.goto(f"/console/deliveries/{delivery_id}")
        page.get_by_role("button", name="Retry now").click()
        notice = page.locator("#retry-notice")
        expect(notice).to_contain_text("attempt 2 failed")  # the page reloaded itself
        expect(notice).to_contain_text("HTTP 500")
        page.reload()
        expect(notice).to_have_count(0)  # the notice does not outlive its outcome

        # It succeeds now, slowly: the page says the attempt is on its way meanwhile.
        receiver.gate.clear()
        receiver.status = 204
        page.get_by_role("button", name="Retry now").click()
        expect(notice).to_contain_text("on its way")
        expect(page.locator('meta[http-equiv="refresh"]')).to_have_count(1)
        receiver.gate.set()
        expect(notice).to_contain_text("attempt 3 succeeded")  # no reload of ours
        expect(page.locator("#delivery-status")).to_have_text("success")
        expect(page.locator('meta[http-equiv="refresh"]')).to_have_count(0)
        page.reload()
        expect(notice).to_have_count(0)
        expect(page.locator("#delivery-status")).to_have_text("success")
    finally:
        receiver.gate.set()
        receiver.status = 204
        ctx.close()


def test_the_create_form_shows_every_fields_error_at_once(page: Page) -> None:
    page.goto("/console/destinations/new?type=webhook")
    page.get_by_label("Events").fill("")
    page.get_by_label("url (required)", exact=True).fill("not a url")
    page.get_by_label("custom headers 1 key").fill("Bad Name")
    page.get_by_label("custom headers 1 value").fill("typed-credential")
    page.get_by_role("button", name="Create").click()
    expect(page.locator("#n-name-error")).to_contain_text("name")
    expect(page.locator("#n-events-error")).to_contain_text("events")
    expect(page.locator("#n-config-url-error")).to_contain_text("webhook.url")
    expect(page.locator("#n-config-custom-headers-error")).to_contain_text("header name")
    # The name typed is kept; the credential typed is not sent back.
    expect(page.get_by_label("custom headers 1 key")).to_have_value("Bad Name")
    expect(page.get_by_label("custom headers 1 value")).to_have_value("")
    assert "typed-credential" not in page.content()


def test_a_form_shows_the_fields_its_type_uses(page: Page) -> None:
    page.goto("/console/destinations/new?type=webhook")
    expect(page.get_by_label("url (required)", exact=True)).to_be_visible()
    expect(page.get_by_label("endpoint url", exact=True)).to_have_count(0)
    expect(page.locator('input[name="config.custom_headers"]')).to_have_count(0)  # no JSON box
    expect(page.locator("fieldset.pairs")).to_contain_text("X-Api-Key")  # the format hint
    page.goto("/console/destinations/new?type=aws_sqs")
    expect(page.get_by_label("endpoint url", exact=True)).to_be_visible()
    expect(page.locator("fieldset.pairs")).to_have_count(0)


def test_custom_headers_round_trip_through_create_and_edit_as_rows(
    herald: Herald, page: Page, receiver: Gated
) -> None:
    dest_id = create(
        page,
        "with headers",
        url_of(receiver),
        {"X-Api-Key": "key-one", "X-Tenant": "acme"},
    )
    wait_active(herald, dest_id)
    here = f"/console/destinations/{dest_id}"

    def sent() -> dict[str, str]:
        """The custom headers of a test ping sent now."""
        page.goto(here)
        page.get_by_role("button", name="Send test").click()
        expect(page.locator("#test-status")).to_have_text("success")
        last = receiver.seen[-1]
        return {k: last[k] for k in ("X-Api-Key", "X-Tenant", "X-Added") if k in last}

    assert sent() == {"X-Api-Key": "key-one", "X-Tenant": "acme"}
    # On edit: the names, the values masked; left masked, they are kept.
    expect(page.get_by_label("custom headers 1 key")).to_have_value("X-Api-Key")
    expect(page.get_by_label("custom headers 1 value")).to_have_value(MASK)
    expect(page.get_by_label("custom headers 2 key")).to_have_value("X-Tenant")
    assert "key-one" not in page.content()
    page.get_by_label("custom headers 3 key").fill("X-Added")
    page.get_by_label("custom headers 3 value").fill("added")
    page.get_by_label("custom headers 2 key").fill("")
    page.get_by_label("custom headers 2 value").fill("")
    page.get_by_role("button", name="Save").click()
    expect(page.get_by_role("status")).to_contain_text("Saved")
    assert sent() == {"X-Api-Key": "key-one", "X-Added": "added"}
    assert "key-one" not in page.content()

    # A new URL with the values left masked: they must be typed again (the re-point rule).
    page.get_by_label("url (required)", exact=True).fill(url_of(receiver) + "/moved")
    page.get_by_role("button", name="Save").click()
    expect(page.locator("#e-config-custom-headers-error")).to_contain_text("given again")
    expect(page.get_by_label("custom headers 1 value")).to_have_value("")
    page.get_by_label("custom headers 1 value").fill("key-two")
    page.get_by_label("custom headers 2 value").fill("added")
    page.get_by_role("button", name="Save").click()
    expect(page.get_by_role("status")).to_contain_text("Saved")
    wait_active(herald, dest_id)
    assert sent() == {"X-Api-Key": "key-two", "X-Added": "added"}
    assert "key-two" not in page.content()


def test_the_portal_acts_the_same_way(
    herald: Herald, context: BrowserContext, receiver: Gated
) -> None:
    dest = herald.create_webhook(url_of(receiver), name="portal actions")
    wait_active(herald, dest["id"])
    here = f"/portal/destinations/{dest['id']}"
    page = context.new_page()
    page.goto(f"{here}?token={herald.portal_token('default')}")
    expect(page).to_have_url(re.compile(re.escape(here) + "$"))

    page.get_by_role("button", name="Rotate secret").click()
    secret = page.locator("#new-secret").inner_text()
    assert secret.startswith("whsec_")
    page.reload()
    assert secret not in page.content()

    event_id = f"evt_portal_{time.monotonic_ns()}"
    herald.insert_events([(event_id, "default", "order.created", "{}")])
    done = "SELECT id FROM herald_deliveries WHERE event_id = ? AND status = 'success'"
    wait_for(lambda: bool(herald.query(done, (event_id,))), what="the delivery")
    page.goto(f"/portal/deliveries/{herald.query(done, (event_id,))[0][0]}")
    page.get_by_role("button", name="Retry now").click()
    expect(page.locator("#retry-notice")).to_contain_text("attempt 2 succeeded")
    page.reload()
    expect(page.locator("#retry-notice")).to_have_count(0)
    answer = page.goto(f"{here}/pause")
    assert answer is not None
    assert answer.status == 200
    expect(page.locator("#dest-status")).to_have_text("active")


def shown_config(herald: Herald, dest_id: str) -> dict[str, Any]:
    """The destination's webhook config as the API shows it (credentials masked)."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{herald.port}/v2/event-destinations/{dest_id}",
        headers={"Authorization": f"Bearer {herald.api_key('default')}"},
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        body: dict[str, Any] = json.loads(resp.read())
    return dict(body["webhook"])


def test_the_destination_forms_offer_the_tenants_catalog_types(
    herald: Herald, page: Page, context: BrowserContext, receiver: Gated
) -> None:
    """Issue 27 item 5: beside the events box (which still takes any pattern), the create
    and edit forms of the console and the portal offer the tenant's catalog types."""
    register = urllib.request.Request(
        f"http://127.0.0.1:{herald.port}/v2/event-types/shipment.dispatched",
        data=b'{"description": "A parcel left"}',
        headers={
            "Authorization": f"Bearer {herald.api_key('default')}",
            "Content-Type": "application/json",
        },
        method="PUT",
    )
    with urllib.request.urlopen(register, timeout=30) as resp:
        assert resp.status in (200, 201)

    def offered(p: Page, input_id: str) -> list[str]:
        """What the browser itself offers in the input's list (its datalist's options)."""
        values: list[str] = p.eval_on_selector(
            f"#{input_id}", "el => Array.from(el.list.options).map(o => o.value)"
        )
        return values

    page.goto("/console/destinations/new?type=webhook")
    assert "shipment.dispatched" in offered(page, "n-events-add")
    assert "herald.delivery.exhausted" in offered(page, "n-events-add")  # Herald's own, too
    page.get_by_label("Name").fill("catalog picked")
    page.get_by_label("Events").fill("order.*")
    page.get_by_label("Add from the catalog").fill("shipment.dispatched")
    page.get_by_label("url (required)", exact=True).fill(url_of(receiver))
    page.get_by_role("button", name="Create").click()
    expect(page.get_by_role("status")).to_contain_text("Created")
    dest_id = page.locator("dl.facts code").first.inner_text()
    expect(page.get_by_label("Events")).to_have_value("order.*\nshipment.dispatched")
    assert "shipment.dispatched" in offered(page, "e-events-add")
    # A free pattern in the same input is taken as typed.
    page.get_by_label("Add from the catalog").fill("invoice.*")
    page.get_by_role("button", name="Save").click()
    expect(page.get_by_role("status")).to_contain_text("Saved")
    expect(page.get_by_label("Events")).to_have_value("order.*\nshipment.dispatched\ninvoice.*")

    portal = context.new_page()
    here = f"/portal/destinations/{dest_id}"
    portal.goto(f"{here}?token={herald.portal_token('default')}")
    expect(portal).to_have_url(re.compile(re.escape(here) + "$"))
    assert "shipment.dispatched" in offered(portal, "e-events-add")
    portal.goto("/portal/destinations/new?type=webhook")
    assert "shipment.dispatched" in offered(portal, "n-events-add")


def test_pem_fields_are_textareas_that_round_trip_a_pem(
    herald: Herald, page: Page, receiver: Gated
) -> None:
    """Issue 26: the PEM fields are multi-line; the browser posts their line breaks as
    CRLF, and the PEM comes out as it went in, through create and an unchanged save."""
    client = TestCA().issue("console-client")
    page.goto("/console/destinations/new?type=webhook")
    for name in PEM_FIELDS:
        expect(page.locator(f'textarea[name="config.{name}"]')).to_have_count(1)
        expect(page.locator(f'input[name="config.{name}"]')).to_have_count(0)
    page.get_by_label("Name").fill("with a client certificate")
    page.get_by_label("Events").fill("*")
    page.get_by_label("url (required)", exact=True).fill(url_of(receiver))
    page.get_by_label("tls client certificate").fill(client.certificate)
    page.get_by_label("tls client key").fill(client.key)
    page.get_by_role("button", name="Create").click()
    expect(page.get_by_role("status")).to_contain_text("Created")
    dest_id = page.locator("dl.facts code").first.inner_text()
    assert "\n" in client.certificate.strip()  # several lines, as a PEM is
    shown = shown_config(herald, dest_id)
    assert shown["tls_client_certificate"] == client.certificate
    assert shown["tls_client_key"] == MASK

    # The edit form shows the certificate in a textarea, the key masked; saved as it is,
    # both stay (the key's mask means "unchanged").
    expect(page.get_by_label("tls client certificate")).to_have_value(client.certificate)
    expect(page.get_by_label("tls client key")).to_have_value(MASK)
    assert client.key.splitlines()[1] not in page.content()
    page.get_by_role("button", name="Save").click()
    expect(page.get_by_role("status")).to_contain_text("Saved")
    assert shown_config(herald, dest_id)["tls_client_certificate"] == client.certificate
    wait_active(herald, dest_id)  # the key kept still matches: the destination works
