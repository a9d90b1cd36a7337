"""``aws_s3`` (spec alias ``cloudA_s3``): one PutObject per event.

The object is the envelope, ``application/json``, under the key
``{created_at with nine fractional digits}_{event id}.json`` — keys sort by
event time, and a resend of the same event overwrites its own object. The
metadata travels as user metadata (``x-amz-meta-event-id`` …; values that are
not plain ASCII are RFC 2047 encoded, as S3 requires). ``storage_class`` may be
any class botocore's S3 model lists for PutObject; another value is refused when
the destination is created. IAM: ``s3:PutObject`` on ``arn:aws:s3:::BUCKET/*``.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from pydantic import Field, field_validator

from herald.adapters.aws import (
    AWSAdapter,
    KeySecretConfig,
    Region,
    header_safe,
    shared_loader,
)
from herald.adapters.base import TARGET
from herald.model import Destination, Event
from herald.timeutil import rfc3339_nano

DEFAULT_STORAGE_CLASS = "STANDARD"
# botocore's own bucket check: names, including the legacy ones us-east-1 still serves.
_BUCKET = re.compile(r"[a-zA-Z0-9.\-_]{1,255}", re.ASCII)


@functools.cache
def storage_classes() -> tuple[str, ...]:
    """The storage classes S3 accepts on PutObject, from botocore's service model."""
    model = shared_loader().load_service_model("s3", "service-2")
    return tuple(model["shapes"]["StorageClass"]["enum"])


def object_key(event: Event) -> str:
    """``{rfc3339_nano_timestamp}_{event_id}.json``, from the event's ``created_at``."""
    return f"{rfc3339_nano(event.created_at)}_{event.id}.json"


class S3Config(KeySecretConfig):
    bucket: str = Field(description="bucket name", json_schema_extra=TARGET)
    region: Region = Field(json_schema_extra=TARGET)
    # How objects are kept, not where they go: not a target, no re-verification.
    storage_class: str = DEFAULT_STORAGE_CLASS

    @field_validator("bucket")
    @classmethod
    def _bucket(cls, value: str) -> str:
        if not (_BUCKET.fullmatch(value) or value.startswith("arn:")):
            raise ValueError("must be a bucket name (letters, digits, '.', '-', '_') or an ARN")
        return value

    @field_validator("storage_class")
    @classmethod
    def _storage_class(cls, value: str) -> str:
        known = storage_classes()
        if value not in known:
            raise ValueError(f"unknown storage class {value!r}; one of {', '.join(known)}")
        return value


class S3Adapter(AWSAdapter, service="s3", operation="put_object"):
    type_id = "aws_s3"
    config_model = S3Config

    def params(self, dest: Destination, config: S3Config, event: Event) -> dict[str, Any]:
        return {
            "Bucket": config.bucket,
            "Key": object_key(event),
            "Body": event.envelope(),
            "ContentType": "application/json",
            "StorageClass": config.storage_class,
            "Metadata": {name: header_safe(value) for name, value in event.metadata().items()},
        }
