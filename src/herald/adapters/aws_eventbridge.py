"""``aws_eventbridge`` (spec alias ``cloudA_eventbridge``): one PutEvents entry per event.

``DetailType`` is the event type, ``Source`` the config key
``delivery.eventbridge_source`` (default ``herald``), ``Detail`` the envelope and
``Time`` the event's ``created_at`` (EventBridge keeps whole seconds; the exact
value is in the envelope). PutEvents answers 200 even when it drops the entry,
so an entry with an ``ErrorCode`` is a failed attempt carrying that code. The
credential fields are the spec's ``access_key_id`` / ``secret_access_key``
(there is no session-token field: temporary credentials come from the standard
chain). IAM: ``events:PutEvents`` on the bus.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any, ClassVar

from pydantic import Field

from herald.adapters.aws import AWSAdapter, AWSConfig, Region, failure, http_status
from herald.adapters.base import TARGET, Result, checked, matching, sensitive
from herald.model import Destination, Event
from herald.timeutil import parse_timestamp

# AWS's pattern for EventBusName in a PutEvents entry: a name or a bus ARN.
_BUS = re.compile(
    r"(arn:aws[\w-]*:events:[a-z]{2}-[a-z]+-[\w-]+:[0-9]{12}:event-bus/)?[/.\-_A-Za-z0-9]{1,1600}",
    re.ASCII,
)


class EventBridgeConfig(AWSConfig):
    event_bus_name: str = Field(description="bus name or ARN", json_schema_extra=TARGET)
    region: Region = Field(json_schema_extra=TARGET)
    access_key_id: str | None = Field(default=None, json_schema_extra=sensitive("access key id"))
    secret_access_key: str | None = Field(
        default=None, json_schema_extra=sensitive("secret access key")
    )

    credential_fields: ClassVar[tuple[str, str]] = ("access_key_id", "secret_access_key")

    _bus = checked(
        "event_bus_name", matching(_BUS, "must be an event bus name or an event-bus ARN")
    )


class EventBridgeAdapter(AWSAdapter, service="events", operation="put_events"):
    type_id = "aws_eventbridge"
    config_model = EventBridgeConfig

    def params(self, dest: Destination, config: EventBridgeConfig, event: Event) -> dict[str, Any]:
        entry = {
            "EventBusName": config.event_bus_name,
            "Source": self.ctx.settings.delivery.eventbridge_source,
            "DetailType": event.type,
            "Detail": event.envelope().decode(),
            # From the text, which is what receivers see everywhere else.
            "Time": dt.datetime.fromtimestamp(parse_timestamp(event.created_at).epoch, dt.UTC),
        }
        return {"Entries": [entry]}

    def outcome(self, response: dict[str, Any]) -> Result:
        # PutEvents answers 200 even when it dropped the entry.
        status = http_status(response)
        entries = response.get("Entries") or [{}]
        if (response.get("FailedEntryCount") or 0) > 0 or entries[0].get("ErrorCode"):
            entry = entries[0]
            code = str(entry.get("ErrorCode") or "FailedEntry")
            return failure(code, str(entry.get("ErrorMessage") or ""), status=status)
        return Result.success(status=status)
