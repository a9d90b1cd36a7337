"""``aws_sqs`` (spec alias ``cloudA_sqs``): one SendMessage per event.

The body is the envelope; ``event-id``, ``event-type``, ``event-created-at`` and
``tenant-id`` travel as String message attributes. A FIFO queue (name ending in
``.fifo``) refuses a message without a group, so every message to one gets
MessageGroupId = the event's ordering key, or the destination id when the event
has none, and MessageDeduplicationId = event id, so a resend within SQS's
five-minute window is dropped by the queue itself — whether the destination is
ordered or not (docs/destinations.md, "Ordering per destination type"). Requests are signed for the
region named in the queue URL; a URL without one (an emulator's, say) uses the
environment's default region, else us-east-1. IAM: ``sqs:SendMessage``.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from herald.adapters.aws import AWSAdapter, KeySecretConfig
from herald.adapters.base import TARGET
from herald.model import Destination, Event

# Hosts under these domains are AWS's own; a region-shaped label in them is the region.
_AWS_DOMAINS = (".amazonaws.com", ".amazonaws.com.cn", ".api.aws")
_REGION_LABEL = re.compile(r"[a-z]{2}(?:-[a-z]+)+-\d+", re.ASCII)
# SQS allows alphanumerics and punctuation, at most 128, in FIFO group and dedup ids.
_FIFO_ID = re.compile(r"[!-~]{1,128}", re.ASCII)


def region_from_queue_url(url: str) -> str | None:
    """The region in an SQS queue URL, if it names one.

    Knows ``sqs.REGION.amazonaws.com``, the legacy ``REGION.queue.amazonaws.com``
    and ``queue.amazonaws.com`` (us-east-1), China, FIPS, dual-stack and VPC
    endpoint hosts, and any host with ``sqs.REGION.`` in it (e.g. LocalStack).
    """
    host = (urlsplit(url).hostname or "").lower()
    if host == "queue.amazonaws.com":
        return "us-east-1"
    labels = host.split(".")
    for i, label in enumerate(labels):
        if _REGION_LABEL.fullmatch(label) and (
            host.endswith(_AWS_DOMAINS) or (i > 0 and labels[i - 1] in ("sqs", "sqs-fips"))
        ):
            return label
    return None


def fifo_id(value: str) -> str:
    """``value`` as a FIFO group or deduplication id; hashed when SQS would refuse it."""
    if _FIFO_ID.fullmatch(value):
        return value
    return hashlib.sha256(value.encode()).hexdigest()


class SQSConfig(KeySecretConfig):
    queue_url: str = Field(description="full queue URL", json_schema_extra=TARGET)

    @field_validator("queue_url")
    @classmethod
    def _queue_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                "must be a full queue URL, e.g. https://sqs.REGION.amazonaws.com/ACCOUNT/NAME"
            )
        if not parts.path.strip("/"):
            raise ValueError("must end with the queue name, e.g. …/123456789012/orders")
        return value

    @property
    def fifo(self) -> bool:
        return self.queue_url.rstrip("/").endswith(".fifo")

    def region_name(self) -> str | None:
        return region_from_queue_url(self.queue_url)


class SQSAdapter(AWSAdapter, service="sqs", operation="send_message"):
    type_id = "aws_sqs"
    config_model = SQSConfig

    def params(self, dest: Destination, config: SQSConfig, event: Event) -> dict[str, Any]:
        params: dict[str, Any] = {
            "QueueUrl": config.queue_url,
            "MessageBody": event.envelope().decode(),
            "MessageAttributes": {
                name: {"DataType": "String", "StringValue": value}
                for name, value in event.metadata().items()
            },
        }
        if config.fifo:
            params["MessageGroupId"] = fifo_id(event.ordering_key or dest.id)
            params["MessageDeduplicationId"] = fifo_id(event.id)
        return params
