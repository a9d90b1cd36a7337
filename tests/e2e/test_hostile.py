"""Hostile input against `herald run`: the API, the outbox and the config file.

Every bad input gets one clear 4xx (the API's ``errors`` shape wherever Herald's own
code answers), nothing already stored changes, and the daemon keeps serving. The
property-based parts fuzz what schemathesis does not: the cursor and Idempotency-Key
paths, and request bodies made of arbitrary JSON (NUL characters included, which
PostgreSQL cannot store), on both backends.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from herald.api.jsonbody import MAX_DEPTH
from tests.e2e.conftest import SECRET, HeraldFactory
from tests.e2e.test_api import DESTS, create, dead_url, hook
from tests.support.api import Api, base_url, error_of, open_api
from tests.support.daemon import Herald
from tests.support.receiver import Receiver

pytestmark = [pytest.mark.e2e, pytest.mark.backend_neutral]

FUZZ = settings(
    max_examples=60,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)


def error_code(body: Any) -> str:
    return str(error_of(body)["code"])


async def nothing_created(api: Api, *, destinations: int = 0) -> None:
    status, _, body = await api.get(DESTS)
    assert status == 200
    assert len(body["data"]) == destinations, body


# --- bodies ---------------------------------------------------------------------------------


@pytest.fixture
async def small_api(herald_factory: HeraldFactory) -> AsyncIterator[Api]:
    """A daemon whose request bodies are capped at 4 KiB."""
    h = herald_factory({"api": {"max_body_bytes": 4096}}, start=False)
    await h.astart()
    async with open_api(h, "acme") as client:
        yield client


async def test_bodies_over_max_body_bytes_get_413_on_every_endpoint(small_api: Api) -> None:
    api = small_api
    dest = await create(api, hook(dead_url()))
    path = f"{DESTS}/{dest['id']}"
    padding = "x" * 4096
    oversized: list[tuple[str, str, Any]] = [
        ("POST", DESTS, hook(dead_url(), name=padding)),
        ("PATCH", path, {"name": padding}),
        ("POST", f"{path}/rotate-secret", {"secret": padding}),
        ("POST", f"{path}/replay", {"event_types": [padding]}),
        ("POST", "/v2/events", {"type": "a.b", "data": {"pad": padding}}),
    ]
    for method, p, body in oversized:
        status, _, answer = await api.request(method, p, json=body)
        assert status == 413, (method, p, answer)
        assert error_code(answer) == "payload_too_large"
        assert "4096" in error_of(answer)["message"]

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"type": "a.b", "data": {"pad": "'
        for _ in range(10):
            yield b"y" * 1024
        yield b'"}}'

    # Without a Content-Length (chunked), the cap holds just the same.
    status, _, raw = await api.raw(
        "POST", "/v2/events", data=chunks(), headers={"Content-Type": "application/json"}
    )
    assert status == 413, raw
    assert error_code(json.loads(raw)) == "payload_too_large"

    # Exactly at the cap is fine.
    body = {"type": "a.b", "data": {"pad": ""}}
    room = 4096 - len(json.dumps(body))
    body["data"]["pad"] = "z" * room
    assert len(json.dumps(body)) == 4096
    status, _, answer = await api.post("/v2/events", json=body)
    assert status == 202, answer
    # Nothing oversized was stored or changed.
    _, _, listed = await api.get(DESTS)
    assert [(d["id"], d["name"]) for d in listed["data"]] == [(dest["id"], dest["name"])]


def nested(depth: int, leaf: str = "1") -> str:
    """``depth`` levels of alternating arrays and objects around ``leaf``."""
    opening = ['{"k": ' if level % 2 else "[" for level in range(depth)]
    closing = ["}" if level % 2 else "]" for level in range(depth)]
    return "".join(reversed(opening)) + leaf + "".join(closing)


async def test_deeply_nested_json_is_a_clear_400(api: Api) -> None:
    # The body object is level one, "data" level two.
    ok = f'{{"type": "a.b", "data": {{"k": {nested(MAX_DEPTH - 2)}}}}}'
    status, _, answer = await api.post("/v2/events", data=ok)
    assert status == 202, answer
    for depth in (MAX_DEPTH - 1, 300, 2000, 200_000):
        too_deep = f'{{"type": "a.b", "data": {{"k": {nested(depth)}}}}}'
        status, _, answer = await api.post("/v2/events", data=too_deep)
        assert status == 400, (depth, answer)
        assert error_code(answer) == "json_too_deep", answer
    status, _, answer = await api.post(DESTS, data="[" * 5000 + "]" * 5000)
    assert (status, error_code(answer)) == (400, "json_too_deep")
    await nothing_created(api)


INVALID_UTF8 = {
    "latin-1": b'{"name": "caf\xe9", "type": "webhook", "webhook": {"url": "http://127.0.0.1:9/"},'
    b' "events": ["*"]}',
    "overlong": b'{"name": "\xc0\xaf", "type": "webhook"}',
    "surrogate": b'{"name": "\xed\xa0\x80", "type": "webhook"}',
    "beyond U+10FFFF": b'{"name": "\xf4\x90\x80\x80", "type": "webhook"}',
    "truncated": b'{"name": "trunc\xe2\x82',
    "UTF-16": '{"type": "a.b", "data": {}}'.encode("utf-16"),
}


async def test_invalid_utf8_is_a_clear_400(api: Api) -> None:
    for what, raw in INVALID_UTF8.items():
        for path in (DESTS, "/v2/events"):
            status, _, answer = await api.post(path, data=raw)
            assert status == 400, (what, answer)
            assert error_code(answer) == "invalid_encoding", (what, answer)
            assert "UTF-8" in error_of(answer)["message"]
    await nothing_created(api)


async def test_duplicate_keys_are_a_clear_400(api: Api) -> None:
    dest = await create(api, hook(dead_url(), name="original"))
    path = f"{DESTS}/{dest['id']}"
    url = dead_url()
    cases = [
        (
            "POST",
            DESTS,
            f'{{"name": "a", "name": "b", "type": "webhook", '
            f'"webhook": {{"url": "{url}"}}, "events": ["*"]}}',
        ),
        (
            "POST",
            DESTS,
            f'{{"name": "a", "type": "webhook", "webhook": '
            f'{{"url": "{url}", "url": "http://169.254.169.254/"}}, "events": ["*"]}}',
        ),
        (
            "POST",
            DESTS,
            f'{{"name": "a", "n\\u0061me": "b", "type": "webhook", '
            f'"webhook": {{"url": "{url}"}}, "events": ["*"]}}',
        ),
        ("PATCH", path, '{"name": "x", "name": "y"}'),
        ("PATCH", path, '{"status": "inactive", "status": "active"}'),
        ("POST", "/v2/events", '{"type": "a.b", "type": "c.d", "data": {}}'),
        ("POST", "/v2/events", '{"type": "a.b", "data": {"x": [{"y": 1, "y": 2}]}}'),
        ("POST", f"{path}/replay", '{"dry_run": true, "dry_run": false}'),
    ]
    for method, p, raw in cases:
        status, _, answer = await api.request(method, p, data=raw)
        assert status == 400, (raw, answer)
        assert error_code(answer) == "duplicate_key", answer
    _, _, listed = await api.get(DESTS)
    assert [(d["name"], d["status"]) for d in listed["data"]] == [
        ("original", "pending_verification")
    ]


async def test_nul_characters_are_a_clear_400(api: Api) -> None:
    dest = await create(api, hook(dead_url()))
    cases = [
        ("POST", DESTS, hook(dead_url(), name="a\x00b")),
        ("POST", DESTS, hook("http://127.0.0.1:9/a\x00b")),
        ("PATCH", f"{DESTS}/{dest['id']}", {"name": "\x00"}),
        ("POST", "/v2/events", {"type": "a.b", "data": {"s": "x\x00y"}}),
        ("POST", "/v2/events", {"type": "a.b", "data": {"k\x00": 1}}),
    ]
    for method, p, body in cases:
        status, _, answer = await api.request(method, p, json=body)
        assert status == 400, (body, answer)
        assert error_code(answer) == "invalid_character", answer
    for p, params in (
        (f"{DESTS}/evtd_%00", None),
        ("/v2/events/evt_a%00b", None),
        (DESTS, {"type": "webhook\x00"}),
        (f"{DESTS}/{dest['id']}/event-deliveries", {"event_type": "a.b\x00"}),
    ):
        status, _, answer = await api.get(p, params=params)
        assert status == 400, (p, answer)
        assert error_code(answer) == "invalid_character", answer
    await nothing_created(api, destinations=1)


async def test_huge_and_numerous_headers_are_a_clear_4xx(api: Api, herald: Herald) -> None:
    # aiohttp's HTTP parser refuses these before any handler runs; Herald answers them
    # in the errors shape (herald.api.server), without echoing the header, and closes
    # the connection.
    cases = {
        "one huge header": ({"X-Big": "v" * 20_000}, "header_too_large"),
        "a huge API key": (
            {"Authorization": "Bearer sk_live_" + "k" * 100_000},
            "header_too_large",
        ),
        "too many headers": ({f"X-H{i}": "v" for i in range(300)}, "too_many_headers"),
    }
    for what, (headers, code) in cases.items():
        status, answered, raw = await api.raw("GET", DESTS, headers=headers)
        assert status == 400, (what, raw[:200])
        assert error_code(json.loads(raw)) == code, (what, raw[:200])
        assert answered["X-Request-Id"] == json.loads(raw)["request_id"]
        assert b"kkkk" not in raw, what
    status, _, raw = await api.raw("GET", DESTS + "?type=" + "w" * 20_000)
    assert 400 <= status < 500, raw[:200]
    # A long key that the parser accepts is Herald's clear 401.
    status, _, answer = await api.get(
        DESTS, headers={"Authorization": "Bearer sk_live_" + "k" * 5000}
    )
    assert (status, error_code(answer)) == (401, "auth_invalid_key")
    # The daemon is unharmed.
    assert (await api.get(DESTS))[0] == 200
    assert herald.get("/readyz")[0] == 200


# --- the cursor and idempotency paths, property-based -----------------------------------------


class Client:
    """A blocking client for Hypothesis: one daemon, one key, no rate limit in the way."""

    def __init__(self, h: Herald, tenant: str = "fuzz") -> None:
        self.base = base_url(h)
        self.session = requests.Session()
        key = h.cli("keys", "create", "--tenant", tenant).stdout.strip()
        self.session.headers["Authorization"] = f"Bearer {key}"

    def call(
        self, method: str, path: str, *, parser_400: bool = False, **kwargs: Any
    ) -> requests.Response:
        """One request; never a 5xx, and Herald's errors shape on every 4xx, including,
        with ``parser_400``, the 400 of aiohttp's HTTP parser (bad header bytes)."""
        response = self.session.request(method, self.base + path, timeout=30, **kwargs)
        assert response.status_code < 500, (method, path, kwargs, response.text)
        assert response.headers["Content-Type"].startswith("application/json")
        if response.status_code >= 400:
            body = response.json()
            error_of(body)
            assert body["request_id"] == response.headers["X-Request-Id"]
        return response


@pytest.fixture
def client(herald_factory: HeraldFactory) -> Iterator[Client]:
    h = herald_factory({"api": {"rate_limit_requests": 1_000_000}})
    c = Client(h)
    yield c
    c.session.close()


def test_cursor_fuzz_never_5xx_and_only_issued_cursors_work(client: Client) -> None:
    for i in range(3):
        client.call("POST", DESTS, json=hook(dead_url(), name=f"d{i}"))
    first = client.call("GET", DESTS, params={"limit": 1}).json()
    cursor = first["next_cursor"]
    assert isinstance(cursor, str)
    assert client.call("GET", DESTS, params={"limit": 1, "cursor": cursor}).status_code == 200

    @FUZZ
    @given(
        st.one_of(
            st.text(max_size=300),
            st.binary(max_size=200).map(lambda b: b.hex()),
            st.integers(0, len(cursor) - 1).flatmap(
                lambda i: st.characters(codec="ascii").map(
                    lambda c: cursor[:i] + c + cursor[i + 1 :]
                )
            ),
        ),
        st.sampled_from([DESTS, "deliveries"]),
    )
    def check(value: str, where: str) -> None:
        assume(value != cursor)
        path = DESTS if where == DESTS else f"{DESTS}/{first['data'][0]['id']}/event-deliveries"
        response = client.call("GET", path, params={"cursor": value})
        assert response.status_code == 400, response.text
        assert error_of(response.json())["code"] in {"cursor_invalid", "invalid_character"}

    check()


_any_text = st.text(st.characters(blacklist_categories=["Cs"]), max_size=20)
_json: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | _any_text,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(_any_text, children, max_size=3)
    ),
    max_leaves=10,
)


def test_idempotency_fuzz_replays_or_refuses_never_5xx(client: Client) -> None:
    examples = itertools.count()

    @FUZZ
    @given(
        key=st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=300)
        | st.text(max_size=40),
        data=st.dictionaries(_any_text, _json, max_size=4),
        type_=st.sampled_from(["a.b", "task_run.completed", "Not A Type", ""]),
        other=st.dictionaries(_any_text, _json, max_size=2),
    )
    def check(key: str, data: dict[str, Any], type_: str, other: dict[str, Any]) -> None:
        # Unique per example (the daemon outlives them); HTTP drops trailing whitespace.
        key = f"{next(examples)}-{key}"
        assume(key == key.rstrip(" \t"))
        body = {"type": type_, "data": data}
        headers = {"Idempotency-Key": key}
        try:
            first = client.call("POST", "/v2/events", json=body, headers=headers, parser_400=True)
        except (ValueError, requests.exceptions.InvalidHeader):
            assume(False)  # a header value the HTTP client itself will not send
        valid = len(key) <= 255 and all(0x21 <= ord(c) <= 0x7E for c in key)
        # Refused by Herald, or before it by the HTTP parser (bad header bytes).
        if first.status_code == 400 and error_of(first.json())["code"] in (
            "idempotency_key_invalid",
            "header_invalid",
            "header_too_large",
            "invalid_http",
        ):
            assert not valid, first.text
            return
        assert valid, (key, first.text)
        again = client.call("POST", "/v2/events", json=body, headers=headers)
        assert (again.status_code, again.json()) == (first.status_code, first.json())
        assert again.headers["Idempotent-Replayed"] == "true"
        if "request_id" in first.json():  # a replayed error keeps its request id
            assert again.headers["X-Request-Id"] == first.headers["X-Request-Id"]
        changed = {"type": type_, "data": {**data, "__changed__": other}}
        reused = client.call("POST", "/v2/events", json=changed, headers=headers)
        assert reused.status_code == 422, reused.text
        assert error_of(reused.json())["code"] == "idempotency_key_reused"

    check()


def test_arbitrary_json_bodies_never_5xx(client: Client) -> None:
    dest = client.call("POST", DESTS, json=hook(dead_url())).json()
    targets = [
        ("POST", DESTS),
        ("PATCH", f"{DESTS}/{dest['id']}"),
        ("POST", "/v2/events"),
        ("POST", f"{DESTS}/{dest['id']}/replay"),
    ]

    @FUZZ
    @given(
        st.sampled_from(targets),
        st.one_of(
            _json,
            st.fixed_dictionaries(
                {"type": st.sampled_from(["a.b", "webhook"]), "data": _json},
            ),
            st.fixed_dictionaries(
                {
                    "name": _any_text,
                    "type": st.just("webhook"),
                    "webhook": st.fixed_dictionaries({"url": _any_text}),
                    "events": st.lists(_any_text, max_size=2),
                }
            ),
        ),
    )
    def check(target: tuple[str, str], body: Any) -> None:
        method, path = target
        if method == "POST" and path == DESTS and isinstance(body, dict) and body.get("webhook"):
            body["webhook"]["url"] = "http://127.0.0.1:9/" + str(body["webhook"]["url"])
        client.call(method, path, json=body)

    check()


# --- the outbox ----------------------------------------------------------------------------


async def test_hostile_outbox_rows_are_rejected_or_delivered_byte_exact(
    herald_factory: HeraldFactory, receiver: Receiver
) -> None:
    """What tests/integration/test_relay.py leaves out: NUL and bad bytes in the other
    columns, a BOM, empty and null data, ids and tenants over the length limit, and a
    NUL escape in valid JSON that must reach the receiver unchanged (SQLite; PostgreSQL's
    jsonb refuses NULs at the producer's insert already)."""
    h = herald_factory()
    dest = await h.acreate_webhook(receiver.url, secret=SECRET)
    await _wait_active(h, dest["id"])
    insert = "INSERT INTO herald_outbox (id, tenant_id, type, data) VALUES (?, ?, ?, ?)"
    poison: dict[str, tuple[str, str, str, str]] = {
        "evt_" + "l" * 300: ("default", "a.b", "{}", "invalid_id"),
        "evt_longtenant": ("t" * 300, "a.b", "{}", "invalid_tenant_id"),
        "evt_spaces": ("default", "   ", "{}", "invalid_type"),
        "evt_null": ("default", "a.b", "null", "invalid_data"),
        "evt_string": ("default", "a.b", '"{}"', "invalid_data"),
    }
    good = {"evt_plain": '{"x": 1}'}
    if h.backend == "sqlite":
        poison.update(
            {
                "evt_nultype": ("default", "a.b\x00c", "{}", "invalid_type"),
                "evt_nultenant": ("ten\x00ant", "a.b", "{}", "invalid_tenant_id"),
                "evt_bom": ("default", "a.b", "\ufeff{}", "invalid_json"),
                "evt_empty": ("default", "a.b", "", "invalid_json"),
                "evt_surrogate": ("default", "a.b", '{"s": "\\ud800"}', "invalid_json"),
            }
        )
        good["evt_nulescape"] = '{"s": "a\\u0000b", "n": 12345678901234567890123}'
    conn = h.connect()
    try:
        conn.execute("BEGIN")
        for event_id, (tenant, type_, data, _) in poison.items():
            conn.execute(insert, (event_id, tenant, type_, data))
        for event_id, data in good.items():
            conn.execute(insert, (event_id, "default", "a.b", data))
        conn.execute("COMMIT")
    finally:
        conn.close()
    await receiver.wait_for(lambda: set(good) <= set(receiver.counts("a.b")), what="good rows")
    rejected = dict(h.query("SELECT id, reason FROM herald_outbox_rejected"))
    assert set(rejected) == {i.replace("\x00", "\\u0000") for i in poison}
    for event_id, (*_, code) in poison.items():
        assert rejected[event_id].startswith(f"{code}: "), (event_id, rejected[event_id])
    assert h.query("SELECT COUNT(*) FROM herald_outbox") == [(0,)]
    for item in receiver.events("a.b"):
        # The producer's bytes, not a re-serialisation.
        assert item.body.endswith(b'"data":' + good[item.event_id].encode() + b"}"), item.body
        assert item.verified
    assert h.get("/readyz")[0] == 200


async def _wait_active(h: Herald, dest_id: str) -> None:
    from tests.e2e.test_delivery import wait_active

    await wait_active(h, dest_id)


# --- the config file, through the real CLI -----------------------------------------------------

KEY_LOOKALIKE = "c2VjcmV0LWtleS1tYXRlcmlhbA"  # base64, but 21 bytes: never to be echoed

BAD_CONFIGS: dict[str, tuple[str, str]] = {
    "unknown section": ("[databse]\nurl = 'sqlite:///x.db'\n", "databse: unknown key"),
    "unknown key": ("[delivery]\nmax_retrys = 3\n", "delivery.max_retrys: unknown key"),
    "wrong type": ("[delivery]\nmax_retries = 'ten'\n", "delivery.max_retries"),
    "out of range": ("[delivery]\nmax_retries = -1\n", "delivery.max_retries"),
    "bad database URL": ("[database]\nurl = 'mysql://db/herald'\n", "database.url"),
    "relative sqlite URL": ("[database]\nurl = 'sqlite://herald.db'\n", "database.url"),
    "bad listen": ("[api]\nlisten = 'localhost'\n", "api.listen"),
    "bad CIDR": ("[security]\nallowed_networks = ['10.0.0.0/33']\n", "security.allowed_networks"),
    "bad key": (f"[security]\nencryption_key = '{KEY_LOOKALIKE}'\n", "security.encryption_key"),
    "bad previous key": (
        f"[security]\nprevious_encryption_keys = ['{KEY_LOOKALIKE}']\n",
        "security.previous_encryption_keys",
    ),
    "bad log level": ("[log]\nlevel = 'loud'\n", "log.level"),
    "not TOML": ("[delivery\nmax_retries = 3\n", "not valid TOML"),
}


async def _herald(*args: str, cwd: Path, env: dict[str, str] | None = None) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "herald",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=cwd,
        env=env,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert out == b"", out
    assert proc.returncode is not None
    return proc.returncode, err.decode()


async def test_a_bad_config_is_one_clear_message_and_exit_2(tmp_path: Path) -> None:
    """Every case through `herald check-config` and `herald run`, a few at a time."""
    gate = asyncio.Semaphore(4)

    async def check(case: str, command: str) -> str | None:
        text, needle = BAD_CONFIGS[case]
        workdir = tmp_path / case.replace(" ", "-")
        workdir.mkdir(exist_ok=True)
        (workdir / "bad.toml").write_text(text)
        async with gate:
            code, err = await _herald(command, "--config", "bad.toml", cwd=workdir)
        lines = err.strip().splitlines()
        if (
            code == 2
            and len(lines) == 2  # one message and what to do, no traceback
            and lines[0].startswith("herald: error: ")
            and lines[1].startswith("herald: hint: ")
            and needle in lines[0]
            and KEY_LOOKALIKE not in err
        ):
            return None
        return f"{case} / {command}: exit {code}: {err}"

    problems = await asyncio.gather(
        *(check(case, command) for case in BAD_CONFIGS for command in ("check-config", "run"))
    )
    assert not [p for p in problems if p], "\n".join(p for p in problems if p)
    assert not _databases(tmp_path)  # nothing was started


def _databases(root: Path) -> list[Path]:
    return list(root.glob("*/herald.db*"))


def test_a_missing_config_file_is_exit_2(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "herald", "run", "--config", str(tmp_path / "nope.toml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    error, hint = proc.stderr.strip().splitlines()
    assert error == f"herald: error: config file {tmp_path / 'nope.toml'} does not exist"
    assert hint.startswith("herald: hint: ")


async def test_env_overrides_are_validated_like_the_file(tmp_path: Path) -> None:
    env = {"HERALD_DELIVERY__MAX_RETRIES": "many", "PATH": os.environ.get("PATH", "")}
    code, err = await _herald("check-config", cwd=tmp_path, env=env)
    assert code == 2
    # The message names the variable the value came from, and the key it sets.
    assert err.startswith(
        "herald: error: config: HERALD_DELIVERY__MAX_RETRIES (delivery.max_retries)"
    ), err
