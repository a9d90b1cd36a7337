"""The console's browser tests' shared parts: Debian's Chromium under Playwright, a
receiver that can be switched off, and the steps every test takes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from tests.support.daemon import Herald, free_port

CHROMIUM = Path("/usr/bin/chromium")


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


class Receiver:
    """A plain HTTP receiver (204 to everything) on a fixed port; ``stop`` leaves the
    port dead (connection refused) until ``start`` again."""

    def __init__(self) -> None:
        self.port = free_port()
        self.hits: list[str] = []
        self._server: Switchable | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def start(self) -> None:
        server = Switchable(("127.0.0.1", self.port), _Answer)
        server.hits = self.hits
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


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


def sign_in(page: Page, key: str) -> None:
    page.goto("/console/login")
    page.get_by_label("Operator key").fill(key)
    page.get_by_role("button", name="Sign in").click()


def active_webhook(herald: Herald, receiver: Receiver, *, name: str) -> dict[str, Any]:
    """A webhook destination of tenant ``default``, verified (active)."""
    dest = herald.create_webhook(receiver.url, name=name)

    def active() -> bool:
        rows = herald.query("SELECT status FROM herald_destinations WHERE id = ?", (dest["id"],))
        return bool(rows[0][0] == "active")

    wait_for(active, what="the destination's verification")
    return dest
