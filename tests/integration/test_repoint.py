"""A destination re-pointed at a new target gets none of its old credentials
(docs/security.md, "A new target gets no old credential"): a change of the target
must give every stored credential again (or drop it), else 422
``credentials_required`` naming each; the webhook's signing secret is renewed.
Over a real store (both backends), with real receivers recording what arrives."""

from __future__ import annotations

import json
import time

import pytest
from standardwebhooks.webhooks import Webhook

from herald.errors import ValidationError
from herald.ids import new_id
from herald.model import DeliveryKind, Destination, DestinationStatus
from tests.integration.conftest import (
    OTHER_SECRET,
    SECRET,
    Harness,
    ReceiverFactory,
    eventually,
    running,
)
from tests.integration.gcp.peers import ServiceAccount
from tests.support.receiver import Receiver

MASK = "********"
TOKEN = "Bearer old-target-only"
HEADERS = json.dumps({"Authorization": TOKEN})


def problems(exc: ValidationError) -> dict[str, str]:
    """Field → code of an error and the ones riding with it."""
    return {str(p.field): p.code for p in (exc, *exc.also)}


async def stored(h: Harness, type_name: str, raw: dict[str, str]) -> Destination:
    """A destination of ``type_name`` stored as the service stores it, already active."""
    plain, secrets = h.registry.parse_config(type_name, raw).split()
    now = time.time()
    dest = Destination(
        id=new_id("evtd_"),
        tenant_id="default",
        name="stored",
        type=h.registry.canonical(type_name),
        config=plain,
        secrets=secrets,
        events=("*",),
        status=DestinationStatus.ACTIVE,
        created_at=now,
        updated_at=now,
    )
    await h.store.create_destination(dest, verification=None)
    return dest


async def ping_at(h: Harness, rx: Receiver) -> dict[str, str]:
    """Run a dispatcher until the verification ping reaches ``rx``; its headers."""

    async def arrived() -> bool:
        return any(r.type == "destination.verification" for r in rx.received)

    await h.catalog.refresh()
    async with running(h.dispatcher()):
        await eventually(arrived, timeout=10, what="the verification ping")
    [ping] = [r for r in rx.received if r.type == "destination.verification"]
    return ping.headers


async def test_a_new_url_without_its_credentials_is_refused_naming_each(
    harness: Harness, receivers: ReceiverFactory
) -> None:
    h = harness
    old, new = await receivers(), await receivers()
    dest = await h.add_webhook(old.url, custom_headers=HEADERS)
    for sent in ({"url": new.url}, {"url": new.url, "custom_headers": MASK, "secret": MASK}):
        with pytest.raises(ValidationError) as info:
            await h.service.update("default", dest.id, {"webhook": sent})
        # The secret is not named: a new target without one gets a fresh one.
        assert problems(info.value) == {"webhook.custom_headers": "credentials_required"}
        assert info.value.status == 422
    after = await h.service.get("default", dest.id)
    assert (after.config, after.secrets, after.updated_at) == (
        dest.config,
        dest.secrets,
        dest.updated_at,
    )
    assert await h.deliveries(destination_id=dest.id) == []


async def test_the_ping_to_a_new_url_carries_no_old_credential_and_no_old_signature(
    harness: Harness, receivers: ReceiverFactory
) -> None:
    """The attack: change only the URL to one the caller owns and read the ping there.
    It must bring no ``Authorization`` and no signature the old secrets make."""
    h = harness
    old, new = await receivers(), await receivers(secrets=(SECRET, OTHER_SECRET))
    dest = await h.add_webhook(old.url, custom_headers=HEADERS)
    # Mid-rotation: the previous secret would still sign for 24 hours.
    await h.service.rotate_secret("default", dest.id, OTHER_SECRET)

    moved = await h.service.update(
        "default", dest.id, {"webhook": {"url": new.url, "custom_headers": None}}
    )
    assert moved.status is DestinationStatus.PENDING_VERIFICATION
    assert "custom_headers" not in moved.config | moved.secrets
    fresh = moved.secrets["secret"]
    assert fresh.startswith("whsec_")
    assert fresh not in (SECRET, OTHER_SECRET)
    assert set(moved.secrets) == {"secret"}  # no previous secret either
    assert "_previous_secret_until" not in moved.config

    headers = await ping_at(h, new)
    assert "authorization" not in headers
    assert TOKEN not in json.dumps(headers)
    [ping] = new.received
    assert not ping.verified  # neither the old secret nor the rotated one signs it
    Webhook(fresh).verify(ping.body, headers)  # the renewed one does
    assert old.received == []


async def test_credentials_given_again_go_to_the_new_url(
    harness: Harness, receivers: ReceiverFactory
) -> None:
    h = harness
    old, new = await receivers(), await receivers(secrets=(OTHER_SECRET,))
    dest = await h.add_webhook(old.url, custom_headers=HEADERS)
    given = {"url": new.url, "custom_headers": '{"Authorization": "Bearer new"}'}
    moved = await h.service.update(
        "default", dest.id, {"webhook": {**given, "secret": OTHER_SECRET}}
    )
    assert moved.secrets == {"secret": OTHER_SECRET, "custom_headers": given["custom_headers"]}
    headers = await ping_at(h, new)
    assert headers["authorization"] == "Bearer new"
    assert new.received[0].verified


async def test_a_change_that_keeps_the_target_keeps_the_credentials(harness: Harness) -> None:
    h = harness
    dest = await h.add_webhook("http://127.0.0.1:9/hook", custom_headers=HEADERS)
    kept = await h.service.update(
        "default", dest.id, {"name": "renamed", "webhook": {"url": dest.config["url"]}}
    )
    assert kept.config | kept.secrets == dest.config | dest.secrets
    assert kept.status is DestinationStatus.ACTIVE
    headers = await h.service.update(
        "default", dest.id, {"webhook": {"custom_headers": '{"X-Team": "blue"}'}}
    )
    assert headers.secrets == {"secret": SECRET, "custom_headers": '{"X-Team": "blue"}'}


CONN = (
    "Endpoint=sb://herald.servicebus.windows.net/;"
    "SharedAccessKeyName=send;SharedAccessKey=c2VjcmV0LWtleS12YWx1ZQ=="
)
AWS_KEYS = {"key": "AKIAOLDTARGET", "secret": "old-secret", "session": "old-session"}
GATEWAY_TOKEN = "c3JjX2E6c2VjcmV0"  # base64 of src_a:secret
SA = ServiceAccount.generate()


@pytest.mark.parametrize(
    ("type_name", "raw", "change", "named"),
    [
        (
            "rabbitmq",
            {"server_url": "amqp://u:old-pass@127.0.0.1:5672", "exchange": "herald"},
            {"server_url": "127.0.0.2:5672"},
            ["rabbitmq.password"],
        ),
        (
            "amqp_broker",
            {"server_url": "127.0.0.1:5672", "username": "u", "password": "p", "exchange": "x"},
            {"exchange": "elsewhere", "password": MASK},
            ["amqp_broker.password"],
        ),
        (
            "hookdeck",
            {"token": GATEWAY_TOKEN},
            {"endpoint_url": "http://127.0.0.1:9/gw"},
            ["hookdeck.token"],
        ),
        (
            "aws_sqs",
            {"queue_url": "http://127.0.0.1:9/000000000000/orders", **AWS_KEYS},
            {"queue_url": "http://127.0.0.2:9/000000000000/orders"},
            ["aws_sqs.key", "aws_sqs.secret", "aws_sqs.session"],
        ),
        (
            "aws_s3",
            {"bucket": "orders", "region": "eu-west-1", "key": "AKIA", "secret": "s"},
            {"region": "us-east-1", "key": "AKIANEW"},
            ["aws_s3.secret"],
        ),
        (
            "aws_eventbridge",
            {"event_bus_name": "bus", "region": "eu-west-1", "access_key_id": "AKIA"}
            | {"secret_access_key": "s"},
            {"endpoint_url": "http://127.0.0.1:9"},
            ["aws_eventbridge.access_key_id", "aws_eventbridge.secret_access_key"],
        ),
        (
            "azure_servicebus",
            {"name": "orders", "connection_string": CONN},
            {"endpoint_url": "sb://127.0.0.1:5672"},
            ["azure_servicebus.connection_string"],
        ),
        (
            "gcp_pubsub",
            {"project_id": "my-project-1", "topic": "events", "service_account_json": SA.json},
            {"topic": "elsewhere"},
            ["gcp_pubsub.service_account_json"],
        ),
    ],
)
async def test_every_type_refuses_a_new_target_without_its_credentials(
    harness: Harness,
    type_name: str,
    raw: dict[str, str],
    change: dict[str, str],
    named: list[str],
) -> None:
    h = harness
    dest = await stored(h, type_name, raw)
    with pytest.raises(ValidationError) as info:
        await h.service.update("default", dest.id, {type_name: change})
    assert problems(info.value) == dict.fromkeys(named, "credentials_required")
    assert await h.service.get("default", dest.id) == dest
    # Given again, the same change is made.
    again = {field: dest.secrets[field] for field in (name.partition(".")[2] for name in named)}
    moved = await h.service.update("default", dest.id, {type_name: {**change, **again}})
    assert moved.status is DestinationStatus.PENDING_VERIFICATION
    pings = await h.deliveries(destination_id=dest.id, kind=DeliveryKind.VERIFICATION)
    assert len(pings) == 1


async def test_a_login_in_a_new_server_url_is_given_with_it(harness: Harness) -> None:
    h = harness
    dest = await stored(
        h, "rabbitmq", {"server_url": "amqp://u:old@127.0.0.1:5672", "exchange": "herald"}
    )
    moved = await h.service.update(
        "default", dest.id, {"rabbitmq": {"server_url": "amqp://v:new@127.0.0.2:5672"}}
    )
    assert moved.config["server_url"] == "amqp://127.0.0.2:5672"
    assert (moved.config["username"], moved.secrets["password"]) == ("v", "new")


async def test_an_empty_patch_changes_nothing_not_even_updated_at(harness: Harness) -> None:
    h = harness
    dest = await h.add_webhook("http://127.0.0.1:9/hook")
    for body in ({}, {"name": dest.name}, {"webhook": {"url": dest.config["url"]}}):
        same = await h.service.update("default", dest.id, body)
        assert same == dest, body
        assert await h.service.get("default", dest.id) == dest
    assert await h.deliveries(destination_id=dest.id) == []


def test_every_type_declares_its_target_and_its_credentials(harness: Harness) -> None:
    """The marks the rule reads (the table in docs/security.md is checked against them
    in tests/unit/test_docs.py)."""
    for adapter in harness.registry:
        model = adapter.config_model
        assert model.marked("target"), adapter.type_id
        assert model.sensitive_fields(), adapter.type_id
        assert not model.marked("target") & model.sensitive_fields(), adapter.type_id


async def test_a_header_that_can_never_be_sent_is_refused_at_create(harness: Harness) -> None:
    h = harness
    for headers in ('{"X-A": "a\\u0001b"}', '{"Expect": "100-continue"}'):
        body = {
            "name": "n",
            "type": "webhook",
            "events": ["*"],
            "webhook": {"url": "http://127.0.0.1:9/hook", "custom_headers": headers},
        }
        with pytest.raises(ValidationError) as info:
            await h.service.create("default", body)
        assert (info.value.field, info.value.code) == ("webhook.custom_headers", "invalid_value")
    assert h.scalar("SELECT COUNT(*) FROM herald_destinations") == 0
