"""The delivery page shows what each attempt sent and got back, in a real browser
(Debian's Chromium under Playwright): the request line and headers as recorded (the
custom headers' values masked, the signature as the receiver got it), the response's
status and headers (``Set-Cookie`` masked) and a ``curl`` command that, run, sends a
request the receiver's Standard Webhooks check accepts.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect
from standardwebhooks.webhooks import Webhook

from tests.support.browser import console_daemon, sign_in, wait_for
from tests.support.daemon import Herald, free_port

pytestmark = pytest.mark.xdist_group("console")

SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
TOKEN = "Bearer very-secret-token-4711"
COOKIE = "sid=receiver-session-0815"


class _Recording(BaseHTTPRequestHandler):
    """Answers 200 with headers of its own (a session cookie among them) and keeps
    every request's headers and body."""

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        server: Any = self.server
        server.seen.append((dict(self.headers.items()), body))
        answer = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Receiver", "kept")
        self.send_header("Set-Cookie", COOKIE)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def receiver() -> Iterator[Any]:
    server: Any = ThreadingHTTPServer(("127.0.0.1", free_port()), _Recording)
    server.seen = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def herald(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Herald]:
    yield from console_daemon(
        tmp_path_factory,
        "sent",
        {
            "delivery": {"max_retries": 1},
        },
    )


def create(herald: Herald, url: str) -> dict[str, Any]:
    """A webhook with a secret and custom headers, one of them a credential."""
    body = {
        "name": "sent page",
        "type": "webhook",
        "events": ["*"],
        "webhook": {
            "url": url,
            "secret": SECRET,
            "custom_headers": json.dumps({"Authorization": TOKEN, "X-Team": "blue"}),
        },
    }
    request = urllib.request.Request(
        f"http://127.0.0.1:{herald.port}/v2/event-destinations",
        data=json.dumps(body).encode(),
        headers={
            "Authorization": f"Bearer {herald.api_key()}",
            "Content-Type": "application/json",
        },
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        made: dict[str, Any] = json.loads(resp.read())
    return made


def attempted(herald: Herald, dest: dict[str, Any], status: str) -> str:
    """Emit one event; its delivery's id once its status is ``status``."""
    event_id = f"evt_sent_{time.monotonic_ns()}"
    herald.insert_events([(event_id, "default", "order.created", '{"n": 1, "s": "it\'s"}')])

    def done() -> bool:
        rows = herald.query(
            "SELECT status FROM herald_deliveries WHERE event_id = ? AND destination_id = ?",
            (event_id, dest["id"]),
        )
        return rows == [(status,)]

    wait_for(done, what=f"a delivery in {status}")
    [(delivery_id,)] = herald.query(
        "SELECT id FROM herald_deliveries WHERE event_id = ? AND destination_id = ?",
        (event_id, dest["id"]),
    )
    return str(delivery_id)


def header_value(page: Page, table: str, name: str) -> str:
    row = page.locator(f"#attempt-1 table[aria-label^='{table}'] tr", has_text=name).first
    return row.locator("td").nth(1).inner_text()


def test_the_request_and_response_of_an_attempt_and_a_curl_that_verifies(
    herald: Herald, page: Page, receiver: Any
) -> None:
    url = f"http://127.0.0.1:{receiver.server_address[1]}/hook?team=blue"
    dest = create(herald, url)
    wait_for(
        lambda: (
            herald.query("SELECT status FROM herald_destinations WHERE id = ?", (dest["id"],))
            == [("active",)]
        ),
        what="the destination's verification",
    )
    delivery_id = attempted(herald, dest, "success")
    got_headers, got_body = receiver.seen[-1]
    got = {k.lower(): v for k, v in got_headers.items()}

    page.goto(f"/console/deliveries/{delivery_id}")
    sent = page.locator("#attempt-1")
    expect(sent.locator(".request-line")).to_have_text(f"POST {url}")
    # Herald's own headers as the receiver got them, the signature included.
    for name in ("webhook-id", "webhook-timestamp", "webhook-signature", "content-type"):
        assert header_value(page, "Request headers", name) == got[name]
    # A custom header is a credential field: its value is masked, its name shown.
    assert header_value(page, "Request headers", "Authorization") == "********"
    assert header_value(page, "Request headers", "X-Team") == "********"
    expect(sent.locator(".response-status")).to_have_text("200")
    assert header_value(page, "Response headers", "X-Receiver") == "kept"
    assert header_value(page, "Response headers", "Set-Cookie") == "********"
    expect(sent.locator("pre.excerpt")).to_contain_text('"ok": true')
    # Masked before it was stored: no attempt's record holds the credential.
    stored = herald.query("SELECT exchange FROM herald_attempts WHERE exchange IS NOT NULL")
    assert stored
    assert not [row for row in stored if "very-secret-token" in row[0]]
    content = page.content()
    assert "very-secret-token" not in content
    assert "receiver-session" not in content

    # The command, run, sends the same body and signature: the receiver's check passes.
    curl = sent.locator("pre.curl").inner_text()
    assert "Authorization: ********" in curl
    before = len(receiver.seen)
    subprocess.run(["sh", "-c", curl + " --silent --output /dev/null"], check=True, timeout=30)
    assert len(receiver.seen) == before + 1
    again_headers, again_body = receiver.seen[-1]
    assert again_body == got_body
    Webhook(SECRET).verify(again_body, {k.lower(): v for k, v in again_headers.items()})

    # With a clipboard, the button copies that very text.
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.reload()
    button = page.locator("#attempt-1 button.copy")
    expect(button).to_have_text("Copy as curl")
    button.click()
    expect(button).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == curl


def failed_verification(herald: Herald) -> str:
    """A webhook at a dead port: the id of its verification's delivery, once attempted."""
    dest = herald.create_webhook(f"http://127.0.0.1:{free_port()}/hook")
    [(delivery_id,)] = herald.query(
        "SELECT id FROM herald_deliveries WHERE destination_id = ?", (dest["id"],)
    )
    wait_for(
        lambda: (
            herald.query(
                "SELECT COUNT(*) FROM herald_attempts WHERE delivery_id = ?", (delivery_id,)
            )
            != [(0,)]
        ),
        what="a failed attempt",
    )
    return str(delivery_id)


def test_an_attempt_without_response_shows_its_request(herald: Herald, page: Page) -> None:
    page.goto(f"/console/deliveries/{failed_verification(herald)}")
    sent = page.locator("#attempt-1")
    expect(sent.locator(".request-line")).to_contain_text("POST http://127.0.0.1:")
    expect(sent).to_contain_text("No response: connection failed")
    expect(sent.locator("pre.curl")).to_contain_text("webhook-id")


def test_the_curl_text_is_there_without_javascript(
    browser: Browser, herald: Herald, operator_key: str
) -> None:
    delivery_id = failed_verification(herald)
    ctx = browser.new_context(base_url=f"http://127.0.0.1:{herald.port}", java_script_enabled=False)
    try:
        page = ctx.new_page()
        sign_in(page, operator_key)
        page.goto(f"/console/deliveries/{delivery_id}")
        expect(page.locator("#attempt-1 pre.curl")).to_contain_text("curl -X POST")
        expect(page.get_by_role("button", name="Copy as curl")).to_be_hidden()
    finally:
        ctx.close()
