"""A real AWS API on 127.0.0.1 (moto's server) and helpers to set up and read back.

Shared by the AWS integration tests and the end-to-end test: the server runs in a
thread of the test process, so a ``herald run`` subprocess reaches it too.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import boto3
import pytest
from moto.kinesis.models import Shard
from moto.server import ThreadedMotoServer

from herald.model import Event

ACCOUNT = "123456789012"
REGION = "us-east-1"
# moto accepts any credentials unless IAM is enforced; these only have to look real.
ACCESS_KEY = "AKIAHERALDTEST000001"
SECRET_KEY = "herald-test-secret-key"
START_TIMEOUT = 10.0


def _serialise_kinesis_puts() -> None:
    """Make moto's Kinesis ``PutRecord`` safe when the server answers in parallel.

    moto numbers a shard's next record as "largest so far + 1" and says so
    ("not safe for concurrency"): two concurrent puts to one shard get the same
    number and one record silently replaces the other. Herald puts records
    concurrently, as it should against the real service, so the test server
    must not lose them. Idempotent: wraps the method once per process.
    """
    if getattr(Shard.put_record, "_herald_locked", False):
        return
    unlocked = Shard.put_record
    lock = threading.Lock()

    def put_record(self: Shard, partition_key: str, data: str, explicit_hash_key: str) -> str:
        with lock:
            return unlocked(self, partition_key, data, explicit_hash_key)

    put_record._herald_locked = True  # type: ignore[attr-defined]
    Shard.put_record = put_record  # type: ignore[method-assign]


def closed_port() -> int:
    """A port on 127.0.0.1 where nothing listens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class MotoServer:
    """moto's server on a kernel-chosen 127.0.0.1 port, with its control API."""

    def __init__(self) -> None:
        _serialise_kinesis_puts()
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.port = 0
        self._clients: dict[tuple[str, ...], Any] = {}

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> MotoServer:
        # One line per request on stderr drowns test output.
        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        # ThreadedMotoServer.start() waits without a timeout: bound it from outside.
        starter = threading.Thread(target=self._server.start, daemon=True)
        starter.start()
        starter.join(START_TIMEOUT)
        if starter.is_alive():
            raise RuntimeError(f"moto server not up within {START_TIMEOUT} s")
        self.port = self._server.get_host_and_port()[1]
        return self

    def stop(self) -> None:
        self._server.stop()

    def _control(self, path: str, body: bytes = b"") -> Any:
        req = urllib.request.Request(
            self.endpoint + path, data=body, method="POST", headers={"Content-Type": "text/plain"}
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read() or b"null")

    def reset(self) -> None:
        """Wipe every resource (queues, streams, buckets, buses, IAM users)."""
        self._control("/moto-api/reset")

    @contextmanager
    def iam_enforced(self) -> Iterator[None]:
        """Check signatures and IAM policies, as AWS does, inside the block."""
        self._control("/moto-api/reset-auth", b"0")
        try:
            yield
        finally:
            self._control("/moto-api/reset-auth", b"inf")

    def client(
        self,
        service: str,
        *,
        region: str = REGION,
        key: str = ACCESS_KEY,
        secret: str = SECRET_KEY,
    ) -> Any:
        """A plain boto3 client against the server, for setup and read-back."""
        # Building a client loads its service model (up to a second for S3): keep them.
        cache_key = (service, region, key, secret)
        if cache_key not in self._clients:
            self._clients[cache_key] = boto3.client(
                service,
                endpoint_url=self.endpoint,
                region_name=region,
                aws_access_key_id=key,
                aws_secret_access_key=secret,
            )
        return self._clients[cache_key]

    def iam_user(self, name: str, actions: list[str]) -> tuple[str, str]:
        """Create a user allowed exactly ``actions`` (none: no policy); its key and secret."""
        iam = self.client("iam")
        iam.create_user(UserName=name)
        if actions:
            policy = {
                "Version": "2012-10-17",
                "Statement": [{"Effect": "Allow", "Action": actions, "Resource": "*"}],
            }
            iam.put_user_policy(
                UserName=name, PolicyName="herald", PolicyDocument=json.dumps(policy)
            )
        key = iam.create_access_key(UserName=name)["AccessKey"]
        return str(key["AccessKeyId"]), str(key["SecretAccessKey"])


def isolate_aws_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hide the host's AWS settings, so a test (and its subprocesses) sees only its own.

    The instance-metadata lookup is off (no probe of 169.254.169.254) and the
    shared config and credentials files point nowhere.
    """
    for key in list(os.environ):
        if key.upper().startswith("AWS_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)


# --- read-back -----------------------------------------------------------------------------
def receive_all(sqs: Any, queue_url: str, count: int, *, timeout: float = 15.0) -> list[Any]:
    """Receive ``count`` messages (or fail after ``timeout``), with all attributes."""
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(got) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"only {len(got)} of {count} messages in {queue_url}")
        resp = sqs.receive_message(
            QueueUrl=queue_url,
            MaxNumberOfMessages=10,
            MessageAttributeNames=["All"],
            MessageSystemAttributeNames=["All"],
            VisibilityTimeout=600,
            WaitTimeSeconds=0,
        )
        got.extend(resp.get("Messages", []))
        if not resp.get("Messages"):
            time.sleep(0.05)
    return got


def kinesis_records(kinesis: Any, stream: str) -> list[Any]:
    """Every record in every shard of ``stream``, oldest first per shard."""
    records: list[Any] = []
    for shard in kinesis.list_shards(StreamName=stream)["Shards"]:
        iterator = kinesis.get_shard_iterator(
            StreamName=stream, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        records.extend(kinesis.get_records(ShardIterator=iterator, Limit=10_000)["Records"])
    return records


def s3_objects(s3: Any, bucket: str) -> list[dict[str, Any]]:
    """Every object in ``bucket`` as listed (Key, StorageClass, …)."""
    out: list[dict[str, Any]] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        out.extend(page.get("Contents", []))
    return out


def eventbridge_to_queue(
    moto: MotoServer, bus: str, *, source: str = "herald", region: str = REGION
) -> str:
    """Create ``bus`` and a rule routing every event from ``source`` on it to a new queue."""
    events = moto.client("events", region=region)
    sqs = moto.client("sqs", region=region)
    events.create_event_bus(Name=bus)
    queue_url = str(sqs.create_queue(QueueName=f"{bus}-target")["QueueUrl"])
    arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])
    events.put_rule(
        Name=f"{bus}-all",
        EventBusName=bus,
        EventPattern=json.dumps({"source": [source]}),
        State="ENABLED",
    )
    events.put_targets(
        Rule=f"{bus}-all",
        EventBusName=bus,
        Targets=[{"Id": "queue", "Arn": arn["Attributes"]["QueueArn"]}],
    )
    return queue_url


def sqs_metadata(message: dict[str, Any]) -> dict[str, str]:
    """The event metadata an SQS message carries as String attributes."""
    attrs = message.get("MessageAttributes", {})
    assert all(a["DataType"] == "String" for a in attrs.values()), attrs
    return {name: str(a["StringValue"]) for name, a in attrs.items()}


def envelope_of(event: Event) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(event.envelope())
    return parsed
