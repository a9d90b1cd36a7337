"""The console's pure parts: charts, forms, CSRF tokens."""

from __future__ import annotations

from dataclasses import replace

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from herald.access.sessions import csrf_for
from herald.adapters.base import MASK, AdapterContext
from herald.adapters.registry import Registry
from herald.config import ConsoleSettings, Settings
from herald.console import charts, forms
from herald.console.deliveries import retry_state
from herald.console.scope import Face, Scope
from herald.console.session import clear_cookie, csrf_matches, set_cookie
from herald.egress import EgressPolicy
from herald.model import Attempt, Delivery, DeliveryKind, DeliveryStatus, Outcome


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
    fields = forms.config_fields(registry, "webhook")
    body = forms.create_body(
        {
            "csrf_token": "t",
            "type": "webhook",
            "name": "Orders",
            "events": "order.*, invoice.paid\nrefund.*",
            "config.url": "https://example.com/hook",
            "config.secret": "",
            "config.custom_headers.0.name": "X-Api-Key",
            "config.custom_headers.0.value": "k1",
            "config.custom_headers.1.name": "",
            "config.custom_headers.1.value": "",
            "config.custom_headers.2.name": " X-Tenant ",
            "config.custom_headers.2.value": "acme",
        },
        fields,
    )
    assert body == {
        "name": "Orders",
        "type": "webhook",
        "events": ["order.*", "invoice.paid", "refund.*"],
        # Empty fields are not sent; the rows become the JSON object the API takes.
        "webhook": {
            "url": "https://example.com/hook",
            "custom_headers": '{"X-Api-Key":"k1","X-Tenant":"acme"}',
        },
        "rate_limit_per_second": None,
        "circuit_breaker": False,
        "ordering": "none",
    }
    assert forms.edit_body({"name": "n", "events": "a.b"}, "webhook", fields, {}) == {
        "name": "n",
        "events": ["a.b"],
        "rate_limit_per_second": None,
        "circuit_breaker": False,
        "ordering": "none",
    }
    # The config as edited: a masked credential goes back as shown (the service keeps
    # it), an emptied field is removed, a key/value field without a row too.
    edited = {
        "name": "n",
        "events": "a.b",
        "config.url": "https://x.test/",
        "config.secret": "*",
        "config.custom_headers.0.name": "",
        "config.custom_headers.0.value": "",
    }
    assert forms.edit_body(edited, "webhook", fields, {})["webhook"] == {
        "url": "https://x.test/",
        "secret": "*",
        "custom_headers": None,
    }
    by_name = {f.name: f for f in fields}
    assert by_name["url"].required
    assert by_name["secret"].sensitive
    assert by_name["url"].input_name == "config.url"
    assert by_name["custom_headers"].pairs


def test_a_form_shows_only_the_fields_its_type_uses(registry: Registry) -> None:
    # Accepted by every config model, dialled by the SDK types and hookdeck only.
    assert "endpoint_url" not in {f.name for f in forms.config_fields(registry, "webhook")}
    assert "endpoint_url" not in {f.name for f in forms.config_fields(registry, "rabbitmq")}
    for used in ("aws_sqs", "gcp_pubsub", "azure_servicebus", "hookdeck"):
        assert "endpoint_url" in {f.name for f in forms.config_fields(registry, used)}, used


def test_pem_fields_are_multiline_and_come_back_with_lf(registry: Registry) -> None:
    fields = {f.name: f for f in forms.config_fields(registry, "webhook")}
    pems = {"tls_client_certificate", "tls_client_key", "tls_ca_certificate", "oauth2_private_key"}
    assert {name for name, f in fields.items() if f.multiline} == pems
    pem = "-----BEGIN CERTIFICATE-----\nMIIB\nAbCd\n-----END CERTIFICATE-----\n"
    posted = pem.replace("\n", "\r\n")  # how a browser posts a textarea
    form = {
        "type": "webhook",
        "name": "n",
        "events": "*",
        "config.url": "https://example.com/hook",
        "config.tls_client_certificate": posted,
        "config.url_note": "a\r\nb",  # not a field of the type: passed on as typed
    }
    body = forms.create_body(form, list(fields.values()))
    assert body["webhook"]["tls_client_certificate"] == pem
    edited = forms.edit_body(form, "webhook", list(fields.values()), {})
    assert edited["webhook"]["tls_client_certificate"] == pem
    assert forms.field_value(fields["url"], "a\r\nb") == "a\r\nb"  # one line: as posted


def test_the_events_are_those_typed_and_the_one_picked_from_the_catalog() -> None:
    assert forms.form_events({"events": "order.*\n*", "events_add": "shipment.sent"}) == [
        "order.*",
        "*",
        "shipment.sent",
    ]
    assert forms.form_events({"events": "order.*", "events_add": "order.*"}) == ["order.*"]
    assert forms.form_events({"events_add": " a.b "}) == ["a.b"]
    assert forms.form_events({}) == []


STORED = '{"X-Api-Key":"k1","X-Tenant":"acme"}'


@pytest.mark.parametrize(
    ("rows", "repointed", "sent"),
    [
        # Left as shown: unchanged (and, re-pointed, the service asks for it again).
        ([("X-Api-Key", MASK), ("X-Tenant", MASK)], False, MASK),
        ([("X-Api-Key", MASK), ("X-Tenant", MASK)], True, MASK),
        # A row added, one removed, a value typed: the masked ones keep their value.
        (
            [("X-Api-Key", MASK), ("X-Tenant", MASK), ("X-New", "n")],
            False,
            '{"X-Api-Key":"k1","X-Tenant":"acme","X-New":"n"}',
        ),
        ([("X-Tenant", MASK)], False, '{"X-Tenant":"acme"}'),
        ([("X-Api-Key", "k2"), ("X-Tenant", MASK)], False, '{"X-Api-Key":"k2","X-Tenant":"acme"}'),
        # Never a stored value for a new target.
        ([("X-Tenant", MASK), ("X-New", "n")], True, MASK),
        ([("X-New", "n")], True, '{"X-New":"n"}'),
        ([], False, None),
    ],
)
def test_key_value_rows_keep_the_values_left_masked(
    rows: list[tuple[str, str]], repointed: bool, sent: str | None
) -> None:
    assert forms.pairs_value(rows, STORED, repointed=repointed) == sent


def test_an_edit_that_changes_the_target_fills_no_masked_value_in(registry: Registry) -> None:
    fields = forms.config_fields(registry, "webhook")
    stored = {"url": "https://a.test/", "custom_headers": STORED}
    form = {
        "name": "n",
        "events": "a.b",
        "config.url": "https://b.test/",
        "config.custom_headers.0.name": "X-Api-Key",
        "config.custom_headers.0.value": MASK,
        "config.custom_headers.1.name": "X-New",
        "config.custom_headers.1.value": "n",
    }
    assert forms.edit_body(form, "webhook", fields, stored)["webhook"]["custom_headers"] == MASK
    same = {**form, "config.url": "https://a.test/"}
    assert (
        forms.edit_body(same, "webhook", fields, stored)["webhook"]["custom_headers"]
        == '{"X-Api-Key":"k1","X-New":"n"}'
    )


def test_rows_shown_mask_stored_values_and_never_echo_typed_ones(registry: Registry) -> None:
    field = next(f for f in forms.config_fields(registry, "webhook") if f.pairs)
    stored = ["X-Api-Key"]
    shown = forms.shown_rows(field, None, stored)
    assert [(r.name, r.value) for r in shown] == [("X-Api-Key", MASK), ("", ""), ("", "")]
    typed = {"config.custom_headers.0.name": "X-New", "config.custom_headers.0.value": "typed"}
    again = forms.without_credentials(typed, [field])
    assert again == {"config.custom_headers.0.name": "X-New"}
    assert next((r.name, r.value) for r in forms.shown_rows(field, again, stored)) == ("X-New", "")
    assert forms.shown_rows(field, {}, stored, retype=True)[0].value == ""
    # Sent back (another field refused): masked where left masked, empty where typed.
    back = forms.without_credentials(
        {
            "config.custom_headers.0.name": "X-Api-Key",
            "config.custom_headers.0.value": MASK,
            "config.custom_headers.1.name": "X-Tenant",
            "config.custom_headers.1.value": "typed",
        },
        [field],
    )
    shown = forms.shown_rows(field, back, ["X-Api-Key", "X-Tenant"])
    assert [(r.name, r.value) for r in shown[:2]] == [("X-Api-Key", MASK), ("X-Tenant", "")]


def _delivery(attempts: list[int], status: DeliveryStatus) -> Delivery:
    return Delivery(
        id="dlv_1",
        tenant_id="t",
        event_id="e",
        event_type="a.b",
        destination_id="d",
        kind=DeliveryKind.EVENT,
        status=status,
        attempt_count=len(attempts),
        max_attempts=5,
        next_attempt_at=None,
        held=False,
        created_at=0.0,
        updated_at=0.0,
        attempts=tuple(
            Attempt(
                id=f"att_{n}",
                delivery_id="dlv_1",
                number=n,
                started_at=0.0,
                duration_ms=1.0,
                outcome=Outcome.SUCCESS,
            )
            for n in attempts
        ),
    )


def test_a_retry_is_pending_until_its_attempt_lands() -> None:
    assert retry_state("dlv_1.2", _delivery([1, 2], DeliveryStatus.PENDING)) == "pending"
    landed = retry_state("dlv_1.2", _delivery([1, 2, 3], DeliveryStatus.SUCCESS))
    assert isinstance(landed, Attempt)
    assert landed.number == 3
    assert retry_state("dlv_2.2", _delivery([1, 2], DeliveryStatus.PENDING)) is None
    assert retry_state("dlv_1.x", _delivery([1, 2], DeliveryStatus.PENDING)) is None
    assert retry_state(None, _delivery([1], DeliveryStatus.PENDING)) is None
    held = replace(_delivery([1], DeliveryStatus.PENDING), held=True)
    assert retry_state("dlv_1.1", held) == "held"
    # Ended without an attempt (its destination deleted): nothing to wait for.
    assert retry_state("dlv_1.1", _delivery([1], DeliveryStatus.FAILURE)) is None


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
