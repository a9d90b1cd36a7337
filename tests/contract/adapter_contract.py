"""The contract every destination adapter honours, as a test suite to subclass.

A subclass names its adapter class and provides configs for a working target,
a missing target, bad credentials and an unreachable service, plus a way to
read back what arrived. The suite then checks, against the real protocol
peer, that a publish arrives intact and that each failure is reported as a
typed outcome (never an exception), and that ``close()`` releases everything.

Subclasses live beside the adapter's own integration tests, e.g.::

    class TestSQSContract(AdapterContract):
        adapter_class = SQSAdapter
        ...
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any, ClassVar

import orjson
import pytest

from herald.adapters.base import Adapter, AdapterContext, DestinationConfig
from herald.config import Settings
from herald.egress import EgressPolicy
from herald.ids import new_id
from herald.model import Destination, DestinationStatus, Event, Outcome

AMBIENT: dict[str, Any] = {"security": {"ambient_credentials_tenants": ["default"]}}
"""Settings under which tenant "default" may use the host's cloud identity (listed on
purpose: the default lists no tenant)."""
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def make_event(type_: str = "task_run.completed", *, tenant: str = "default") -> Event:
    now = time.time()
    return Event(
        id=new_id("evt_"),
        tenant_id=tenant,
        type=type_,
        created_at="2026-11-22T10:00:00.123456789Z",
        created_ts=now,
        data=orjson.dumps({"task_run_id": "trun_1", "status": "completed"}),
    )


def make_destination(type_id: str, config: DestinationConfig) -> Destination:
    plain, secrets = config.split()
    now = time.time()
    return Destination(
        id=new_id("evtd_"),
        tenant_id="default",
        name="contract",
        type=type_id,
        config=plain,
        secrets=secrets,
        events=("*",),
        status=DestinationStatus.ACTIVE,
        created_at=now,
        updated_at=now,
    )


class AdapterContract:
    """Subclass and implement the four config fixtures and ``read_back``."""

    adapter_class: ClassVar[type[Adapter]]
    settings_overrides: ClassVar[dict[str, Any]] = {}
    # The outcomes this type documents (README) for a target that does not exist and
    # for refused credentials: permanent unless the protocol cannot tell them apart
    # from trouble a retry fixes.
    missing_target_outcome: ClassVar[Outcome] = Outcome.FAILURE_PERMANENT
    bad_credentials_outcome: ClassVar[Outcome] = Outcome.FAILURE_PERMANENT
    # Whether the event's ``traceparent`` travels with the message (a header or an
    # attribute); types whose messages have no such place (Kinesis, EventBridge) say so.
    carries_traceparent: ClassVar[bool] = True

    # --- what a subclass provides ------------------------------------------
    @pytest.fixture
    def good_config(self) -> dict[str, str]:
        raise NotImplementedError

    @pytest.fixture
    def missing_target_config(self) -> dict[str, str]:
        """Valid fields, but the queue/stream/bucket/exchange/topic does not exist."""
        raise NotImplementedError

    @pytest.fixture
    def bad_credentials_config(self) -> dict[str, str]:
        raise NotImplementedError

    @pytest.fixture
    def unreachable_config(self) -> dict[str, str]:
        """The service cannot be reached at all (e.g. a closed port)."""
        raise NotImplementedError

    async def read_back(self, config: dict[str, str], event: Event) -> dict[str, Any]:
        """Fetch what the peer received for ``event``: at least ``body`` (bytes)
        and ``metadata`` (a dict of the event metadata as the peer carries it)."""
        raise NotImplementedError

    # --- shared machinery ---------------------------------------------------
    @pytest.fixture
    async def adapter(self) -> AsyncIterator[Adapter]:
        # Keyless configs publish with the host's identity (tenant "default", listed).
        settings = Settings(**{**AMBIENT, **self.settings_overrides})
        adapter = self.adapter_class(
            AdapterContext(settings=settings, egress=EgressPolicy(allow_private=True))
        )
        yield adapter
        await adapter.close()

    def parse(self, raw: dict[str, str]) -> DestinationConfig:
        return self.adapter_class.config_model.model_validate(raw)

    async def publish(self, adapter: Adapter, raw: dict[str, str], event: Event) -> Any:
        config = self.parse(raw)
        dest = make_destination(self.adapter_class.type_id, config)
        return await adapter.deliver(dest, config, event)

    # --- the contract ---------------------------------------------------------
    async def test_success_arrives_with_envelope_and_metadata(
        self, adapter: Adapter, good_config: dict[str, str]
    ) -> None:
        event = make_event()
        result = await self.publish(adapter, good_config, event)
        assert result.outcome is Outcome.SUCCESS, result
        got = await self.read_back(good_config, event)
        assert json.loads(got["body"]) == json.loads(event.envelope())
        meta = got["metadata"]
        assert meta["event-id"] == event.id
        assert meta["event-type"] == event.type
        assert meta["event-created-at"] == event.created_at
        assert meta["tenant-id"] == event.tenant_id

    async def test_a_traceparent_travels_with_the_metadata_when_the_event_has_one(
        self, adapter: Adapter, good_config: dict[str, str]
    ) -> None:
        carried = TRACEPARENT if self.carries_traceparent else None
        for event, expected in (
            (replace(make_event(), traceparent=TRACEPARENT), carried),
            (make_event(), None),
        ):
            result = await self.publish(adapter, good_config, event)
            assert result.outcome is Outcome.SUCCESS, result
            meta = (await self.read_back(good_config, event))["metadata"]
            assert meta.get("traceparent") == expected

    async def test_missing_target_is_a_failed_attempt(
        self, adapter: Adapter, missing_target_config: dict[str, str]
    ) -> None:
        result = await self.publish(adapter, missing_target_config, make_event())
        assert result.outcome is self.missing_target_outcome, result
        assert result.error

    async def test_bad_credentials_are_a_failed_attempt(
        self, adapter: Adapter, bad_credentials_config: dict[str, str]
    ) -> None:
        result = await self.publish(adapter, bad_credentials_config, make_event())
        assert result.outcome is self.bad_credentials_outcome, result
        assert result.error

    async def test_unreachable_service_is_retryable(
        self, adapter: Adapter, unreachable_config: dict[str, str]
    ) -> None:
        result = await self.publish(adapter, unreachable_config, make_event())
        assert result.outcome in (Outcome.FAILURE_RETRYABLE, Outcome.TIMEOUT), result
        assert result.error

    async def test_close_is_idempotent_and_adapter_reusable_after_publish(
        self, adapter: Adapter, good_config: dict[str, str]
    ) -> None:
        first = await self.publish(adapter, good_config, make_event())
        second = await self.publish(adapter, good_config, make_event())
        assert first.outcome is Outcome.SUCCESS
        assert second.outcome is Outcome.SUCCESS
        await adapter.close()
        await adapter.close()

    def test_secrets_are_marked_sensitive(self) -> None:
        model = self.adapter_class.config_model
        for name in model.model_fields:
            if name in {
                "secret",
                "password",
                "token",
                "session",
                "secret_access_key",
                "service_account_json",
                "connection_string",
            }:
                assert name in model.sensitive_fields(), f"{name} must be sensitive"
