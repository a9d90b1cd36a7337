"""``api.max_destinations_per_tenant`` over real HTTP and the CLI: past it, a create is
answered 422 ``destination_limit_reached`` (exit 2 at a shell), per tenant."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.e2e.conftest import HeraldFactory
from tests.support.api import Api, base_url, create_key, error_of

pytestmark = [pytest.mark.e2e, pytest.mark.backend_neutral]

DESTS = "/v2/event-destinations"


def hook(n: int) -> dict[str, Any]:
    return {
        "name": f"hook{n}",
        "type": "webhook",
        "webhook": {"url": f"http://127.0.0.1:9/{n}"},
        "events": ["*"],
    }


async def test_a_tenant_past_its_destination_limit_gets_422(
    herald_factory: HeraldFactory,
) -> None:
    h = herald_factory({"api": {"max_destinations_per_tenant": 2}}, start=False)
    await h.astart()
    async with Api(base_url(h), await create_key(h, "acme")) as acme:
        for n in range(2):
            status, _, body = await acme.post(DESTS, json=hook(n))
            assert status == 201, body
        status, _, body = await acme.post(DESTS, json=hook(2))
        assert status == 422, body
        error = error_of(body)
        assert error["code"] == "destination_limit_reached"
        assert "2 event destinations" in error["message"]
        assert "max_destinations_per_tenant" in error["resolution"]
        status, _, listed = await acme.get(DESTS)
        assert status == 200
        assert len(listed["data"]) == 2  # nothing stored by the refused create

    # The CLI creates through the same service: exit 2, the error on stderr.
    refused = await h.acli(
        "destinations", "create", "--tenant", "acme", "--data", json.dumps(hook(3)), check=False
    )
    assert refused.returncode == 2, refused
    assert "2 event destinations" in refused.stderr
    # Another tenant counts its own.
    created = await h.acli_json(
        "destinations", "create", "--tenant", "other", "--data", json.dumps(hook(4))
    )
    assert created["object"] == "event_destination"
