"""The hookdeck adapter against a stand-in for the gateway's ingest URL (aiohttp, 127.0.0.1).

The stand-in (:meth:`tests.support.receiver.Receiver.for_gateway`) verifies each request's
``X-Hookdeck-Signature`` and metadata headers independently of Herald's code
and answers 404 for an unknown source, 401 for a bad signature, as the gateway does.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import json
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import pytest
from aiohttp import web

from herald.adapters import hookdeck
from herald.adapters.base import AdapterContext, Result
from herald.adapters.hookdeck import HookdeckAdapter, HookdeckConfig
from herald.adapters.registry import Registry
from herald.config import DeliverySettings, Settings
from herald.egress import EgressPolicy
from herald.errors import ValidationError
from herald.model import Event, Outcome
from herald.views import destination_view
from tests.contract.adapter_contract import AdapterContract, make_destination, make_event
from tests.support.daemon import free_port
from tests.support.receiver import Received, Receiver, token_for


class TestHookdeckContract(AdapterContract):
    adapter_class = HookdeckAdapter
    settings_overrides: ClassVar[dict[str, Any]] = {"delivery": {"webhook_timeout_seconds": 2.0}}

    @pytest.fixture
    def good_config(self, gateway: Receiver) -> dict[str, str]:
        self.gateway = gateway
        return {"token": gateway.add_source("src_contract"), "endpoint_url": gateway.base_url}

    @pytest.fixture
    def missing_target_config(self, gateway: Receiver) -> dict[str, str]:
        return {"token": token_for("src_nonexistent"), "endpoint_url": gateway.base_url}

    @pytest.fixture
    def bad_credentials_config(self, gateway: Receiver) -> dict[str, str]:
        gateway.add_source("src_contract")
        return {
            "token": token_for("src_contract", "wrong-secret"),
            "endpoint_url": gateway.base_url,
        }

    @pytest.fixture
    def unreachable_config(self) -> dict[str, str]:
        return {"token": token_for("src_x"), "endpoint_url": f"http://127.0.0.1:{free_port()}"}

    async def read_back(self, config: dict[str, str], event: Event) -> dict[str, Any]:
        got = [r for r in self.gateway.received if r.event_id == event.id]
        assert len(got) == 1, self.gateway.rejected
        return {"body": got[0].body, "metadata": got[0].headers}


@pytest.fixture
async def adapter() -> AsyncIterator[HookdeckAdapter]:
    settings = Settings(delivery=DeliverySettings(webhook_timeout_seconds=1.5))
    # The gateway stand-in is on loopback, which the default policy refuses.
    a = HookdeckAdapter(AdapterContext(settings=settings, egress=EgressPolicy(allow_private=True)))
    yield a
    await a.close()


async def send(adapter: HookdeckAdapter, raw: dict[str, str]) -> tuple[Result, Event]:
    config = HookdeckConfig.model_validate(raw)
    event = make_event()
    return await adapter.deliver(make_destination("hookdeck", config), config, event), event


async def test_post_is_signed_with_the_token_and_carries_the_metadata(
    adapter: HookdeckAdapter, gateway: Receiver
) -> None:
    token = gateway.add_source("src_2kXyZ9")
    result, event = await send(adapter, {"token": token, "endpoint_url": gateway.base_url + "/"})
    assert result.outcome is Outcome.SUCCESS, (result, gateway.rejected)
    assert result.status == 200
    assert result.excerpt is not None
    assert "SUCCESS" in result.excerpt
    [req] = gateway.received
    assert req.source_id == "src_2kXyZ9"
    assert req.body == event.envelope()
    assert req.headers["x-hookdeck-signature"] == hookdeck.signature(token, event.envelope())
    assert req.headers["content-type"] == "application/json"
    assert req.headers["user-agent"].startswith("Herald/")
    assert {k: req.headers[k] for k in event.metadata()} == event.metadata()
    assert "webhook-signature" not in req.headers


def test_known_answer_signature() -> None:
    """From openssl: printf '{"a":1}' | openssl dgst -sha256 -hmac TOKEN -binary | base64."""
    token = base64.b64encode(b"src_abc:secret").decode()
    assert token == "c3JjX2FiYzpzZWNyZXQ="
    assert (
        hookdeck.signature(token, b'{"a":1}') == "v0=zqy/LU1vxxXiHlRf4alQ1XDWUWoDnCqWVDsO288M0RI="
    )


async def test_egress_guard_applies_to_the_default_url_and_to_an_endpoint_url(
    gateway: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both are checked like a webhook's URL, at create time and at send time; a gateway
    on a private network passes once its network is allowed."""
    token = gateway.add_source("src_guard")
    monkeypatch.setattr(hookdeck, "DEFAULT_ENDPOINT", gateway.base_url)  # a loopback "default"
    strict = HookdeckAdapter(
        AdapterContext(settings=Settings(), egress=EgressPolicy(allow_private=False))
    )
    loopback = (ipaddress.ip_network("127.0.0.0/8"),)
    allowing = HookdeckAdapter(
        AdapterContext(settings=Settings(), egress=EgressPolicy(allowed_networks=loopback))
    )
    try:
        for raw in ({"token": token}, {"token": token, "endpoint_url": gateway.base_url}):
            denied, _ = await send(strict, raw)
            assert denied.outcome is Outcome.FAILURE_PERMANENT, denied
            assert denied.error is not None
            assert "egress denied" in denied.error
            assert gateway.received == []
        with pytest.raises(ValidationError) as refused:
            await strict.check(
                HookdeckConfig(token=token, endpoint_url=gateway.base_url), tenant_id="default"
            )
        assert (refused.value.code, refused.value.field) == (
            "url_not_allowed",
            "hookdeck.endpoint_url",
        )
        config = {"token": token, "endpoint_url": gateway.base_url}
        await allowing.check(HookdeckConfig.model_validate(config), tenant_id="default")
        allowed, _ = await send(allowing, config)
        assert allowed.outcome is Outcome.SUCCESS, allowed
    finally:
        await strict.close()
        await allowing.close()


@pytest.mark.parametrize(
    ("status", "headers", "outcome", "retry_after"),
    [
        (429, {"Retry-After": "7"}, Outcome.FAILURE_RETRYABLE, 7.0),
        (503, {"Retry-After": "120"}, Outcome.FAILURE_RETRYABLE, 120.0),
        (500, {"Retry-After": "7"}, Outcome.FAILURE_RETRYABLE, None),
        (302, {"Location": "http://127.0.0.1:1/elsewhere"}, Outcome.FAILURE_PERMANENT, None),
        (400, {}, Outcome.FAILURE_PERMANENT, None),
        (202, {}, Outcome.SUCCESS, None),
    ],
)
async def test_status_mapping_and_retry_after_as_for_webhooks(
    adapter: HookdeckAdapter,
    gateway: Receiver,
    status: int,
    headers: dict[str, str],
    outcome: Outcome,
    retry_after: float | None,
) -> None:
    gateway.behaviour = lambda _: web.Response(status=status, headers=headers, text="x" * 5000)
    result, _ = await send(
        adapter, {"token": gateway.add_source("src_s"), "endpoint_url": gateway.base_url}
    )
    assert result.outcome is outcome, result
    assert result.status == status
    assert result.retry_after == retry_after
    assert result.excerpt == "x" * 1024  # capped like a webhook's


async def test_deadline_is_the_webhook_deadline(adapter: HookdeckAdapter) -> None:
    assert adapter.timeout == 1.5


async def test_slow_gateway_is_cut_at_the_deadline_by_the_engine_timeout(
    adapter: HookdeckAdapter, gateway: Receiver
) -> None:
    async def slow(_: Received) -> web.StreamResponse:
        await asyncio.sleep(2.0)  # past the 1.5 s deadline
        return web.Response(status=200)

    gateway.behaviour = slow
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(adapter.timeout):  # exactly what the engine does
            await send(
                adapter, {"token": gateway.add_source("src_t"), "endpoint_url": gateway.base_url}
            )


# --- config validation ------------------------------------------------------------------------
@pytest.fixture
def registry() -> Registry:
    return Registry(AdapterContext(settings=Settings(), egress=EgressPolicy()), [HookdeckAdapter])


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        ({}, "gateway.token is required"),
        ({"token": ""}, "gateway.token: must be the gateway source token"),
        ({"token": "not base64!"}, "must be the gateway source token"),
        ({"token": b64("src_a:sec").rstrip("=") + "A"}, "must be the gateway source token"),
        ({"token": base64.urlsafe_b64encode(b"src_a:s\xfb\xff").decode()}, "source token"),
        ({"token": base64.b64encode(b"\xff\xfe:secret").decode()}, "source token"),
        ({"token": b64("no-colon-here")}, "must decode to id:secret"),
        ({"token": b64("src_a:")}, "must decode to id:secret"),
        ({"token": b64(":secret")}, "where id is a gateway source id"),
        ({"token": b64("src/../x:secret")}, "where id is a gateway source id"),
        ({"token": b64("src_a:s"), "endpoint_url": "ftp://gw"}, "gateway.endpoint_url: must be"),
        ({"token": b64("src_a:s"), "endpoint_url": "gw.local"}, "must be an absolute http"),
        ({"token": b64("src_a:s"), "endpoint_url": "http://u:p@gw"}, "must not carry credentials"),
        ({"token": b64("src_a:s"), "endpoint_url": "http://gw/?a=1"}, "must not carry a query"),
        ({"token": b64("src_a:s"), "source": "x"}, "gateway.source is not a field"),
    ],
)
def test_invalid_configs(registry: Registry, raw: dict[str, str], error: str) -> None:
    with pytest.raises(ValidationError) as caught:
        registry.parse_config("gateway", raw)
    assert error in caught.value.message
    token = raw.get("token")
    if token:
        assert token not in caught.value.message


@pytest.mark.parametrize(
    ("raw", "url"),
    [
        ({"token": b64("src_abc:secret")}, "https://hkdk.events/src_abc"),
        ({"token": b64("src_abc:se:cr:et")}, "https://hkdk.events/src_abc"),
        ({"token": b64("src_ab:secret").rstrip("=")}, "https://hkdk.events/src_ab"),
        (
            {"token": b64("src_abc:secret"), "endpoint_url": "http://127.0.0.1:9000/in/"},
            "http://127.0.0.1:9000/in/src_abc",
        ),
    ],
)
def test_valid_configs(registry: Registry, raw: dict[str, str], url: str) -> None:
    config = registry.parse_config("gateway", raw)
    assert isinstance(config, HookdeckConfig)
    assert config.url == url


def test_token_is_a_credential(registry: Registry) -> None:
    token = b64("src_abc:very-secret")
    config = registry.parse_config("gateway", {"token": token})
    plain, secrets = config.split()
    assert plain == {}
    assert secrets == {"token": token}
    view = destination_view(make_destination("hookdeck", config), registry)
    assert view["hookdeck"] == {"token": "********"}
    assert token not in json.dumps(view)


def test_target_is_the_source_not_the_secret(registry: Registry) -> None:
    def target(token: str, **over: str) -> tuple[Any, ...]:
        return registry.parse_config("gateway", {"token": token, **over}).target()

    assert target(b64("src_a:one")) == target(b64("src_a:two"))
    assert target(b64("src_a:one")) != target(b64("src_b:one"))
    assert target(b64("src_a:one")) != target(b64("src_a:one"), endpoint_url="http://gw")
