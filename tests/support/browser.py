"""The console's browser tests' shared parts: Debian's Chromium under Playwright, a
receiver that can be switched off, and the steps every test takes."""

from __future__ import annotations

import html
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self

import pytest
from playwright.sync_api import Browser, BrowserContext, Dialog, Page, expect, sync_playwright

from tests.support.daemon import Herald, free_port

CHROMIUM = Path("/usr/bin/chromium")
XSS_NAME = "<img src=x onerror=alert(1)>"
"""The name every page must show as text."""


# --- a receiver that can be switched on and off on one port -----------------------------
class _Answer(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        self.rfile.read(length)
        server: Switchable = self.server  # type: ignore[assignment]
        server.hits.append(self.path)
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


class Switchable(ThreadingHTTPServer):
    hits: list[str]


class _Served:
    """An HTTP server on 127.0.0.1 on a fixed port, started and stopped at will (and by
    a ``with`` block): stopped, the port is dead (connection refused)."""

    handler: type[BaseHTTPRequestHandler]

    def __init__(self) -> None:
        self.port = free_port()
        self._server: ThreadingHTTPServer | None = None

    def _make(self) -> ThreadingHTTPServer:
        return ThreadingHTTPServer(("127.0.0.1", self.port), self.handler)

    def start(self) -> None:
        self._server = self._make()
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Receiver(_Served):
    """A plain HTTP receiver (204 to everything) on a fixed port; ``stop`` leaves the
    port dead (connection refused) until ``start`` again."""

    handler = _Answer

    def __init__(self) -> None:
        super().__init__()
        self.hits: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def _make(self) -> ThreadingHTTPServer:
        server = Switchable(("127.0.0.1", self.port), _Answer)
        server.hits = self.hits
        return server


# --- a tenant's product page that frames the portal ----------------------------------------
class _Framing(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        query = urllib.parse.urlsplit(self.path).query
        src = urllib.parse.parse_qs(query).get("src", [""])[0]
        body = (
            "<!doctype html><title>Tenant product</title>"
            '<h1 style="font: 600 20px sans-serif">Tenant product</h1>'
            f'<iframe id="portal" title="Portal" src="{html.escape(src)}"'
            ' width="1240" height="700" style="border: 1px solid #999"></iframe>'
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


class FramingPage(_Served):
    """A page on 127.0.0.1 that frames ``?src=<portal URL>``: opened as
    ``http://localhost:PORT`` (``origin``, another site than 127.0.0.1) or as
    ``http://127.0.0.1:PORT`` (another origin)."""

    handler = _Framing

    def __init__(self) -> None:
        super().__init__()
        self.origin = f"http://localhost:{self.port}"

    def url(self, src: str, *, host: str = "localhost") -> str:
        return f"http://{host}:{self.port}/?{urllib.parse.urlencode({'src': src})}"


def collect_dialogs(page: Page) -> list[str]:
    """The messages of every dialog (alert, confirm) the page opens, each dismissed: an
    escaped page opens none."""
    dialogs: list[str] = []

    def on_dialog(dialog: Dialog) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", on_dialog)
    return dialogs


def refuses_without_csrf(page: Page, url: str) -> None:
    """A POST to ``url`` with the session's cookie (same context) but without the form's
    CSRF token, or with a wrong one, is refused with a 403 page naming CSRF."""
    refused = page.request.post(url, form={"name": "x"}, max_redirects=0)
    assert refused.status == 403
    assert "CSRF" in refused.text()
    wrong = page.request.post(url, form={"csrf_token": "0" * 64}, max_redirects=0)
    assert wrong.status == 403


def wait_for(check: Callable[[], bool], *, timeout: float = 15.0, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """One browser per module: Playwright's sync API keeps an event loop running in
    this thread while it is open, which the asyncio tests of a later module cannot
    share, so it closes with the module that used it."""
    assert CHROMIUM.exists(), "no /usr/bin/chromium: run scripts/test-services.sh (make services)"
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        yield launched
        launched.close()


@pytest.fixture
def context(browser: Browser, herald: Herald) -> Iterator[BrowserContext]:
    """A fresh browser context (its own cookies) on the module's daemon."""
    ctx = browser.new_context(base_url=f"http://127.0.0.1:{herald.port}")
    ctx.set_default_timeout(10_000)
    yield ctx
    ctx.close()


def console_daemon(
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
) -> Iterator[Herald]:
    """A module's daemon for the browser tests (``yield from`` it in a module fixture
    named ``herald``). Pages reload themselves while they wait, so the API's rate limit
    is lifted unless ``overrides`` sets it (the limit itself is the API's, tested there)."""
    sections = {section: dict(values) for section, values in (overrides or {}).items()}
    sections.setdefault("api", {}).setdefault("rate_limit_requests", 100_000)
    h = Herald(tmp_path_factory.mktemp(name), sections)
    h.start()
    yield h
    h.stop()


@pytest.fixture(scope="module")
def operator_key(herald: Herald) -> str:
    """An operator key of the module's daemon."""
    return herald.cli("keys", "create", "--operator").stdout.strip()


def sign_in(page: Page, key: str) -> None:
    page.goto("/console/login")
    page.get_by_label("Operator key").fill(key)
    page.get_by_role("button", name="Sign in").click()


def signed_in(context: BrowserContext, key: str) -> Page:
    """A new page of ``context``, signed in with ``key`` and showing the overview."""
    p = context.new_page()
    sign_in(p, key)
    expect(p.get_by_role("heading", name="Overview")).to_be_visible()
    return p


@pytest.fixture
def page(context: BrowserContext, operator_key: str) -> Page:
    """A signed-in page of a fresh context."""
    return signed_in(context, operator_key)


def wait_active(herald: Herald, dest: dict[str, Any]) -> dict[str, Any]:
    """``dest`` once its verification has made it active."""

    def active() -> bool:
        rows = herald.query("SELECT status FROM herald_destinations WHERE id = ?", (dest["id"],))
        return bool(rows[0][0] == "active")

    wait_for(active, what="the destination's verification")
    return dest


def active_webhook(
    herald: Herald,
    receiver: Receiver | str,
    *,
    name: str = "hook",
    tenant: str = "default",
    events: list[str] | None = None,
) -> dict[str, Any]:
    """A webhook destination (tenant ``default`` unless named), verified (active)."""
    url = receiver if isinstance(receiver, str) else receiver.url
    return wait_active(herald, herald.create_webhook(url, name=name, tenant=tenant, events=events))
