"""The portal as the operator's product, in a real browser (Debian's Chromium under
Playwright): its name, logo and accent from the config, the tenant's display name,
no operator identity on a replay made by the CLI or the console, and pages that fit
a 390 px wide frame.

One ``herald run`` (SQLite) for the module, branded through ``[console]``.
"""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import BrowserContext, Page, expect

from tests.support.browser import Receiver, console_daemon, sign_in, wait_for
from tests.support.daemon import Herald

pytestmark = pytest.mark.xdist_group("console")

NAME = "Acme Hooks"
ACCENT = "#c2185b"
ACCENT_RGB = "rgb(194, 24, 91)"
LOGO = (
    "data:image/svg+xml;base64,"
    + base64.b64encode(
        b'<svg xmlns="http://www.w3.org/2000/svg" width="24" height="24">'
        b'<rect width="24" height="24" fill="#c2185b"/></svg>'
    ).decode()
)
TENANT = "acme"
DISPLAY = "Acme Corp"
WIDER_THAN_390 = """[...document.querySelectorAll("body *")]
  .filter((e) => e.getBoundingClientRect().right > 390)
  .map((e) => `${e.tagName}.${e.className} ${Math.round(e.getBoundingClientRect().right)}`)
  .slice(0, 12)"""
"""What overflows, for the failure message."""


@pytest.fixture(scope="module")
def herald(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Herald]:
    yield from console_daemon(
        tmp_path_factory,
        "brand",
        {
            "delivery": {"max_retries": 1},
            "console": {
                "portal_name": NAME,
                "portal_logo_url": LOGO,
                "portal_accent_color": ACCENT,
                "tenant_names": {TENANT: DISPLAY},
            },
        },
    )


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with Receiver() as r:
        yield r


@pytest.fixture(scope="module")
def dest(herald: Herald, receiver: Receiver) -> dict[str, Any]:
    """Tenant acme's webhook with one delivered event."""
    acme = herald.create_webhook(receiver.url, name="Acme orders", tenant=TENANT)
    wait_for(
        lambda: (
            herald.query("SELECT status FROM herald_destinations WHERE id = ?", (acme["id"],))
            == [("active",)]
        ),
        what="the destination's verification",
    )
    event_id = f"evt_brand_{time.monotonic_ns()}"
    herald.insert_events([(event_id, TENANT, "order.created", '{"n": 1}')])
    wait_for(
        lambda: (
            herald.query("SELECT status FROM herald_deliveries WHERE event_id = ?", (event_id,))
            == [("success",)]
        ),
        what="the delivery",
    )
    return acme


def open_portal(page: Page, herald: Herald, path: str = "/portal/") -> None:
    page.goto(f"{path}?token={herald.portal_token(TENANT)}")
    expect(page).to_have_url(re.compile(re.escape(path) + "$"))


def test_the_portal_shows_the_configured_brand_and_the_tenants_name(
    herald: Herald, context: BrowserContext, dest: dict[str, Any]
) -> None:
    page = context.new_page()
    refused: list[str] = []
    page.on(
        "console",
        lambda m: refused.append(m.text) if "Content Security Policy" in m.text else None,
    )
    open_portal(page, herald)
    header = page.locator("header.top")
    expect(header.locator(".brand")).to_have_text(NAME)
    expect(page).to_have_title(re.compile(rf"· {re.escape(NAME)}$"))
    logo = header.locator("img.logo")
    expect(logo).to_have_attribute("src", LOGO)
    wait_for(
        lambda: bool(logo.evaluate("img => img.complete && img.naturalWidth > 0")), what="logo"
    )
    current = page.locator("header nav a[aria-current=page]")
    assert current.evaluate("a => getComputedStyle(a).color") == ACCENT_RGB
    # The tenant's display name, never its raw id, names who is signed in.
    expect(header.locator(".who")).to_have_text(DISPLAY)
    expect(header).not_to_contain_text(f"tenant {TENANT}")
    assert refused == []
    # The console stays Herald's.
    console = context.new_page()
    console.goto("/console/login")
    expect(console.locator("header .brand")).to_have_text("Herald")
    expect(console.locator("img.logo")).to_have_count(0)


def test_a_logo_from_another_site_is_refused_at_config_load(tmp_path: Path) -> None:
    h = Herald(tmp_path, {"console": {"portal_logo_url": "https://cdn.example.com/logo.png"}})
    checked = h.cli("check-config", check=False)
    assert checked.returncode == 2
    assert "console.portal_logo_url" in checked.stderr
    assert "own origin" in checked.stderr


def test_a_tenant_never_sees_an_operator_identity(
    herald: Herald, context: BrowserContext, dest: dict[str, Any]
) -> None:
    # A replay made by the CLI (cli:<user>) and one made in the console (console:<key id>).
    herald.cli("replay", "--tenant", TENANT, "--destination", dest["id"])
    operator = context.new_page()
    sign_in(operator, herald.cli("keys", "create", "--operator").stdout.strip())
    operator.goto(f"/console/replays/new?tenant={TENANT}&destination={dest['id']}")
    operator.get_by_role("button", name="Replay").click()
    expect(operator).to_have_url(re.compile(r"/console/replays/rpl_"))
    by = herald.query("SELECT requested_by FROM herald_replays WHERE tenant_id = ?", (TENANT,))
    assert {row[0].split(":")[0] for row in by} >= {"cli", "console"}

    page = context.new_page()
    open_portal(page, herald, "/portal/replays")
    rows = page.locator("table tbody tr")
    expect(rows).to_have_count(len(by))
    for i in range(len(by)):
        expect(rows.nth(i).locator("td").nth(-2)).to_have_text("the operator")
    text = page.content()
    for (actor,) in by:
        assert actor not in text
    rows.first.locator("a.id").click()
    expect(page.locator("dl.facts", has_text="Filter")).to_contain_text("the operator")
    for (actor,) in by:
        assert actor not in page.content()


def test_every_portal_page_fits_a_390_px_frame(
    herald: Herald, context: BrowserContext, dest: dict[str, Any]
) -> None:
    page = context.new_page()
    page.set_viewport_size({"width": 390, "height": 844})
    open_portal(page, herald)
    [(delivery_id, event_id)] = herald.query(
        "SELECT id, event_id FROM herald_deliveries WHERE destination_id = ? AND kind = 'event'"
        " ORDER BY id LIMIT 1",
        (dest["id"],),
    )
    herald.cli("replay", "--tenant", TENANT, "--delivery", delivery_id)
    [(replay_id,)] = herald.query(
        "SELECT id FROM herald_replays WHERE tenant_id = ? ORDER BY id DESC LIMIT 1", (TENANT,)
    )
    pages = [
        "/portal/",
        "/portal/deliveries",
        f"/portal/deliveries/{delivery_id}",
        "/portal/replays",
        f"/portal/replays/{replay_id}",
        f"/portal/replays/new?destination={dest['id']}",
        "/portal/destinations",
        f"/portal/destinations/{dest['id']}",
        "/portal/destinations/new",
        "/portal/events",
        f"/portal/events/{event_id}",
    ]
    for path in pages:
        response = page.goto(path)
        assert response is not None
        assert response.status == 200, path
        width = page.evaluate("document.documentElement.scrollWidth")
        wide = page.evaluate(WIDER_THAN_390)
        assert width <= 390, f"{path} is {width} px wide: {wide}"
    # The navigation wraps rather than leaving tabs out of reach.
    for tab in ("Overview", "Deliveries", "Replays", "Destinations", "Events"):
        assert page.get_by_role("link", name=tab, exact=True).first.is_visible()
    # And the page a user without a session lands on.
    page.request.post("/portal/logout", form={"csrf_token": csrf(page)})
    landing = page.goto("/portal/login?refused=token_expired")
    assert landing is not None
    assert landing.status == 401
    expect(page.locator("header .brand")).to_have_text(NAME)
    assert page.evaluate("document.documentElement.scrollWidth") <= 390


def csrf(page: Page) -> str:
    return str(page.locator("input[name=csrf_token]").first.get_attribute("value"))
