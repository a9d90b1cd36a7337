"""A webhook's receiver that wants more than a signature, against real servers: OAuth2
client credentials from an Authlib token server, and mutual TLS with a test CA."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from herald.adapters.base import AdapterContext, DestinationConfig, Result
from herald.adapters.registry import Registry
from herald.adapters.webhook import WebhookAdapter
from herald.config import Settings
from herald.egress import EgressPolicy
from herald.errors import ValidationError
from herald.model import Destination, Outcome
from tests.integration.conftest import Harness, make_settings
from tests.integration.test_repoint import problems, stored
from tests.integration.test_webhook_adapter import make_dest, make_event
from tests.support.receiverauth import (
    OAuthClient,
    Protected,
    TestCA,
    TokenServer,
    key_pem,
    new_key,
    public_pem,
)

CLIENT_SECRET = "oauth2-client-s3cret-value-7731"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return make_settings(f"sqlite:///{tmp_path / 'unused.db'}")


@pytest.fixture
async def registry(settings: Settings) -> AsyncIterator[Registry]:
    reg = Registry(AdapterContext(settings=settings, egress=EgressPolicy(allow_private=True)))
    yield reg
    await reg.close()


@pytest.fixture
async def token_server() -> AsyncIterator[TokenServer]:
    server = await TokenServer().start()
    yield server
    await server.stop()


@pytest.fixture
async def protected(token_server: TokenServer) -> AsyncIterator[Protected]:
    receiver = await Protected(server=token_server).start()
    yield receiver
    await receiver.stop()


def webhook(registry: Registry) -> WebhookAdapter:
    adapter = registry.get("webhook")
    assert isinstance(adapter, WebhookAdapter)
    return adapter


async def deliver(
    registry: Registry, dest: Destination, raw: Mapping[str, Any], *, event_id: str = ""
) -> Result:
    config: DestinationConfig = registry.parse_config("webhook", raw, submitted=True)
    event = make_event()
    return await asyncio.wait_for(webhook(registry).deliver(dest, config, event), 15)


def oauth2(server: TokenServer, **fields: str) -> dict[str, str]:
    return {
        "oauth2_token_url": server.token_url,
        "oauth2_client_id": "herald",
        "oauth2_client_secret": CLIENT_SECRET,
        **fields,
    }


# --- OAuth2 ---------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["client_secret_basic", "client_secret_post"])
async def test_each_secret_method_gets_a_token_the_receiver_accepts(
    registry: Registry, token_server: TokenServer, protected: Protected, method: str
) -> None:
    token_server.add(OAuthClient("herald", method=method, secret=CLIENT_SECRET))
    dest, raw = make_dest(
        protected.url,
        **oauth2(
            token_server,
            oauth2_auth_method=method,
            oauth2_scope="events:write",
            oauth2_audience="partner-api",
        ),
    )
    result = await deliver(registry, dest, raw)
    assert result.outcome is Outcome.SUCCESS, result
    [request] = token_server.requests
    assert (request.status, request.client_id) == (200, "herald")
    assert request.form["scope"] == "events:write"
    assert request.form["audience"] == "partner-api"
    assert token_server.issued[0]["audience"] == "partner-api"
    if method == "client_secret_basic":
        assert request.headers["Authorization"].startswith("Basic ")
        assert "client_secret" not in request.form
    else:
        assert "Authorization" not in request.headers
        assert request.form["client_secret"] == CLIENT_SECRET
    assert protected.statuses == {200: 1}


async def test_private_key_jwt_signs_an_assertion_the_server_verifies(
    registry: Registry, token_server: TokenServer, protected: Protected
) -> None:
    key = new_key()
    token_server.add(OAuthClient("herald", method="private_key_jwt", public_key=public_pem(key)))
    dest, raw = make_dest(
        protected.url,
        oauth2_token_url=token_server.token_url,
        oauth2_client_id="herald",
        oauth2_auth_method="private_key_jwt",
        oauth2_private_key=key_pem(key),
        oauth2_key_id="key-1",
    )
    result = await deliver(registry, dest, raw)
    assert result.outcome is Outcome.SUCCESS, result
    [request] = token_server.requests
    assert request.status == 200
    assert request.form["client_assertion_type"].endswith(":jwt-bearer")
    assert "client_secret" not in request.form
    # Another key does not pass: the server really checks the signature.
    dest2, raw2 = make_dest(
        protected.url,
        **{k: v for k, v in raw.items() if k != "url"},
    )
    raw2["oauth2_private_key"] = key_pem(new_key())
    refused = await deliver(registry, dest2, raw2)
    assert refused.outcome is Outcome.FAILURE_PERMANENT
    assert refused.error == "oauth2_token: 400 invalid_client"


async def test_one_token_request_serves_a_hundred_concurrent_deliveries(
    registry: Registry, token_server: TokenServer, protected: Protected
) -> None:
    token_server.add(OAuthClient("herald", secret=CLIENT_SECRET))
    dest, raw = make_dest(protected.url, **oauth2(token_server))
    results = await asyncio.gather(*(deliver(registry, dest, raw) for _ in range(100)))
    assert {r.outcome for r in results} == {Outcome.SUCCESS}
    assert len(token_server.requests) == 1
    assert protected.statuses == {200: 100}


async def test_a_revoked_token_is_replaced_within_the_same_attempt(
    registry: Registry, token_server: TokenServer, protected: Protected
) -> None:
    token_server.add(OAuthClient("herald", secret=CLIENT_SECRET))
    dest, raw = make_dest(protected.url, **oauth2(token_server))
    assert (await deliver(registry, dest, raw)).outcome is Outcome.SUCCESS
    token_server.revoke()
    result = await deliver(registry, dest, raw)
    assert result.outcome is Outcome.SUCCESS, result
    assert len(token_server.requests) == 2
    assert protected.statuses == {200: 2, 401: 1}
    # The refused request and the accepted one are the same delivery.
    assert protected.refused == protected.delivered[1:]


async def test_concurrent_401s_on_one_revoked_token_fetch_one_new_token(
    registry: Registry, token_server: TokenServer, protected: Protected
) -> None:
    token_server.add(OAuthClient("herald", secret=CLIENT_SECRET))
    dest, raw = make_dest(protected.url, **oauth2(token_server))
    assert (await deliver(registry, dest, raw)).outcome is Outcome.SUCCESS
    token_server.revoke()
    results = await asyncio.gather(*(deliver(registry, dest, raw) for _ in range(20)))
    assert {r.outcome for r in results} == {Outcome.SUCCESS}
    assert len(token_server.requests) == 2
    assert protected.statuses[200] == 21


async def test_a_401_on_a_token_already_replaced_costs_no_fetch(
    registry: Registry, token_server: TokenServer, protected: Protected
) -> None:
    token_server.add(OAuthClient("herald", secret=CLIENT_SECRET))
    dest, raw = make_dest(protected.url, **oauth2(token_server))
    config = registry.parse_config("webhook", raw)
    client = config.oauth2_client()  # type: ignore[attr-defined]
    tokens = webhook(registry).tokens
    first = await tokens.get(dest.id, client)
    tokens.refused(dest.id, first)
    second = await tokens.get(dest.id, client)
    assert second != first
    tokens.refused(dest.id, first)  # a late 401 for the old token
    assert await tokens.get(dest.id, client) == second
    assert len(token_server.requests) == 2


async def test_a_changed_secret_never_reuses_the_old_token(
    registry: Registry, token_server: TokenServer, protected: Protected
) -> None:
    token_server.add(OAuthClient("herald", secret=CLIENT_SECRET))
    dest, raw = make_dest(protected.url, **oauth2(token_server))
    assert (await deliver(registry, dest, raw)).outcome is Outcome.SUCCESS
    changed = {**raw, "oauth2_client_secret": "a-new-secret-the-server-refuses"}
    result = await deliver(registry, replace(dest, updated_at=dest.updated_at + 1), changed)
    assert result.outcome is Outcome.FAILURE_PERMANENT
    assert result.error == "oauth2_token: 401 invalid_client"


async def test_a_wrong_secret_fails_the_attempt_naming_the_token_server(
    registry: Registry, token_server: TokenServer, protected: Protected
) -> None:
    token_server.add(OAuthClient("herald", secret="the-right-one"))
    dest, raw = make_dest(protected.url, **oauth2(token_server))
    result = await deliver(registry, dest, raw)
    assert result.outcome is Outcome.FAILURE_PERMANENT
    assert result.error == "oauth2_token: 401 invalid_client"
    assert CLIENT_SECRET not in repr(result)
    assert protected.statuses == {}  # the receiver is never asked without a token


async def test_an_unreachable_token_server_is_a_retryable_failure(
    registry: Registry, protected: Protected
) -> None:
    server = TokenServer()  # never started: port 0
    dest, raw = make_dest(protected.url, **oauth2(server))
    raw["oauth2_token_url"] = "http://127.0.0.1:9/token"
    result = await deliver(registry, dest, raw)
    assert result.outcome is Outcome.FAILURE_RETRYABLE
    assert result.error is not None
    assert result.error.startswith("oauth2_token: connection failed")


async def test_a_token_url_on_a_private_address_is_refused_by_the_guard(
    tmp_path: Path, token_server: TokenServer
) -> None:
    settings = make_settings(
        f"sqlite:///{tmp_path / 'unused.db'}", security={"allow_private_networks": False}
    )
    reg = Registry(AdapterContext(settings=settings, egress=EgressPolicy()))
    try:
        adapter = webhook(reg)
        raw = {"url": "https://8.8.8.8/hook", **oauth2(token_server)}
        raw["oauth2_token_url"] = "https://10.1.2.3/token"
        config = reg.parse_config("webhook", raw, submitted=True)
        with pytest.raises(ValidationError) as info:
            await adapter.check(config, tenant_id="acme")
        assert info.value.field == "webhook.oauth2_token_url"
        # Plain http is refused too: the client's secret would travel in clear.
        plain = reg.parse_config(
            "webhook", {**raw, "oauth2_token_url": "http://example.com/token"}, submitted=True
        )
        with pytest.raises(ValidationError, match="https") as info:
            await adapter.check(plain, tenant_id="acme")
        assert info.value.field == "webhook.oauth2_token_url"
        # And at send time, for one stored before the rule.
        dest, _ = make_dest("https://8.8.8.8/hook")
        result = await asyncio.wait_for(adapter.deliver(dest, config, make_event()), 15)
        assert result.outcome is Outcome.FAILURE_PERMANENT
        assert result.error is not None
        assert "10.1.2.3" in result.error
    finally:
        await reg.close()
    assert token_server.requests == []


@pytest.mark.parametrize(
    ("change", "field", "code"),
    [
        ({"oauth2_client_id": None}, "webhook.oauth2_client_id", "field_required"),
        ({"oauth2_token_url": None}, "webhook.oauth2_token_url", "field_required"),
        ({"oauth2_client_secret": None}, "webhook.oauth2_client_secret", "field_required"),
        (
            {"oauth2_auth_method": "private_key_jwt"},
            "webhook.oauth2_private_key",
            "field_required",
        ),
        (
            {"oauth2_auth_method": "client_secret_jwt"},
            "webhook.oauth2_auth_method",
            "invalid_value",
        ),
        (
            {"custom_headers": json.dumps({"authorization": "Bearer static"})},
            "webhook.custom_headers",
            "invalid_value",
        ),
        (
            {"oauth2_private_key": "-----BEGIN PRIVATE KEY-----"},
            "webhook.oauth2_private_key",
            "invalid_value",
        ),
    ],
)
def test_the_oauth2_fields_go_together(
    registry: Registry, change: dict[str, str | None], field: str, code: str
) -> None:
    raw: dict[str, Any] = {
        "url": "https://example.com/hook",
        "oauth2_token_url": "https://auth.example.com/token",
        "oauth2_client_id": "herald",
        "oauth2_client_secret": CLIENT_SECRET,
        **change,
    }
    raw = {k: v for k, v in raw.items() if v is not None}
    with pytest.raises(ValidationError) as info:
        registry.parse_config("webhook", raw, submitted=True)
    fields = [info.value.field, *(p.field for p in info.value.also)]
    assert field in fields
    assert next(p for p in [info.value, *info.value.also] if p.field == field).code == code
    assert CLIENT_SECRET not in str(info.value)


# --- mutual TLS -----------------------------------------------------------------------


@pytest.fixture
def ca() -> TestCA:
    return TestCA()


@pytest.fixture
async def mtls_receiver(ca: TestCA, tmp_path: Path) -> AsyncIterator[Protected]:
    receiver = await Protected(tls=ca.server_context(tmp_path)).start()
    yield receiver
    await receiver.stop()


async def test_a_client_certificate_reaches_a_receiver_that_requires_one(
    registry: Registry, ca: TestCA, mtls_receiver: Protected
) -> None:
    client = ca.issue("herald-client")
    dest, raw = make_dest(
        mtls_receiver.url,
        tls_client_certificate=client.certificate,
        tls_client_key=client.key,
        tls_ca_certificate=ca.pem,
    )
    result = await deliver(registry, dest, raw)
    assert result.outcome is Outcome.SUCCESS, result
    assert mtls_receiver.peers == ["herald-client"]


async def test_without_a_client_certificate_the_receiver_refuses(
    registry: Registry, ca: TestCA, mtls_receiver: Protected
) -> None:
    dest, raw = make_dest(mtls_receiver.url, tls_ca_certificate=ca.pem)
    result = await deliver(registry, dest, raw)
    assert result.outcome is not Outcome.SUCCESS
    assert mtls_receiver.peers == []
    # Without tls_ca_certificate the receiver's test CA is not trusted at all.
    client = ca.issue("herald-client")
    dest, raw = make_dest(
        mtls_receiver.url, tls_client_certificate=client.certificate, tls_client_key=client.key
    )
    result = await deliver(registry, dest, raw)
    assert result.outcome is Outcome.FAILURE_RETRYABLE
    assert result.error is not None
    assert "CERTIFICATE_VERIFY_FAILED" in result.error


async def test_destinations_with_different_certificates_never_share_a_connection(
    registry: Registry, ca: TestCA, mtls_receiver: Protected
) -> None:
    made = []
    for name in ("client-a", "client-b"):
        issued = ca.issue(name)
        made.append(
            make_dest(
                mtls_receiver.url,
                tls_client_certificate=issued.certificate,
                tls_client_key=issued.key,
                tls_ca_certificate=ca.pem,
            )
        )
    for _ in range(3):
        for dest, raw in made:
            assert (await deliver(registry, dest, raw)).outcome is Outcome.SUCCESS
    assert mtls_receiver.peers == ["client-a", "client-b"] * 3


def test_the_tls_fields_are_checked_at_create(registry: Registry, ca: TestCA) -> None:
    client = ca.issue("herald-client")
    expired = ca.issue("old", not_after=dt.datetime.now(dt.UTC) - dt.timedelta(days=1))
    base = {"url": "https://example.com/hook"}
    cases: list[tuple[dict[str, str], str]] = [
        (
            {"tls_client_certificate": client.certificate, "tls_client_key": key_pem(new_key())},
            "webhook.tls_client_key",
        ),
        (
            {"tls_client_certificate": expired.certificate, "tls_client_key": expired.key},
            "webhook.tls_client_certificate",
        ),
        (
            {"tls_client_certificate": "not a certificate", "tls_client_key": client.key},
            "webhook.tls_client_certificate",
        ),
        (
            {"tls_client_certificate": client.certificate, "tls_client_key": "not a key"},
            "webhook.tls_client_key",
        ),
        ({"tls_client_certificate": client.certificate}, "webhook.tls_client_key"),
        ({"tls_client_key": client.key}, "webhook.tls_client_certificate"),
        (
            {"tls_ca_certificate": "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----"},
            "webhook.tls_ca_certificate",
        ),
    ]
    for fields, field in cases:
        with pytest.raises(ValidationError) as info:
            registry.parse_config("webhook", {**base, **fields}, submitted=True)
        assert info.value.field == field, (fields.keys(), info.value)
        assert client.key not in str(info.value)
    # A stored certificate that has expired since is still read back.
    stored = registry.parse_config(
        "webhook",
        {**base, "tls_client_certificate": expired.certificate, "tls_client_key": expired.key},
    )
    assert stored.tls_client_certificate == expired.certificate  # type: ignore[attr-defined]
    # tls_client_key is a credential: encrypted at rest, masked, never kept for a new URL.
    assert "tls_client_key" in registry.get("webhook").config_model.sensitive_fields()


async def test_a_new_token_url_needs_every_credential_again(harness: Harness, ca: TestCA) -> None:
    """The token URL is a target: the client's secret goes there (docs/security.md)."""
    h = harness
    client = ca.issue("herald-client")
    dest = await stored(
        h,
        "webhook",
        {
            "url": "http://127.0.0.1:9/hook",
            "oauth2_token_url": "http://127.0.0.1:9/token",
            "oauth2_client_id": "herald",
            "oauth2_client_secret": CLIENT_SECRET,
            "tls_client_certificate": client.certificate,
            "tls_client_key": client.key,
        },
    )
    change = {"oauth2_token_url": "http://127.0.0.2:9/token"}
    with pytest.raises(ValidationError) as info:
        await h.service.update("default", dest.id, {"webhook": change})
    assert problems(info.value) == {
        "webhook.oauth2_client_secret": "credentials_required",
        "webhook.tls_client_key": "credentials_required",
    }
    assert await h.service.get("default", dest.id) == dest
    again = {"oauth2_client_secret": CLIENT_SECRET, "tls_client_key": client.key}
    moved = await h.service.update("default", dest.id, {"webhook": {**change, **again}})
    assert moved.config["oauth2_token_url"] == change["oauth2_token_url"]
    # A change that keeps the targets keeps the credentials.
    kept = await h.service.update("default", dest.id, {"webhook": {"oauth2_scope": "more"}})
    assert kept.secrets["oauth2_client_secret"] == CLIENT_SECRET
    assert kept.secrets["tls_client_key"] == client.key
