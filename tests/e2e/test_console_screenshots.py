"""Screenshots of every console and portal page, from a seeded database.

Run in the suite, they check that every page renders with data in it (light and
dark); ``make screenshots`` runs them with ``HERALD_SCREENSHOTS=docs/console`` to
regenerate the images the README and docs/console.md show.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.support.browser import (
    FramingPage,
    Receiver,
    active_webhook,
    sign_in,
    wait_for,
)
from tests.support.daemon import Herald

# One worker runs a module's tests, so its daemon (a module fixture) starts once.
pytestmark = pytest.mark.xdist_group("console")


VIEWPORT = {"width": 1280, "height": 800}


@pytest.fixture(scope="module")
def framing() -> Iterator[FramingPage]:
    with FramingPage() as page:
        yield page


@pytest.fixture(scope="module")
def seeded(
    tmp_path_factory: pytest.TempPathFactory, framing: FramingPage
) -> Iterator[tuple[Herald, dict[str, str]]]:
    """A daemon with two tenants' destinations, succeeded and failed deliveries and a
    rejected outbox row; its portal may be framed by ``framing``."""
    h = Herald(
        tmp_path_factory.mktemp("screens"),
        {
            "delivery": {"max_retries": 1},
            "console": {"portal_frame_ancestors": [framing.origin]},
        },
    )
    h.start()
    live, flaky = Receiver(), Receiver()
    live.start()
    flaky.start()
    try:
        orders = active_webhook(h, live, name="Order service")
        billing = active_webhook(h, flaky, name="Billing (flaky)")
        h.create_webhook(live.url, name="Acme CRM", tenant="acme", events=["customer.*"])
        flaky.stop()
        rows = [
            (f"evt_seed_{i}", "default", kind, f'{{"order_id": "ord_{i}", "total": {i * 7}}}')
            for i, kind in enumerate(["order.created", "order.paid", "order.shipped"] * 4)
        ]
        h.insert_events(rows)
        h.insert_events([("evt_seed_bad", "default", "order.created", '"not an object"')])

        def settled() -> bool:
            [(total, pending)] = h.query(
                "SELECT COUNT(*), SUM(CASE WHEN status = 'pending' THEN 1 ELSE 0 END)"
                " FROM herald_deliveries WHERE kind = 'event'"
            )
            return bool(total == 2 * len(rows) and pending == 0)

        wait_for(settled, timeout=30, what="the seeded deliveries to finish")
        failed = h.query(
            "SELECT id FROM herald_deliveries WHERE status = 'failure' AND destination_id = ?",
            (billing["id"],),
        )
        yield (
            h,
            {
                "orders": orders["id"],
                "billing": billing["id"],
                "failed_delivery": failed[0][0],
                "event": "evt_seed_1",
            },
        )
    finally:
        live.stop()
        h.stop()


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    wanted = os.environ.get("HERALD_SCREENSHOTS")
    path = Path(wanted) if wanted else tmp_path_factory.mktemp("shots")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_every_page_renders_with_data(
    browser: Browser,
    seeded: tuple[Herald, dict[str, str]],
    out_dir: Path,
    scheme: str,
) -> None:
    h, ids = seeded
    key = h.cli("keys", "create", "--operator").stdout.strip()
    ctx = browser.new_context(
        base_url=f"http://127.0.0.1:{h.port}",
        viewport=VIEWPORT,  # type: ignore[arg-type]
        color_scheme=scheme,  # type: ignore[arg-type]
    )
    try:
        page = ctx.new_page()
        shots: list[tuple[str, str, str]] = [
            ("login", "/console/login", "Sign in"),
            ("overview", "/console/", "Overview"),
            ("deliveries", "/console/deliveries?status=failure", "Deliveries"),
            ("delivery", f"/console/deliveries/{ids['failed_delivery']}", "Delivery"),
            ("destinations", "/console/destinations", "Destinations"),
            ("destination", f"/console/destinations/{ids['orders']}", "Order service"),
            ("destination-new", "/console/destinations/new?type=webhook", "New destination"),
            ("events", "/console/events", "Events"),
            ("event", f"/console/events/{ids['event']}", "Event"),
            ("rejected", "/console/outbox/rejected", "Rejected outbox rows"),
        ]
        if scheme == "dark":  # the light set shows every page; dark, two of them
            shots = [s for s in shots if s[0] in ("login", "overview", "delivery")]
        for name, path, heading in shots:
            if name == "overview":
                sign_in(page, key)
            page.goto(path)
            expect(page.get_by_role("heading", level=1)).to_contain_text(heading)
            suffix = "-dark" if scheme == "dark" else ""
            _shoot(page, out_dir / f"{name}{suffix}.png")
        if scheme == "light":
            _replay_shots(h, page, ids, out_dir)
    finally:
        ctx.close()


def _replay_shots(h: Herald, page: Page, ids: dict[str, str], out_dir: Path) -> None:
    """The replay pages: the dry run of the flaky destination's failures, then the
    replay page (its receiver still down, so it shows them pending again) and the list.
    Last, as the replay re-queues the failed deliveries the other pages show."""
    dry_run = f"/console/replays/new?status=failure&destination={ids['billing']}"
    page.goto(dry_run)
    expect(page.locator("#replay-matched")).to_contain_text("match")
    _shoot(page, out_dir / "replay-new.png")
    page.get_by_role("button", name="Replay").click()
    expect(page.locator("#replay-state")).to_be_visible()
    expect(page.locator("#replay-progress")).to_contain_text("(100 %)")
    _shoot(page, out_dir / "replay.png")
    page.goto("/console/replays")
    expect(page.get_by_role("heading", level=1)).to_contain_text("Replays")
    _shoot(page, out_dir / "replays.png")


def test_every_portal_page_renders_with_data(
    browser: Browser,
    seeded: tuple[Herald, dict[str, str]],
    framing: FramingPage,
    out_dir: Path,
) -> None:
    """The portal of tenant ``default`` (opened with a token, as its product would),
    and the same embedded in the product's page."""
    h, ids = seeded
    ctx = browser.new_context(
        base_url=f"http://127.0.0.1:{h.port}",
        viewport=VIEWPORT,  # type: ignore[arg-type]
    )
    try:
        page = ctx.new_page()
        page.goto(f"/portal/?token={h.portal_token('default')}")
        expect(page.get_by_role("heading", level=1)).to_have_text("Overview")
        shots = [
            ("portal-overview", "/portal/", "Overview"),
            ("portal-deliveries", "/portal/deliveries", "Deliveries"),
            ("portal-destinations", "/portal/destinations", "Destinations"),
            ("portal-destination", f"/portal/destinations/{ids['billing']}", "Billing"),
        ]
        for name, path, heading in shots:
            page.goto(path)
            expect(page.get_by_role("heading", level=1)).to_contain_text(heading)
            _shoot(page, out_dir / f"{name}.png")

        product = ctx.new_page()
        portal = f"http://127.0.0.1:{h.port}/portal/deliveries?token={h.portal_token('default')}"
        product.goto(framing.url(portal))
        framed = product.frame_locator("#portal")
        expect(framed.get_by_role("heading", level=1)).to_have_text("Deliveries")
        _shoot(product, out_dir / "portal-framed.png")
    finally:
        ctx.close()


def _shoot(page: Page, path: Path) -> None:
    page.screenshot(path=str(path), full_page=False)
    assert path.stat().st_size > 1000
