"""What a daemon writes while destinations of every kind fail: in ``json`` mode every
line is one JSON object — also the lines of aiormq, botocore, grpc, azure and asyncio —
attempt lines name the tenant, destination, event and delivery, times are ISO 8601
UTC, and the lifecycle (verified, exhausted, paused, resumed) has its info lines."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from aiohttp import web

from tests.e2e.conftest import SECRET, HeraldFactory
from tests.e2e.test_delivery import wait_active, wait_deliveries
from tests.integration.gcp.peers import ServiceAccount
from tests.support.api import open_api
from tests.support.daemon import free_port
from tests.support.receiver import Receiver, verification_ok_then

pytestmark = [pytest.mark.e2e, pytest.mark.backend_neutral]

ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")


def unreachable_configs() -> dict[str, dict[str, Any]]:
    """A config of each kind whose target refuses connections (nothing listens)."""
    port = free_port()
    local = f"127.0.0.1:{port}"
    return {
        "webhook": {"url": f"http://{local}/hook"},
        "rabbitmq": {"server_url": f"amqp://guest:guest@{local}/", "exchange": "e"},
        "aws_sqs": {
            "queue_url": f"http://{local}/123456789012/q",
            "key": "AKIDEXAMPLE",
            "secret": "wJalrXUtnFEMI",
            "endpoint_url": f"http://{local}",
        },
        "gcp_pubsub": {
            "project_id": "herald-logs",
            "topic": "herald-topic",
            "endpoint_url": local,
            "service_account_json": ServiceAccount.generate().json,
        },
        "azure_servicebus": {
            "name": "q",
            "connection_string": f"Endpoint=sb://{local};SharedAccessKeyName=k;"
            "SharedAccessKey=a2V5;UseDevelopmentEmulator=true",
        },
    }


@pytest.mark.sqlite_only
async def test_every_line_is_json_while_destinations_of_every_kind_fail(
    herald_factory: HeraldFactory,
) -> None:
    h = herald_factory(
        {
            "delivery": {"max_retries": 1, "backoff_base_seconds": 0.05},
            "log": {"format": "json", "level": "info"},
        },
        start=False,
    )
    await h.astart()
    configs = unreachable_configs()
    created = {}
    for type_, config in configs.items():
        body = {"name": type_, "type": type_, type_: config, "events": ["*"]}
        created[type_] = await h.acli_json("destinations", "create", "--data", json.dumps(body))
    # A webhook that verifies, then fails every event: a delivery runs out of retries.
    receiver = await Receiver(
        secrets=[SECRET], behaviour=verification_ok_then(lambda _: web.Response(status=500))
    ).start()
    try:
        good = await h.acreate_webhook(receiver.url, secret=SECRET, events=["order.*"])
        await wait_active(h, good["id"])
        h.insert_events([("evt_logs_1", "default", "order.created", "{}")])
        await wait_deliveries(h, "status = 'failure' AND kind = 'event'", 1, timeout=30)
        # Every unreachable destination's verification ran out of its two attempts.
        await wait_deliveries(
            h, "status = 'failure' AND kind = 'verification'", len(configs), timeout=60
        )
        # Through the API: the daemon's own lines, each with its request's id.
        async with open_api(h, "default") as api:
            for status in ("inactive", "active"):
                path = f"/v2/event-destinations/{good['id']}"
                code, _, _ = await api.patch(path, json={"status": status})
                assert code == 200
            # A test ping's line carries the id of the request that sent it.
            code, headers, _ = await api.post(f"/v2/event-destinations/{good['id']}/test")
            assert code == 200
            ping_request = headers["X-Request-Id"]
        assert await h.astop() == 0
    finally:
        await receiver.stop()

    lines = [line for line in h.log().splitlines() if line.strip()]
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            pytest.fail(f"not a JSON line: {line!r}")
    assert all(isinstance(r, dict) and "event" in r and "level" in r for r in records)
    for r in records:
        assert ISO_UTC.match(r["timestamp"]), r
        for key, value in r.items():
            if key.endswith("_at") and value is not None:
                assert isinstance(value, str), (key, r)
                assert ISO_UTC.match(value), (key, r)

    failed = [r for r in records if r["event"] == "attempt_failed"]
    ids = {"tenant_id", "destination_id", "event_id", "delivery_id"}
    assert failed
    assert all(ids <= r.keys() for r in failed)
    assert {r["destination_type"] for r in failed} >= set(configs)
    # A first failure has a next attempt, written as an instant.
    assert any(r.get("next_attempt_at") for r in failed)
    exhausted = {r["destination_id"] for r in records if r["event"] == "verification_exhausted"}
    assert exhausted == {d["id"] for d in created.values()}
    [gave_up] = [r for r in records if r["event"] == "delivery_exhausted"]
    assert ids <= gave_up.keys()
    assert (gave_up["event_id"], gave_up["destination_id"]) == ("evt_logs_1", good["id"])
    events = [r["event"] for r in records if r.get("destination_id") == good["id"]]
    assert "destination_verified" in events
    assert events.index("destination_paused") < events.index("destination_resumed")
    toggles = [r for r in records if r["event"] in ("destination_paused", "destination_resumed")]
    assert all(r["request_id"].startswith("req_") for r in toggles)
    [ping] = [r for r in records if r["event"] == "test_ping_sent"]
    assert ping["request_id"] == ping_request
    assert ids <= ping.keys()
    assert (ping["destination_id"], ping["response_status"]) == (good["id"], 500)
    # At info, a successful attempt has no line of its own.
    assert not [r for r in records if r["event"] == "attempt_succeeded"]
    # The libraries' own lines came through structlog too (they name their logger).
    assert any(r.get("logger") == "aiormq.connection" for r in records)
