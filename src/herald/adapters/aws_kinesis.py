"""``aws_kinesis`` (spec alias ``cloudA_kinesis``): one PutRecord per event.

The record's data is the envelope and its partition key the event id, which
spreads events evenly over the shards; for an ordered destination (``ordering =
"key"``) an event with an ordering key goes under that key instead, so one key's
records land on one shard in the order Herald delivers them. A record has no attributes, so the
metadata travels only inside the envelope (``id``, ``type``, ``created_at``);
the tenant is implied by the stream, which belongs to one tenant's destination.
IAM: ``kinesis:PutRecord``.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from pydantic import Field

from herald.adapters.aws import AWSAdapter, KeySecretConfig, Region
from herald.adapters.base import TARGET, checked, matching
from herald.model import Destination, Event

MAX_PARTITION_KEY = 256
_STREAM_NAME = re.compile(r"[a-zA-Z0-9_.-]{1,128}", re.ASCII)


def partition_key(dest: Destination, event: Event) -> str:
    """The event's ordering key when ``dest`` is ordered and the event has one, else its
    id. Kinesis takes 1 to 256 Unicode characters: an ordering key is at most 255, and a
    longer one (never stored) would go as its SHA-256, still one key per shard."""
    key = event.ordering_key
    if dest.ordering != "key" or not key:
        return event.id
    return key if len(key) <= MAX_PARTITION_KEY else hashlib.sha256(key.encode()).hexdigest()


class KinesisConfig(KeySecretConfig):
    stream_name: str = Field(description="stream name", json_schema_extra=TARGET)
    region: Region = Field(json_schema_extra=TARGET)

    _stream_name = checked(
        "stream_name", matching(_STREAM_NAME, "must be 1 to 128 letters, digits, '_', '.' or '-'")
    )


class KinesisAdapter(AWSAdapter, service="kinesis", operation="put_record"):
    type_id = "aws_kinesis"
    config_model = KinesisConfig

    def params(self, dest: Destination, config: KinesisConfig, event: Event) -> dict[str, Any]:
        return {
            "StreamName": config.stream_name,
            "Data": event.envelope(),
            "PartitionKey": partition_key(dest, event),
        }
