"""Security, proven end to end: secrets at rest, secrets in logs and answers, key
rotation, the webhook egress guard (SSRF) through `herald run` and the API, and a
send-time refusal when DNS changes after a destination was created."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import ipaddress
import json
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult
from standardwebhooks.webhooks import Webhook

import herald.egress
from herald.adapters.base import AdapterContext
from herald.adapters.registry import Registry
from herald.config import Settings, load_settings
from herald.crypto import SecretBox, generate_key, parse_key
from herald.egress import EgressPolicy
from herald.errors import CryptoError
from herald.ids import new_id
from herald.model import Destination, DestinationStatus, Event, Outcome
from herald.store import make_store
from tests.e2e.conftest import SECRET, HeraldFactory
from tests.e2e.test_api import DESTS, OTHER_SECRET, hook
from tests.e2e.test_delivery import wait_active
from tests.support.api import error_of, open_api, wait_status
from tests.support.daemon import Herald
from tests.support.receiver import Received, Receiver, verification_ok_then

pytestmark = pytest.mark.e2e

# Credentials of several destination types, each distinctive enough to grep for.
HEADER_TOKEN = "tok-hdr-5up3r-s3cr3t-value"
AWS_KEY = "AKIAHERALDTESTKEY0042"
AWS_SECRET = "herald/aws+secret+value+0123456789abcdefXYZ"
AWS_SESSION = "herald-session-token-value-q7w8e9"
AMQP_PASSWORD = "amqp-pa55w0rd-in-the-url"
HOOKDECK_SECRET = "hookdeck-source-secret-value-9931"
HOOKDECK_TOKEN = base64.b64encode(f"src_herald42:{HOOKDECK_SECRET}".encode()).decode()
THIRD_SECRET = "whsec_" + base64.b64encode(b"a-third-webhook-secret-32-bytes!").decode()


def needles(*secrets: str) -> list[str]:
    """Each secret, plus the forms it could leak in: the key inside ``whsec_``, and for
    the gateway token its decoded secret."""
    out: list[str] = []
    for s in secrets:
        out.append(s)
        if s.startswith("whsec_"):
            out.append(s.removeprefix("whsec_"))
    if HOOKDECK_TOKEN in secrets:
        out.append(HOOKDECK_SECRET)
    return out


ALL_CREDENTIALS = needles(
    SECRET,
    OTHER_SECRET,
    THIRD_SECRET,
    HEADER_TOKEN,
    AWS_KEY,
    AWS_SECRET,
    AWS_SESSION,
    AMQP_PASSWORD,
    HOOKDECK_TOKEN,
)


def credentialed_destinations(receiver_url: str) -> list[dict[str, Any]]:
    """One destination of each kind of credential Herald encrypts."""
    return [
        hook(
            receiver_url,
            name="signed",
            events=["ok.*", "fail.*"],
            secret=SECRET,
            custom_headers=json.dumps({"Authorization": f"Bearer {HEADER_TOKEN}"}),
        ),
        {
            "name": "queue",
            "type": "aws_sqs",
            "aws_sqs": {
                "queue_url": "http://127.0.0.1:9/000000000000/herald",
                "endpoint_url": "http://127.0.0.1:9",
                "key": AWS_KEY,
                "secret": AWS_SECRET,
                "session": AWS_SESSION,
            },
            "events": ["aws.*"],
        },
        {
            "name": "broker",
            "type": "rabbitmq",
            "rabbitmq": {
                "server_url": f"amqp://herald:{AMQP_PASSWORD}@127.0.0.1:5672/",
                "exchange": "herald-security-test",
            },
            "events": ["amqp.*"],
        },
        {
            "name": "gateway",
            "type": "hookdeck",
            "hookdeck": {"token": HOOKDECK_TOKEN, "endpoint_url": receiver_url},
            "events": ["gw.*"],
        },
    ]


def find_leaks(haystack: bytes | str, what: str) -> list[str]:
    text = haystack if isinstance(haystack, str) else haystack.decode("latin-1")
    return [f"{n!r} in {what}" for n in ALL_CREDENTIALS if n in text]


# --- credentials at rest ----------------------------------------------------------------


def raw_database(h: Herald) -> dict[str, bytes]:
    """Everything Herald stored, as the bytes an attacker with the database would read:
    the SQLite files (with the WAL), or every row of every Herald table on PostgreSQL."""
    if h.backend == "sqlite":
        files = [h.db_path, *(h.db_path.with_name(h.db_path.name + s) for s in ("-wal", "-shm"))]
        return {p.name: p.read_bytes() for p in files if p.exists()}
    tables = [
        r[0]
        for r in h.query(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
            " AND tablename LIKE 'herald_%'"
        )
    ]
    return {
        t: "\n".join(str(r[0]) for r in h.query(f"SELECT t::text FROM {t} t")).encode()
        for t in tables
    }


async def test_credentials_and_api_keys_are_not_in_clear_in_the_database(
    herald_factory: HeraldFactory, receiver: Receiver
) -> None:
    h = herald_factory()
    async with open_api(h, "acme") as api:
        api_key = api.key
        assert api_key is not None
        for body in credentialed_destinations(receiver.url):
            status, _, created = await api.post(DESTS, json=body)
            assert status == 201, created
        signed = (await api.get(DESTS, params={"type": "webhook"}))[2]["data"][0]
        await wait_status(api, signed["id"], "active")
        # Rotation keeps the previous secret for 24 h: it is stored too.
        status, _, _ = await api.post(
            f"{DESTS}/{signed['id']}/rotate-secret", json={"secret": OTHER_SECRET}
        )
        assert status == 200
        status, _, _ = await api.patch(
            f"{DESTS}/{signed['id']}", json={"webhook": {"secret": THIRD_SECRET}}
        )
        assert status == 200

    def check(when: str) -> None:
        raw = raw_database(h)
        leaks = [leak for name, data in raw.items() for leak in find_leaks(data, f"{name} {when}")]
        assert not leaks, leaks
        everything = b"".join(raw.values())
        # The scan does see the stored rows: non-secret fields are there in clear...
        assert receiver.url.encode() in everything, when
        assert b"herald-security-test" in everything, when
        # ...and API keys only as their SHA-256.
        assert api_key.encode() not in everything, when
        assert hashlib.sha256(api_key.encode()).hexdigest().encode() in everything, when

    check("while running")  # recent writes sit in the WAL
    assert await h.astop() == 0
    check("after shutdown")  # checkpointed into the main file

    # What is there instead: AES-GCM tokens that open with the key, bound to their row.
    key = parse_key(
        (h.workdir / ("herald.db.key" if h.backend == "sqlite" else "herald.key")).read_text()
    )
    rows = h.query("SELECT id, secrets FROM herald_destinations")
    assert len(rows) == 4
    box = SecretBox(key)
    opened = {}
    for dest_id, token in rows:
        assert token.startswith("v1.")
        opened[dest_id] = json.loads(box.decrypt(token, aad=dest_id.encode()))
        with pytest.raises(CryptoError):
            box.decrypt(token, aad=b"evtd_another_row")
    assert {v.get("secret") for v in opened.values()} >= {THIRD_SECRET, AWS_SECRET}
    assert any(v.get("_previous_secret") in (SECRET, OTHER_SECRET) for v in opened.values())


async def test_no_credential_in_any_log_line_api_answer_or_cli_output(
    herald_factory: HeraldFactory,
) -> None:
    """A full run at debug level: create (and fail to create) destinations with
    credentials, deliver, fail deliveries, test, rotate, update, list, show, delete."""
    h = herald_factory({"log": {"level": "debug"}, "delivery": {"max_retries": 1}})
    seen: list[tuple[str, bytes]] = []
    bad: list[int] = []

    def ok_or_fail(item: Received) -> web.StreamResponse:
        if item.type.startswith("fail."):
            return web.Response(status=503, text="unavailable: try again")
        return web.Response(status=204)

    receiver = await Receiver(secrets=[SECRET], behaviour=verification_ok_then(ok_or_fail)).start()
    try:
        async with open_api(h, "acme") as api:

            async def call(method: str, path: str, **kwargs: Any) -> Any:
                status, _, raw = await api.raw(method, path, **kwargs)
                seen.append((f"{method} {path} -> {status}", raw))
                assert status < 500, raw
                body = json.loads(raw) if raw else None
                if status >= 400:
                    error_of(body)
                    bad.append(status)
                return body

            created = []
            for body in credentialed_destinations(receiver.url):
                again = {"Idempotency-Key": body["name"]}
                created.append(await call("POST", DESTS, json=body, headers=again))
                await call("POST", DESTS, json=body, headers=again)  # a replayed answer
            assert bad == []
            signed = created[0]
            await wait_status(api, signed["id"], "active")
            # Invalid credentials are refused without being echoed.
            for invalid in (
                hook(receiver.url, secret="whsec_!!" + HEADER_TOKEN),
                hook(receiver.url, custom_headers='{"Authorization": "Bearer ' + HEADER_TOKEN),
                {
                    "name": "g",
                    "type": "hookdeck",
                    "hookdeck": {"token": HOOKDECK_SECRET + "!"},
                    "events": ["*"],
                },
                {
                    "name": "b",
                    "type": "rabbitmq",
                    "rabbitmq": {"server_url": f"ftp://u:{AMQP_PASSWORD}@h/", "exchange": "x"},
                    "events": ["*"],
                },
                {
                    "name": "q",
                    "type": "aws_sqs",
                    "aws_sqs": {"queue_url": "http://127.0.0.1:9/1/q", "secret": AWS_SECRET},
                    "events": ["*"],
                },
            ):
                await call("POST", DESTS, json=invalid)
            assert len(bad) == 5
            for i in range(5):
                await call("POST", "/v2/events", json={"type": "ok.done", "data": {"i": i}})
            for prefix in ("fail", "aws", "amqp", "gw"):
                await call("POST", "/v2/events", json={"type": f"{prefix}.x", "data": {}})
            await receiver.wait_for(
                lambda: (
                    len(receiver.events("ok.done")) == 5 and len(receiver.events("fail.x")) == 2
                ),
                what="deliveries and the failing ones' retry",
            )
            path = f"{DESTS}/{signed['id']}"
            await call("POST", f"{path}/test")
            await call("POST", f"{path}/rotate-secret", json={"secret": OTHER_SECRET})
            generated = await call("POST", f"{path}/rotate-secret")
            seen.pop()  # the one answer that shows a generated secret, once, by design
            await call("PATCH", path, json={"webhook": {"secret": THIRD_SECRET}})
            await call("PATCH", path, json={"name": "renamed"})
            for d in created:
                await call("GET", f"{DESTS}/{d['id']}")
                listing = await call("GET", f"{DESTS}/{d['id']}/event-deliveries")
                for delivery in listing["data"]:
                    await call("GET", f"/v2/event-deliveries/{delivery['id']}")
            await call("GET", DESTS)
            await call("POST", f"{path}/replay", json={"dry_run": True})
        for args in (
            ("destinations", "list", "--tenant", "acme", "--json"),
            ("destinations", "show", signed["id"], "--tenant", "acme", "--json"),
            ("destinations", "show", created[1]["id"], "--tenant", "acme"),
            ("deliveries", "list", "--tenant", "acme", "--json"),
            ("check-config",),
        ):
            # check-config exits 1 beside its own running daemon (the port is taken);
            # what it prints is what is checked here.
            proc = await h.acli(*args, check=args[0] != "check-config")
            seen.append((f"herald {' '.join(args)}", (proc.stdout + proc.stderr).encode()))
        await asyncio.sleep(0.5)  # the AMQP and SQS attempts have failed and been logged
        assert await h.astop() == 0
    finally:
        await receiver.stop()
    log = h.log()
    assert "attempt_failed" in log  # the failures were logged, with their errors
    assert '"level": "debug"' in log or '"level":"debug"' in log
    leaks = find_leaks(log, "the log")
    leaks += [leak for what, raw in seen for leak in find_leaks(raw, what)]
    secret = generated["secret"]
    leaks += [f"generated secret in {what}" for what, raw in seen if secret.encode() in raw]
    if secret in log or secret.removeprefix("whsec_") in log:
        leaks.append("generated secret in the log")
    assert not leaks, leaks
    assert len(seen) > 40


# --- rotating the encryption key -------------------------------------------------------------


def secrets_column(h: Herald) -> dict[str, str]:
    return {r[0]: r[1] for r in h.query("SELECT id, secrets FROM herald_destinations") if r[1]}


def under(key: bytes, rows: dict[str, str]) -> set[str]:
    """The ids whose token opens with ``key``."""
    box = SecretBox(key)
    out = set()
    for dest_id, token in rows.items():
        try:
            box.decrypt(token, aad=dest_id.encode())
        except CryptoError:
            continue
        out.add(dest_id)
    return out


def set_keys(h: Herald, current: str, previous: list[str]) -> None:
    """Point the daemon's config at ``current`` (and ``previous``) instead of its key file."""
    lines = [
        line
        for line in h.config_path.read_text().splitlines()
        if not line.startswith(("encryption_key", "previous_encryption_keys"))
    ]
    at = lines.index("[security]") + 1
    lines[at:at] = [
        f'encryption_key = "{current}"',
        f"previous_encryption_keys = {json.dumps(previous)}",
    ]
    h.config_path.write_text("\n".join(lines) + "\n")


async def test_rotate_encryption_key_end_to_end(
    herald_factory: HeraldFactory, receiver: Receiver
) -> None:
    old, new = generate_key(), generate_key()
    h = herald_factory(start=False)
    set_keys(h, old, [])
    await h.astart()
    signed = await h.acreate_webhook(receiver.url, secret=SECRET, name="signed")
    await wait_active(h, signed["id"])
    await h.acli("destinations", "rotate-secret", signed["id"], "--secret", OTHER_SECRET)
    for name in ("plain", "doomed"):
        await h.acreate_webhook("http://127.0.0.1:9/hook", secret=THIRD_SECRET, name=name)
    doomed = [
        d for d in (await h.acli_json("destinations", "list"))["data"] if d["name"] == "doomed"
    ]
    await h.acli("destinations", "delete", doomed[0]["id"])
    assert await h.astop() == 0
    rows = secrets_column(h)
    assert len(rows) == 3  # the deleted destination's credentials are re-encrypted too
    assert under(parse_key(old), rows) == set(rows)

    # A bad new key is bad usage, and is not echoed.
    proc = await h.acli("keys", "rotate-encryption", "--new-key", "c2hvcnQta2V5", check=False)
    assert proc.returncode == 2
    assert "--new-key" in proc.stderr
    assert "c2hvcnQta2V5" not in proc.stderr
    key_file = h.workdir / "new.key"
    key_file.write_text(new + "\n")
    proc = await h.acli(
        "keys", "rotate-encryption", "--new-key-file", str(key_file), "--batch-size", "2", "--json"
    )
    assert json.loads(proc.stdout) == {
        "object": "key_rotation",
        "destinations": 3,
        "reencrypted": 3,
    }
    assert "previous_encryption_keys" in proc.stderr  # what to do next
    assert old not in proc.stdout + proc.stderr
    assert new not in proc.stdout + proc.stderr
    rows = secrets_column(h)
    assert under(parse_key(new), rows) == set(rows)
    assert under(parse_key(old), rows) == set()
    # Run again: nothing left to do.
    proc = await h.acli("keys", "rotate-encryption", "--new-key-file", str(key_file), "--json")
    assert json.loads(proc.stdout)["reencrypted"] == 0

    # The old key alone no longer opens the credentials: a clear refusal to start.
    proc = await h.acli("run", check=False)
    assert proc.returncode == 1, proc.stderr
    assert "could not be decrypted" in proc.stderr
    # The new key alone does, and the rotated secrets sign deliveries as before.
    set_keys(h, new, [])
    await h.astart()
    h.insert_events([("evt_after_rotation", "default", "a.b", "{}")])
    await receiver.wait_for(lambda: "evt_after_rotation" in receiver.counts(), what="delivery")
    got = receiver.events("a.b")[0]
    Webhook(SECRET).verify(got.body, got.headers)  # the previous secret, still in its window
    Webhook(OTHER_SECRET).verify(got.body, got.headers)
    assert await h.astop() == 0


async def _seed_destinations(h: Herald, key: str, n: int) -> None:
    """``n`` destinations with credentials, written straight through the store."""
    settings = load_settings(h.config_path)
    store = make_store(settings, SecretBox(parse_key(key)))
    await store.open()
    try:
        now = time.time()
        for i in range(n):
            await store.create_destination(
                Destination(
                    id=new_id("evtd_"),
                    tenant_id="default",
                    name=f"d{i}",
                    type="webhook",
                    config={"url": f"http://127.0.0.1:9/{i}"},
                    secrets={"secret": SECRET},
                    events=("*",),
                    status=DestinationStatus.INACTIVE,
                    created_at=now,
                    updated_at=now,
                ),
                verification=None,
            )
    finally:
        await store.close()


async def test_an_interrupted_rotation_leaves_every_row_readable_and_a_rerun_finishes(
    herald_factory: HeraldFactory,
) -> None:
    old, new = generate_key(), generate_key()
    n = 400
    h = herald_factory(start=False)
    set_keys(h, old, [])
    await h.acli("migrate")
    await _seed_destinations(h, old, n)
    # One row per transaction; killed as soon as the first batch reports.
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "herald",
        "keys",
        "rotate-encryption",
        # `=`: a URL-safe base64 key starts with "-" one time in 64, which argparse would
        # take for an option.
        f"--new-key={new}",
        "--batch-size",
        "1",
        "--config",
        str(h.config_path),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        cwd=h.workdir,
    )
    assert proc.stderr is not None
    stderr = proc.stderr

    seen: list[bytes] = []

    async def first_progress_line() -> bytes:
        async for line in stderr:
            seen.append(line)
            if line.startswith(b"re-encrypted"):
                return line
        return b""

    first = await asyncio.wait_for(first_progress_line(), 60)
    proc.kill()
    await asyncio.wait_for(proc.wait(), 10)
    assert first.startswith(b"re-encrypted 1 of 1"), (proc.returncode, b"".join(seen)[-2000:])
    rows = secrets_column(h)
    assert len(rows) == n
    done, pending = under(parse_key(new), rows), under(parse_key(old), rows)
    # Halfway: every row opens with exactly one of the two keys.
    assert done | pending == set(rows)
    assert not done & pending
    assert 1 <= len(done) < n, len(done)

    # Both keys configured: the daemon reads every row.
    set_keys(h, new, [old])
    await h.astart()
    async with open_api(h, "default") as api:
        listed = await api.pages(DESTS, {"limit": 100})
    assert len(listed) == n
    assert await h.astop() == 0
    # Running it again finishes the job, and then the new key alone is enough.
    proc2 = await h.acli("keys", "rotate-encryption", f"--new-key={new}", "--json")
    assert json.loads(proc2.stdout) == {
        "object": "key_rotation",
        "destinations": n,
        "reencrypted": len(pending),
    }
    assert under(parse_key(new), secrets_column(h)) == set(rows)
    set_keys(h, new, [])
    await h.astart()
    assert h.get("/readyz")[0] == 200


@pytest.mark.sqlite_only
async def test_rotation_refuses_to_run_beside_a_running_daemon(
    herald_factory: HeraldFactory,
) -> None:
    h = herald_factory()
    await h.acreate_webhook("http://127.0.0.1:9/hook", secret=SECRET)
    before = secrets_column(h)
    proc = await h.acli("keys", "rotate-encryption", f"--new-key={generate_key()}", check=False)
    assert proc.returncode == 1
    assert "stop it before rotating" in proc.stderr
    assert secrets_column(h) == before


# --- webhook egress (SSRF) through `herald run` ------------------------------------------

REFUSED = [
    "http://127.0.0.1/",
    "http://[::1]/",
    "http://[::ffff:127.0.0.1]/",
    "http://169.254.169.254/latest/meta-data/",
    "http://10.0.0.1/",
    "http://localhost:8080/",
    "http://2130706433/",
    "http://0x7f.0.0.1/",
    "http://[::ffff:a9fe:a9fe]/",  # the metadata address, IPv4-mapped
    "http://[fd00:ec2::254]/",  # AWS's IPv6 metadata address
    "http://192.168.0.1/",
    "http://100.64.0.1/",
]


@pytest.fixture
def strict_herald(tmp_path: Path) -> Iterator[Herald]:
    """A daemon with the egress guard on, allowing only 127.0.0.0/8 (where test receivers
    live). Egress does not depend on the database, so this runs on SQLite only."""
    h = Herald(
        tmp_path,
        {"security": {"allow_private_networks": False, "allowed_networks": ["127.0.0.0/8"]}},
    )
    yield h.start()
    if h.proc is not None and h.proc.poll() is None:
        h.kill()


ENDPOINT_BODIES: dict[str, dict[str, str]] = {
    "aws_sqs": {
        "queue_url": "https://sqs.us-east-1.amazonaws.com/123456789012/q",
        "endpoint_url": "http://169.254.169.254/",
    },
    "gcp_pubsub": {"project_id": "my-project", "topic": "events", "endpoint_url": "10.0.0.1:8085"},
    "azure_servicebus": {
        "name": "q",
        "connection_string": (
            "Endpoint=sb://ns.servicebus.windows.net/;"
            "SharedAccessKeyName=send;SharedAccessKey=c2VjcmV0"
        ),
        "endpoint_url": "sb://127.0.0.1:5672",
    },
    "hookdeck": {"token": "c3JjXzE6c2VjcmV0", "endpoint_url": "http://[::1]:8080"},
}


async def test_private_targets_are_refused_at_create_naming_webhook_url(tmp_path: Path) -> None:
    h = Herald(tmp_path, {"security": {"allow_private_networks": False}})
    await h.astart()
    try:
        async with open_api(h, "acme") as api:
            for url in REFUSED:
                status, _, body = await api.post(DESTS, json=hook(url))
                assert status == 422, (url, body)
                item = error_of(body)
                assert (item["code"], item.get("field")) == ("url_not_allowed", "webhook.url"), url
                assert "egress denied" in item["message"], url
            # Every type's endpoint_url is held to the same rules.
            for type_, fields in ENDPOINT_BODIES.items():
                body = {"name": type_, "type": type_, "events": ["*"], type_: fields}
                status, _, answer = await api.post(DESTS, json=body)
                assert status == 422, (type_, answer)
                item = error_of(answer)
                assert (item["code"], item.get("field")) == (
                    "url_not_allowed",
                    f"{type_}.endpoint_url",
                ), answer
            assert (await api.get(DESTS))[2]["data"] == []
        proc = await h.acli(
            "destinations", "create", "--data", json.dumps(hook(REFUSED[3])), check=False
        )
        assert proc.returncode == 2
        assert "webhook.url" in proc.stderr
    finally:
        await h.astop()


async def test_allowed_networks_let_exactly_that_cidr_through(strict_herald: Herald) -> None:
    h = strict_herald

    def redirect_to_metadata(item: Received) -> web.StreamResponse:
        return web.Response(
            status=302, headers={"Location": "http://169.254.169.254/latest/meta-data/"}
        )

    r = await Receiver(
        secrets=[SECRET], behaviour=verification_ok_then(redirect_to_metadata)
    ).start()
    try:
        async with open_api(h, "acme") as api:
            status, _, dest = await api.post(DESTS, json=hook(r.url, secret=SECRET))
            assert status == 201, dest
            await wait_status(api, dest["id"], "active")
            mapped = f"http://[::ffff:127.0.0.1]:{r.port}/mapped"
            status, _, body = await api.post(DESTS, json=hook(mapped))
            assert status == 201, body  # the IPv4-mapped form of an allowed address
            for url in ("http://[::1]/", "http://10.0.0.1/", "http://169.254.169.254/"):
                status, _, body = await api.post(DESTS, json=hook(url))
                assert (status, error_of(body)["code"]) == (422, "url_not_allowed"), url
            status, _, body = await api.patch(
                f"{DESTS}/{dest['id']}", json={"webhook": {"url": "http://169.254.169.254/"}}
            )
            assert (status, error_of(body).get("field")) == (422, "webhook.url")
            # A redirect towards the metadata service is not followed.
            status, _, tested = await api.post(f"{DESTS}/{dest['id']}/test")
            assert status == 200, tested
            [attempt] = tested["attempts"]
            assert (attempt["outcome"], attempt["response_status"]) == ("failure_permanent", 302)
            assert "redirects are not followed" in attempt["error"]
            assert (await api.get(f"{DESTS}/{dest['id']}"))[2]["webhook"]["url"] == r.url
        on_hook = [x.type for x in r.received if x.path == "/hook"]
        assert on_hook == ["destination.verification", "test.ping"]
    finally:
        await r.stop()


class FakeDNS(AbstractResolver):
    """A resolver whose answers the test changes between calls, standing in for DNS both
    at create time (``loop.getaddrinfo``) and at send time (aiohttp's resolver)."""

    def __init__(self) -> None:
        self.answers: dict[str, list[str]] = {}
        self.asked: list[str] = []

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        self.asked.append(host)
        return [
            ResolveResult(
                hostname=host,
                host=ip,
                port=port,
                family=socket.AF_INET6 if ":" in ip else socket.AF_INET,
                proto=0,
                flags=socket.AI_NUMERICHOST,
            )
            for ip in self.answers.get(host, [])
        ]

    async def getaddrinfo(self, host: str, port: Any, **_: Any) -> list[Any]:
        self.asked.append(host)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, 0)) for ip in self.answers[host]]

    async def close(self) -> None:
        pass


async def test_a_dns_change_after_creation_is_refused_at_send_time(
    monkeypatch: pytest.MonkeyPatch, receiver: Receiver
) -> None:
    dns = FakeDNS()
    monkeypatch.setattr(herald.egress, "ThreadedResolver", lambda: dns)
    monkeypatch.setattr(asyncio.get_running_loop(), "getaddrinfo", dns.getaddrinfo)
    name = "hooks.rebind.example"
    url = f"http://{name}:{receiver.port}/hook"
    event = Event(new_id("evt_"), "default", "a.b", "2026-01-01T00:00:00Z", time.time(), b"{}")
    now = time.time()
    dest = Destination(
        new_id("evtd_"),
        "default",
        "d",
        "webhook",
        {"url": url},
        {},
        ("*",),
        DestinationStatus.ACTIVE,
        now,
        now,
    )

    async def attempt(policy: EgressPolicy) -> Any:
        registry = Registry(AdapterContext(settings=Settings(), egress=policy))
        try:
            adapter = registry.get("webhook")
            config = registry.parse_config("webhook", {"url": url})
            dns.answers[name] = ["93.184.216.34"]  # public when the destination is created
            await adapter.check(config, tenant_id="default")
            dns.answers[name] = ["127.0.0.1"]  # and private by the time it is used
            return await asyncio.wait_for(adapter.deliver(dest, config, event), 10)
        finally:
            await registry.close()

    result = await attempt(EgressPolicy())
    assert result.outcome is Outcome.FAILURE_PERMANENT
    assert result.error is not None
    assert "egress denied" in result.error
    assert "127.0.0.1" in result.error
    assert dns.asked.count(name) == 2  # checked at create time, and again at send time
    await asyncio.sleep(0.1)
    assert receiver.received == []  # nothing was sent
    # The same path with 127.0.0.0/8 allowed does connect: the refusal was the guard's.
    allowed = EgressPolicy(allowed_networks=(ipaddress.ip_network("127.0.0.0/8"),))
    assert (await attempt(allowed)).outcome is Outcome.SUCCESS
    assert [r.event_id for r in receiver.received] == [event.id]
