"""The tenant portal in a real browser: Debian's Chromium driven by Playwright.

One ``herald run`` (SQLite) for the module, with ``console.portal_frame_ancestors``
naming one origin of a parent page this module serves, so that the portal's cookie
is the framed kind (SameSite=None, Secure, Partitioned). The tenant's product is
played by the test: it asks ``POST /v2/token`` with the tenant's API key and opens
``/portal/?token=…``. Expiry is tested by moving the token's row in the database,
never by waiting.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import (
    Browser,
    BrowserContext,
    ConsoleMessage,
    FrameLocator,
    Page,
    expect,
)

from tests.support.browser import (
    XSS_NAME,
    FramingPage,
    Receiver,
    active_webhook,
    collect_dialogs,
    console_daemon,
    refuses_without_csrf,
    wait_for,
)
from tests.support.daemon import Herald

pytestmark = pytest.mark.xdist_group("console")


@pytest.fixture(scope="module")
def parent() -> Iterator[FramingPage]:
    """The tenant product's page: its ``localhost`` origin may frame the portal; the
    same page served as ``http://127.0.0.1:PORT`` is another origin, which may not."""
    with FramingPage() as page:
        yield page


@pytest.fixture(scope="module")
def herald(tmp_path_factory: pytest.TempPathFactory, parent: FramingPage) -> Iterator[Herald]:
    yield from console_daemon(
        tmp_path_factory,
        "portal",
        {
            "delivery": {"max_retries": 1},
            "console": {"portal_frame_ancestors": [parent.origin]},
        },
    )


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with Receiver() as r:
        yield r


def open_portal(page: Page, herald: Herald, tenant: str, path: str = "/portal/") -> str:
    """Open the portal as the tenant's product does; the token used."""
    token = herald.portal_token(tenant)
    page.goto(f"{path}?token={token}")
    expect(page).to_have_url(re.compile(re.escape(path) + "$"))
    return token


def status(page: Page, path: str) -> int:
    """The HTTP status of the page ``path`` opens."""
    response = page.goto(path)
    assert response is not None
    return response.status


def last_line(herald: Herald, event: str) -> dict[str, Any]:
    """The daemon's last log line of ``event``."""
    return [e for e in herald.log_events() if e.get("event") == event][-1]


def pause_and_resume(page: Page | FrameLocator) -> None:
    """Pause the destination whose page is open, then resume it, by their buttons."""
    page.get_by_role("button", name="Pause").click()
    expect(page.locator("#dest-status")).to_have_text("inactive")
    page.get_by_role("button", name="Resume").click()
    expect(page.locator("#dest-status")).to_have_text("active")


def delivered(herald: Herald, tenant: str, dest: dict[str, Any]) -> tuple[str, str]:
    """Emit one event for ``tenant``; (event id, delivery id) once it is delivered."""
    event_id = f"evt_portal_{time.monotonic_ns()}"
    herald.insert_events([(event_id, tenant, "order.created", '{"n": 1}')])

    def done() -> bool:
        rows = herald.query(
            "SELECT status FROM herald_deliveries WHERE event_id = ? AND destination_id = ?",
            (event_id, dest["id"]),
        )
        return rows == [("success",)]

    wait_for(done, what="the delivery")
    [(delivery_id,)] = herald.query(
        "SELECT id FROM herald_deliveries WHERE event_id = ?", (event_id,)
    )
    return event_id, delivery_id


def token_row(herald: Herald, tenant: str) -> tuple[str, float, float]:
    """(id, created_at, expires_at) of the tenant's newest traded token."""
    rows = herald.query(
        "SELECT id, created_at, expires_at FROM herald_session_tokens"
        " WHERE tenant_id = ? AND traded_at IS NOT NULL ORDER BY traded_at DESC LIMIT 1",
        (tenant,),
    )
    return rows[0]


# --- the token flow ------------------------------------------------------------------------
def test_the_token_flow_opens_the_tenants_portal_and_the_token_leaves_the_url(
    herald: Herald, context: BrowserContext, receiver: Receiver
) -> None:
    mine = active_webhook(herald, receiver, tenant="acme", name="Acme orders")
    theirs = active_webhook(herald, receiver, tenant="globex", name="Globex orders")
    _, my_delivery = delivered(herald, "acme", mine)
    _, their_delivery = delivered(herald, "globex", theirs)

    page = context.new_page()
    token = open_portal(page, herald, "acme")
    expect(page.get_by_role("heading", name="Overview")).to_be_visible()
    assert "token" not in page.url
    cookie = next(c for c in context.cookies() if c["name"] == "herald_portal")
    assert cookie["httpOnly"]
    assert cookie["path"] == "/portal"
    # Framing is configured: a cookie a cross-site frame gets (Secure works on 127.0.0.1).
    assert (cookie["sameSite"], cookie["secure"]) == ("None", True)
    expect(page.get_by_text("tenant acme")).to_be_visible()
    expect(page.get_by_role("link", name="Rejected rows")).to_have_count(0)

    page.get_by_role("link", name="Destinations", exact=True).click()
    expect(page.get_by_role("link", name="Acme orders")).to_be_visible()
    expect(page.get_by_role("link", name="Globex orders")).to_have_count(0)
    expect(page.get_by_label("Tenant")).to_have_count(0)  # no tenant filter in the portal

    page.get_by_role("link", name="Deliveries", exact=True).click()
    expect(page.locator("table.list")).to_contain_text(my_delivery)
    expect(page.locator("table.list")).not_to_contain_text(their_delivery)

    assert token not in page.content()
    assert token not in herald.log()
    assert last_line(herald, "portal_signed_in")["by"] == "portal:acme"


def test_a_tenant_never_sees_another_tenants_objects_even_by_guessing_ids(
    herald: Herald, context: BrowserContext, receiver: Receiver
) -> None:
    theirs = active_webhook(herald, receiver, tenant="initech", name="Initech orders")
    their_event, their_delivery = delivered(herald, "initech", theirs)
    page = context.new_page()
    open_portal(page, herald, "acme")
    for path in (
        f"/portal/destinations/{theirs['id']}",
        f"/portal/destinations/{theirs['id']}/delete",
        f"/portal/deliveries/{their_delivery}",
        f"/portal/events/{their_event}",
        f"/portal/events/{their_event}?tenant=initech",
        "/portal/outbox/rejected",
    ):
        assert status(page, path) == 404, path
    # The tenant filter of the console is no filter here: the scope's tenant wins.
    page.goto(f"/portal/deliveries?tenant=initech&destination={theirs['id']}")
    expect(page.locator("table.list tbody tr")).to_have_count(1)
    expect(page.locator("table.list")).to_contain_text("No delivery matches.")
    page.goto("/portal/destinations?tenant=initech")
    expect(page.get_by_role("link", name="Initech orders")).to_have_count(0)
    # A change aimed at another tenant's destination, with this session's CSRF token.
    page.goto("/portal/destinations")
    csrf = page.locator("form.signout input[name=csrf_token]").get_attribute("value") or ""
    for action in ("pause", "test", "rotate-secret", "delete"):
        refused = page.request.post(
            f"/portal/destinations/{theirs['id']}/{action}",
            form={"csrf_token": csrf},
            max_redirects=0,
        )
        assert refused.status == 404, action
    refused = page.request.post(
        f"/portal/deliveries/{their_delivery}/retry", form={"csrf_token": csrf}, max_redirects=0
    )
    assert refused.status == 404
    assert herald.query(
        "SELECT status, deleted_at FROM herald_destinations WHERE id = ?", (theirs["id"],)
    ) == [("active", None)]


def test_a_used_an_expired_and_a_made_up_token_are_refused(
    herald: Herald, browser: Browser, context: BrowserContext
) -> None:
    page = context.new_page()
    token = open_portal(page, herald, "acme")
    other = browser.new_context(base_url=f"http://127.0.0.1:{herald.port}")
    try:
        thief = other.new_page()
        assert status(thief, f"/portal/?token={token}") == 401
        expect(thief.get_by_role("alert")).to_contain_text("already exchanged")
        assert token not in thief.content()
        assert token not in thief.url  # refused, it leaves the address too
        assert not [c for c in other.cookies() if c["name"] == "herald_portal"]

        stale = herald.portal_token("acme")
        herald.query(
            "UPDATE herald_session_tokens SET expires_at = ? WHERE traded_at IS NULL",
            (time.time() - 1,),
        )
        assert status(thief, f"/portal/deliveries?token={stale}") == 401
        expect(thief.get_by_role("alert")).to_contain_text("expired")

        assert status(thief, "/portal/?token=tk_made-up") == 401
        expect(thief.get_by_role("alert")).to_contain_text("not valid")
        thief.goto("/portal/destinations")  # no session: the landing page
        expect(thief).to_have_url(re.compile(r"/portal/login$"))
        expect(thief.get_by_role("heading", level=1)).to_have_text(
            "Open the portal from your product"
        )
    finally:
        other.close()


def test_each_request_extends_the_session_never_past_a_day_and_an_expired_one_ends(
    herald: Herald, context: BrowserContext
) -> None:
    page = context.new_page()
    open_portal(page, herald, "acme")
    token_id, _, _ = token_row(herald, "acme")

    # Nearly expired: the next request moves it 30 minutes from now.
    herald.query(
        "UPDATE herald_session_tokens SET expires_at = ? WHERE id = ?", (time.time() + 5, token_id)
    )
    before = time.time()
    page.goto("/portal/deliveries")
    expect(page.get_by_role("heading", name="Deliveries")).to_be_visible()
    _, _, expires = token_row(herald, "acme")
    assert before + 1800 - 5 <= expires <= time.time() + 1800 + 5

    # Made almost a day ago, nearly expired: extended to the day's end, not 30 minutes on.
    day_end = time.time() + 60
    herald.query(
        "UPDATE herald_session_tokens SET created_at = ?, expires_at = ? WHERE id = ?",
        (day_end - 86_400, time.time() + 5, token_id),
    )
    page.goto("/portal/destinations")
    expect(page.get_by_role("heading", name="Destinations")).to_be_visible()
    _, _, expires = token_row(herald, "acme")
    assert expires == pytest.approx(day_end, abs=1)

    # Past its expiry: the session no longer opens.
    herald.query(
        "UPDATE herald_session_tokens SET expires_at = ? WHERE id = ?", (time.time() - 1, token_id)
    )
    page.goto("/portal/deliveries")
    expect(page).to_have_url(re.compile(r"/portal/login$"))


# --- framing ---------------------------------------------------------------------------------
def test_the_portal_loads_in_a_frame_of_an_allowed_origin_only(
    herald: Herald, browser: Browser, parent: FramingPage, receiver: Receiver
) -> None:
    dest = active_webhook(herald, receiver, tenant="acme", name="Acme framed")
    ctx = browser.new_context()
    ctx.set_default_timeout(10_000)
    try:
        page = ctx.new_page()
        portal = f"http://127.0.0.1:{herald.port}/portal/?token={herald.portal_token('acme')}"
        page.goto(parent.url(portal))
        framed = page.frame_locator("#portal")
        expect(framed.get_by_role("heading", name="Overview")).to_be_visible()
        framed.get_by_role("link", name="Destinations", exact=True).click()
        framed.get_by_role("link", name="Acme framed").click()
        # A POST from inside the cross-site frame: its cookie and CSRF token go along.
        pause_and_resume(framed)
        assert herald.query(
            "SELECT status FROM herald_destinations WHERE id = ?", (dest["id"],)
        ) == [("active",)]

        refusals: list[str] = []

        def on_console(message: ConsoleMessage) -> None:
            if "frame-ancestors" in message.text:
                refusals.append(message.text)

        other = ctx.new_page()
        other.on("console", on_console)
        portal = f"http://127.0.0.1:{herald.port}/portal/?token={herald.portal_token('acme')}"
        other.goto(parent.url(portal, host="127.0.0.1"))
        wait_for(lambda: bool(refusals), what="Chromium to refuse the frame")
        expect(other.frame_locator("#portal").get_by_role("heading")).to_have_count(0)
    finally:
        ctx.close()


def test_the_console_is_never_framed_and_the_portals_headers_name_the_origins(
    herald: Herald, context: BrowserContext, parent: FramingPage
) -> None:
    page = context.new_page()
    open_portal(page, herald, "acme")
    portal = page.request.get("/portal/")
    assert f"frame-ancestors {parent.origin}" in portal.headers["content-security-policy"]
    assert "x-frame-options" not in portal.headers
    console = page.request.get("/console/login")
    assert "frame-ancestors 'none'" in console.headers["content-security-policy"]
    assert console.headers["x-frame-options"] == "DENY"


# --- actions ---------------------------------------------------------------------------------
def test_pause_resume_and_send_test_from_the_portal(
    herald: Herald, context: BrowserContext, receiver: Receiver
) -> None:
    dest = active_webhook(herald, receiver, tenant="acme", name="Acme pausable")
    page = context.new_page()
    open_portal(page, herald, "acme", f"/portal/destinations/{dest['id']}")
    pause_and_resume(page)
    page.get_by_role("button", name="Send test").click()
    expect(page.locator("#test-status")).to_have_text("success")
    expect(page.locator("table.attempts")).to_contain_text("204")

    def lines(event: str) -> list[dict[str, Any]]:
        return [
            e
            for e in herald.log_events()
            if e.get("event") == event and e.get("destination_id") == dest["id"]
        ]

    paused, resumed = lines("destination_updated")
    assert (paused["status"], resumed["status"]) == ("inactive", "active")
    assert paused["by"] == resumed["by"] == "portal:acme"
    assert lines("destination_tested")[-1]["by"] == "portal:acme"


def test_a_name_is_rendered_as_text_and_a_post_without_csrf_is_refused(
    herald: Herald, context: BrowserContext, receiver: Receiver
) -> None:
    page = context.new_page()
    dialogs = collect_dialogs(page)
    open_portal(page, herald, "acme", "/portal/destinations/new")
    expect(page.get_by_label("Tenant")).to_have_count(0)
    page.get_by_label("Name").fill(XSS_NAME)
    page.get_by_label("Events").fill("order.*")
    page.get_by_label("url (required)", exact=True).fill(receiver.url)
    page.get_by_role("button", name="Create").click()
    expect(page.locator("#dest-name")).to_have_text(XSS_NAME)
    dest_id = page.url.rsplit("/", 1)[-1].split("?")[0]
    assert herald.query("SELECT tenant_id FROM herald_destinations WHERE id = ?", (dest_id,)) == [
        ("acme",)
    ]
    page.goto("/portal/destinations")
    expect(page.get_by_role("link", name=XSS_NAME).first).to_be_visible()
    assert page.locator("img").count() == 0
    assert dialogs == []

    url = f"/portal/destinations/{dest_id}/delete"
    refuses_without_csrf(page, url)
    assert herald.query("SELECT deleted_at FROM herald_destinations WHERE id = ?", (dest_id,)) == [
        (None,)
    ]


def test_sign_out_ends_the_portal_session(herald: Herald, context: BrowserContext) -> None:
    page = context.new_page()
    open_portal(page, herald, "acme")
    token_id, _, _ = token_row(herald, "acme")
    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_role("status")).to_have_text("You are signed out.")
    page.goto("/portal/deliveries")
    expect(page).to_have_url(re.compile(r"/portal/login$"))
    [(revoked,)] = herald.query(
        "SELECT revoked_at FROM herald_session_tokens WHERE id = ?", (token_id,)
    )
    assert revoked is not None
    assert last_line(herald, "portal_signed_out")["by"] == "portal:acme"


def test_the_portals_core_flows_work_with_javascript_off(
    herald: Herald, browser: Browser, receiver: Receiver
) -> None:
    dest = active_webhook(herald, receiver, tenant="acme", name="Acme no script")
    ctx = browser.new_context(base_url=f"http://127.0.0.1:{herald.port}", java_script_enabled=False)
    ctx.set_default_timeout(10_000)
    try:
        page = ctx.new_page()
        open_portal(page, herald, "acme", "/portal/deliveries")
        page.get_by_label("Destination id").fill(dest["id"])
        page.get_by_role("button", name="Filter").click()
        expect(page).to_have_url(re.compile(re.escape(dest["id"])))
        page.goto(f"/portal/destinations/{dest['id']}")
        pause_and_resume(page)
        page.get_by_role("button", name="Sign out").click()
        expect(page.get_by_role("status")).to_have_text("You are signed out.")
    finally:
        ctx.close()
