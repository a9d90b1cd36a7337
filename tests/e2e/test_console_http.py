"""The console over plain HTTP (no browser): the API's rate limits, and a console
that is switched off. (Sessions' expiry: tests/integration/test_console_store.py.)"""

from __future__ import annotations

import http.cookiejar
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.daemon import Herald


class Client:
    """A cookie-keeping HTTP client that does not follow redirects."""

    def __init__(self, herald: Herald) -> None:
        self.base = f"http://127.0.0.1:{herald.port}"
        self.jar = http.cookiejar.CookieJar()

        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *args: object, **kwargs: object) -> None:
                return None

        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(self.jar), NoRedirect()
        )

    def request(self, path: str, form: dict[str, str] | None = None) -> tuple[int, str]:
        data = None if form is None else urllib.parse.urlencode(form).encode()
        try:
            with self.opener.open(self.base + path, data=data, timeout=10) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            with exc:
                return exc.code, exc.read().decode()

    def sign_in(self, key: str) -> int:
        _, page = self.request("/console/login")
        match = re.search(r'name="csrf_token" value="([^"]+)"', page)
        assert match is not None
        status, _ = self.request("/console/login", {"csrf_token": match.group(1), "key": key})
        return status


@pytest.fixture(scope="module")
def herald(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Herald]:
    h = Herald(
        tmp_path_factory.mktemp("console-http"),
        {
            # A window long enough that a slow machine stays inside it.
            "api": {
                "rate_limit_requests": 5,
                "unauthenticated_rate_limit_requests": 3,
                "rate_limit_window_seconds": 60,
            },
        },
    )
    h.start()
    yield h
    h.stop()


def test_the_console_has_the_apis_rate_limits(herald: Herald) -> None:
    key = herald.cli("keys", "create", "--operator").stdout.strip()
    guesser = Client(herald)
    assert [guesser.sign_in("sk_op_wrong") for _ in range(3)] == [401, 401, 401]
    assert guesser.sign_in("sk_op_wrong") == 429  # this address's failed sign-ins

    operator = Client(herald)
    assert operator.sign_in(key) == 303  # a good key still signs in from anywhere
    statuses = [operator.request("/console/deliveries")[0] for _ in range(6)]
    assert statuses[:4] == [200, 200, 200, 200]
    assert statuses[-1] == 429  # 5 requests per window per operator key, as per tenant


def test_the_console_can_be_switched_off(tmp_path: Path) -> None:
    h = Herald(tmp_path, {"console": {"enabled": False}})
    h.start()
    try:
        status, _ = Client(h).request("/console/login")
        assert status == 404
    finally:
        h.stop()
