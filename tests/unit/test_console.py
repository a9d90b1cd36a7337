"""The console's pure parts: charts, forms, CSRF tokens."""

from __future__ import annotations

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from herald.adapters.base import AdapterContext
from herald.adapters.registry import Registry
from herald.config import ConsoleSettings, Settings
from herald.console import charts, forms
from herald.console.scope import Face, Scope
from herald.console.session import clear_cookie, csrf_for, csrf_matches, set_cookie
from herald.egress import EgressPolicy


@pytest.fixture(scope="module")
def registry() -> Registry:
    return Registry(AdapterContext(settings=Settings(), egress=EgressPolicy()))


def test_a_chart_stacks_outcomes_per_bucket_newest_at_the_right() -> None:
    now = 600 * 60 + 30  # half a minute into minute 600
    counts = [
        ("success", 600, 3),
        ("failure", 600, 1),
        ("success", 599, 2),
        ("success", 540, 9),  # 60 minutes ago: outside a 60-bucket chart
        ("pending", 600, 5),  # not an outcome
    ]
    chart = charts.bar_chart(counts, now=now, bucket_seconds=60, buckets=60, label="x")
    assert chart.totals == {"success": 5, "failure": 1}
    assert chart.peak == 4
    by_outcome = {(b.outcome, b.title) for b in chart.bars}
    assert by_outcome == {
        ("success", "3 success, this bucket"),
        ("failure", "1 failure, this bucket"),
        ("success", "2 success, 1 min ago"),
    }
    newest = [b for b in chart.bars if b.title.endswith("this bucket")]
    # The tallest stack fills the height; failure sits on top of success.
    success, failure = sorted(newest, key=lambda b: -b.y)
    assert success.outcome == "success"
    assert success.height + failure.height == pytest.approx(charts.HEIGHT)
    assert failure.y == pytest.approx(0)
    assert newest[0].x > next(b for b in chart.bars if "1 min ago" in b.title).x


def test_an_empty_chart_has_no_bars() -> None:
    chart = charts.bar_chart([], now=1000.0, bucket_seconds=60, buckets=60, label="x")
    assert chart.bars == []
    assert chart.peak == 0


def test_the_create_form_becomes_the_apis_body(registry: Registry) -> None:
    body = forms.create_body(
        {
            "csrf_token": "t",
            "type": "webhook",
            "name": "Orders",
            "events": "order.*, invoice.paid\nrefund.*",
            "config.url": "https://example.com/hook",
            "config.secret": "",
        }
    )
    assert body == {
        "name": "Orders",
        "type": "webhook",
        "events": ["order.*", "invoice.paid", "refund.*"],
        "webhook": {"url": "https://example.com/hook"},  # empty fields are not sent
        "rate_limit_per_second": None,
        "circuit_breaker": False,
    }
    assert forms.edit_body({"name": "n", "events": "a.b"}, "webhook") == {
        "name": "n",
        "events": ["a.b"],
        "rate_limit_per_second": None,
        "circuit_breaker": False,
    }
    # The config as edited: a masked credential goes back as shown (the service keeps
    # it), an emptied field is removed.
    edited = {"name": "n", "events": "a.b", "config.url": "https://x.test/", "config.secret": "*"}
    assert forms.edit_body({**edited, "config.custom_headers": ""}, "webhook")["webhook"] == {
        "url": "https://x.test/",
        "secret": "*",
        "custom_headers": None,
    }
    fields = {f.name: f for f in forms.config_fields(registry, "webhook")}
    assert fields["url"].required
    assert fields["secret"].sensitive
    assert fields["url"].input_name == "config.url"


def test_the_forms_flow_fields_are_a_number_and_a_checkbox() -> None:
    flow = forms.flow_body({"rate_limit_per_second": " 2.5 ", "circuit_breaker": "on"})
    assert flow == {"rate_limit_per_second": 2.5, "circuit_breaker": True}
    # Not a number: sent as typed, for the service's 422 beside the input.
    assert forms.flow_body({"rate_limit_per_second": "fast"})["rate_limit_per_second"] == "fast"


@pytest.mark.parametrize(
    ("error_field", "input_name"),
    [
        ("name", "name"),
        ("rate_limit_per_second", "rate_limit_per_second"),
        ("events", "events"),
        ("events[2]", "events"),
        ("type", "type"),
        ("webhook.url", "config.url"),
        ("webhook", "type"),
        ("aws_sqs.queue_url", None),  # another type's field: above the form
        (None, None),
    ],
)
def test_a_service_error_names_the_form_field_beside_which_it_shows(
    error_field: str | None, input_name: str | None
) -> None:
    assert forms.form_field_of(error_field, "webhook") == input_name


def test_csrf_tokens_belong_to_one_session() -> None:
    token = csrf_for("session-a")
    assert csrf_matches(token, csrf_for("session-a"))
    assert not csrf_matches(token, csrf_for("session-b"))
    assert not csrf_matches(token, None)
    assert not csrf_matches(token, "")
    assert "session-a" not in token


@pytest.mark.parametrize(
    ("secure_setting", "scheme", "secure"),
    [(False, "http", False), (False, "https", True), (True, "http", True)],
)
def test_the_session_cookie_is_httponly_strict_and_secure_over_https(
    secure_setting: bool, scheme: str, secure: bool
) -> None:
    request = make_mocked_request("GET", "/console/login", headers={"Host": "h"})
    request = request.clone(scheme=scheme)
    response = web.Response()
    settings = ConsoleSettings(secure_cookie=secure_setting)
    set_cookie(response, request, settings, "herald_console", "v")
    cookie = response.cookies["herald_console"]
    assert cookie["httponly"] is True
    assert cookie["samesite"] == "Strict"
    assert cookie["path"] == "/console"
    assert bool(cookie["secure"]) is secure


def test_a_framed_portals_cookie_is_cross_site_secure_and_partitioned() -> None:
    request = make_mocked_request("GET", "/portal/", headers={"Host": "h"})
    response = web.Response()
    settings = ConsoleSettings(portal_frame_ancestors=("https://app.example.com",))
    set_cookie(
        response, request, settings, "herald_portal", "tks_v", path="/portal", cross_site=True
    )
    clear_cookie(response, "herald_portal", path="/portal", cross_site=True)
    made, cleared = response.headers.getall("Set-Cookie")
    attributes = "Path=/portal; HttpOnly; SameSite=None; Secure; Partitioned"
    assert made == f"herald_portal=tks_v; {attributes}"
    assert cleared.startswith(f"herald_portal=; {attributes}; Max-Age=0")


def test_only_the_listed_origins_may_frame_a_face() -> None:
    closed = Face(name="console", prefix="/console", every_tenant=True, cookie="c")
    assert "frame-ancestors 'none'" in closed.csp("n0nce")
    assert "script-src 'self' 'nonce-n0nce'" in closed.csp("n0nce")
    assert not closed.framable
    origins = ("https://a.example.com", "http://127.0.0.1:8000")
    framed = Face(
        name="portal", prefix="/portal", every_tenant=False, cookie="p", frame_ancestors=origins
    )
    assert framed.csp("x").endswith("frame-ancestors https://a.example.com http://127.0.0.1:8000")
    assert framed.framable


def test_a_portal_scope_keeps_its_tenant_whatever_a_filter_asks() -> None:
    portal = Scope(tenant_id="acme", by="portal:acme", who="tenant acme", csrf="c", session="s")
    operator = Scope(tenant_id=None, by="console:k", who="key k", csrf="c", session="s")
    assert portal.tenant("other") == portal.tenant(None) == "acme"
    assert operator.tenant("other") == "other"
    assert operator.tenant(" ") is None
    assert operator.tenant(None) is None
