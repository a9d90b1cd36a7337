"""The console over plain HTTP (no browser): the API's rate limits, and a console
that is switched off. (Sessions' expiry: tests/integration/test_console_store.py.)"""

from __future__ import annotations

import asyncio
import http.client
import http.cookiejar
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest

from herald.access.keys import KEY_CACHE_SECONDS
from tests.support.daemon import Herald
from tests.support.databases import BACKENDS, create_postgres_database, drop_postgres_database

# One worker runs a module's tests, so its daemon (a module fixture) starts once.
pytestmark = [pytest.mark.xdist_group("console"), pytest.mark.backend_neutral]


T = TypeVar("T")


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


def _cookie(name: str, value: str) -> http.cookiejar.Cookie:
    return http.cookiejar.Cookie(
        0,
        name,
        value,
        None,
        False,
        "127.0.0.1",
        False,
        False,
        "/console",
        True,
        False,
        None,
        False,
        None,
        None,
        {},
    )


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

    # Guessed session ids count against the address too: it is past its limit already.
    forger = Client(herald)
    forger.jar.set_cookie(_cookie("herald_console", "guessed-session-id"))
    assert forger.request("/console/")[0] == 429
    # So do guessed portal tokens (each refused one counts; this address is past it).
    assert Client(herald).request("/portal/?token=tk_guessed")[0] == 429


def test_the_portal_counts_against_the_tenants_api_limit_and_its_cookie_is_strict(
    herald: Herald,
) -> None:
    """One budget per tenant, whichever face spends it: here 5 requests a window."""
    token = herald.portal_token("limited")  # the API's first request of the window
    tenant = Client(herald)
    assert tenant.request(f"/portal/?token={token}")[0] == 303  # not counted: no session yet
    [cookie] = [c for c in tenant.jar if c.name == "herald_portal"]
    assert cookie.path == "/portal"
    assert cookie.has_nonstandard_attr("HttpOnly")
    assert cookie.get_nonstandard_attr("SameSite") == "Strict"  # no framing configured
    statuses = [tenant.request("/portal/deliveries")[0] for _ in range(5)]
    assert statuses == [200, 200, 200, 200, 429]
    # The API's budget for the tenant is spent too.
    assert herald.get("/v2/event-destinations", key=herald.api_key("limited"))[0] == 429


def _get(herald: Herald, target: str) -> tuple[int, str | None]:
    """GET ``target`` sent as it is (no client quoting) on a connection of its own: the
    status and the Location."""
    conn = http.client.HTTPConnection("127.0.0.1", herald.port, timeout=10)
    try:
        conn.request("GET", target)
        response = conn.getresponse()
        response.read()
        return response.status, response.getheader("Location")
    finally:
        conn.close()


def test_a_control_character_in_the_portals_path_is_refused_before_the_token_is_spent(
    herald: Herald,
) -> None:
    """A CR/LF in the path once spent the token and dropped the connection (the
    redirect's Location could not hold it)."""
    token = herald.portal_token("crlf")
    for path in (
        "/portal/%0d%0aSet-Cookie:%20x=1",
        "/portal/a%09b",
        "/portal/%7f",
        "/portal/%c2%85",
    ):
        assert _get(herald, f"{path}?token={token}") == (400, None), path
    # Unspent; and the way back names the path as it was sent: a %3F stays in the path.
    # (No refused token here: this module's address has three refusals a window.)
    status, location = _get(herald, f"/portal/deliveries%3Fx=1?token={token}&status=failure")
    assert (status, location) == (303, "/portal/deliveries%3Fx=1?status=failure")


def refused_within_the_bound(since: float, refused: Callable[[], bool]) -> None:
    """Ask until ``refused()``; every ask begun ``KEY_CACHE_SECONDS`` or more after
    ``since`` (the revocation's commit, or later) must be refused."""
    while True:
        began = time.monotonic()
        if refused():
            return
        assert began - since < KEY_CACHE_SECONDS, "a revoked key let in past the bound"


def test_a_revoked_key_is_refused_by_the_api_and_the_console_within_a_second(
    tmp_path: Path,
) -> None:
    """One key lookup (``herald.access.keys.KeyCache``) for both faces: a key revoked by
    another process (the CLI) opens nothing once its bound has passed; a console
    session ends with its operator key at once."""
    h = Herald(tmp_path, {"api": {"rate_limit_requests": 100_000}})
    h.start()
    try:
        tenant_key = h.api_key("acme")
        operator_key = h.cli("keys", "create", "--operator").stdout.strip()
        session = Client(h)
        assert session.sign_in(operator_key) == 303
        assert session.request("/console/")[0] == 200
        # Both keys looked up (and remembered) just before they are revoked.
        assert h.get("/v2/event-destinations", key=tenant_key)[0] == 200
        assert Client(h).sign_in(operator_key) == 303

        h.cli("keys", "revoke", "--tenant", "acme", tenant_key)
        refused_within_the_bound(
            time.monotonic(), lambda: h.get("/v2/event-destinations", key=tenant_key)[0] == 401
        )
        h.cli("keys", "revoke", "--operator", operator_key)
        revoked = time.monotonic()
        assert session.request("/console/")[0] == 303  # its session: over, to the sign-in
        refused_within_the_bound(revoked, lambda: Client(h).sign_in(operator_key) == 401)
    finally:
        h.stop()


def test_the_console_can_be_switched_off(tmp_path: Path) -> None:
    h = Herald(tmp_path, {"console": {"enabled": False}})
    h.start()
    try:
        status, _ = Client(h).request("/console/login")
        assert status == 404
        assert Client(h).request("/portal/login")[0] == 404
    finally:
        h.stop()


@pytest.mark.database_specific
@pytest.mark.parametrize("backend", BACKENDS)
def test_every_page_answers_on_both_databases(backend: str, tmp_path: Path) -> None:
    """Each page's queries, on the database the daemon runs on: sign in, create a
    destination through the form, publish an event, and open every page."""
    url = _in_thread(create_postgres_database()) if backend == "postgres" else None
    h = Herald(tmp_path, database_url=url)
    h.start()
    try:
        client = Client(h)
        assert client.sign_in(h.cli("keys", "create", "--operator").stdout.strip()) == 303
        _, page = client.request("/console/destinations/new")
        token = re.search(r'name="csrf_token" value="([^"]+)"', page)
        assert token is not None
        form = {
            "csrf_token": token.group(1),
            "type": "webhook",
            "tenant": "acme",
            "name": "hook",
            "events": "*",
            "config.url": "http://127.0.0.1:9/hook",
            "ordering": "key",
        }
        assert client.request("/console/destinations", form)[0] == 303
        [(dest_id,)] = h.query("SELECT id FROM herald_destinations")
        h.insert_events([("evt_page", "acme", "order.created", '{"n": 1}')])
        [(delivery_id,)] = _eventually_one(
            h, "SELECT id FROM herald_deliveries WHERE kind = 'event'"
        )
        h.insert_events([("evt_bad", "acme", "order.created", "[]")])
        # Two events of one key: the second waits behind the first (docs/ordering.md).
        db = h.connect()
        try:
            db.execute("BEGIN")
            db.executemany(
                "INSERT INTO herald_outbox (id, tenant_id, type, data, ordering_key)"
                " VALUES (?, 'acme', 'order.created', '{}', 'cart-7')",
                [("evt_k1",), ("evt_k2",)],
            )
            db.execute("COMMIT")
        finally:
            db.close()
        [(head_id,)] = _eventually_one(
            h, "SELECT id FROM herald_deliveries WHERE event_id = 'evt_k1'"
        )
        _eventually_one(h, "SELECT id FROM herald_deliveries WHERE event_id = 'evt_k2'")
        pages = [
            "/console/",
            "/console/deliveries",
            "/console/deliveries?status=pending&tenant=acme&event_type=order.created&range=1h",
            f"/console/deliveries?destination={dest_id}&since=2020-01-01T00:00:00Z",
            f"/console/deliveries/{delivery_id}",
            "/console/destinations",
            "/console/destinations?tenant=acme&status=pending_verification&type=webhook",
            f"/console/destinations/{dest_id}",
            f"/console/destinations/{dest_id}/delete",
            "/console/destinations/new?type=aws_sqs",
            "/console/events",
            "/console/events/evt_page",
            "/console/events/evt_page?tenant=acme",
            "/console/replays",
            "/console/replays?tenant=acme",
            f"/console/replays/new?tenant=acme&destination={dest_id}&range=24h",
            "/console/outbox/rejected",
        ]
        assert {p: client.request(p)[0] for p in pages} == dict.fromkeys(pages, 200)
        # The ordered destination's page names the blocked key, its head and what waits.
        _, page = client.request(f"/console/destinations/{dest_id}")
        assert blocked_keys(page) == [("cart-7", head_id, "1")]
        # A replay started from the form runs in the daemon and gets its page.
        replay = {"tenant": "acme", "destination": dest_id}
        assert client.request("/console/replays", replay)[0] == 403  # no CSRF token
        status, _ = client.request("/console/replays", {**replay, "csrf_token": token.group(1)})
        assert status == 303
        [(replay_id,)] = _eventually_one(
            h, "SELECT id FROM herald_replays WHERE finished_at IS NOT NULL"
        )
        status, page = client.request(f"/console/replays/{replay_id}")
        # evt_page's delivery and the two of key cart-7: all three re-queued.
        progress = re.search(r"<strong>(\d+)</strong> of (\d+) matched", page)
        assert (status, progress and progress.groups()) == (200, ("3", "3"))
        assert client.request("/console/replays/rpl_nope")[0] == 404
        assert client.request("/console/events/evt_page?tenant=other")[0] == 404
        # An event id with characters that mean something in a URL still finds its page.
        odd = "evt_a/b?c#d e&f"
        h.insert_events([(odd, "acme", "order.created", '{"n": 2}')])
        _eventually_one(h, "SELECT 1 FROM herald_events WHERE id = ?", (odd,))
        status, _ = client.request("/console/events?" + urllib.parse.urlencode({"id": odd}))
        assert status == 303
        location = "/console/events/" + urllib.parse.quote(odd, safe="")
        status, page = client.request(location)
        assert status == 200
        assert "evt_a/b?c#d e&amp;f" in page
        assert client.request("/console/deliveries?status=nope")[0] == 400

        # The portal's pages, tenant acme's (the overview counts its destinations only).
        tenant = Client(h)
        assert tenant.request(f"/portal/?token={h.portal_token('acme')}")[0] == 303
        portal = [p.replace("/console/", "/portal/") for p in pages[:-1]]
        assert {p: tenant.request(p)[0] for p in portal} == dict.fromkeys(portal, 200)
        _, page = tenant.request(f"/portal/destinations/{dest_id}")
        assert blocked_keys(page) == [("cart-7", head_id, "1")]
        assert tenant.request("/portal/outbox/rejected")[0] == 404
        # ?tenant= is no filter in the portal: acme's event, whatever it says.
        assert tenant.request("/portal/events/evt_page?tenant=other")[0] == 200
    finally:
        h.stop()
        if url is not None:
            _in_thread(drop_postgres_database(url))


def blocked_keys(page: str) -> list[tuple[str, str, str]]:
    """The rows of a destination page's Blocked keys table: key, head delivery, waiting."""
    table = re.search(r'<table id="blocked-keys">(.*?)</table>', page, re.S)
    assert table is not None, "no Blocked keys table"
    return re.findall(
        r"<tr><td><code><bdi>([^<]*)</bdi></code></td><td><a [^>]*>([^<]*)</a></td>"
        r"<td>[^<]*</td><td>.*?</td><td>([^<]*)</td></tr>",
        table.group(1),
    )


def _in_thread(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to its end on a thread of its own (this test is synchronous)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def _eventually_one(h: Herald, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        rows = h.query(sql, params)
        if rows:
            return rows
        time.sleep(0.05)
    raise AssertionError(f"no row for {sql}")
