"""POST /v2/token over HTTP: spec 000's session-token object, only a hash stored, an
idempotent repeat, and the token opening (and ending) through the portal's functions
on the daemon's own database."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from herald.access.tokens import TokenRefused, Tokens
from herald.crypto import SecretBox
from herald.store import Store
from herald.store.postgres import PostgresStore
from herald.store.sqlite import SQLiteStore
from herald.timeutil import parse_timestamp
from tests.support.api import Api, create_key, error_of, eventually
from tests.support.daemon import Herald

pytestmark = pytest.mark.e2e

TOKEN_FIELDS = {"id", "object", "token", "expires_at", "created_at", "request_id"}


def sha256(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


@asynccontextmanager
async def portal_store(h: Herald) -> AsyncIterator[Store]:
    """The daemon's database, opened as another process would (the portal's calls)."""
    box = SecretBox(b"k" * 32)  # tokens touch no encrypted column
    store: Store
    if h.backend == "sqlite":
        store = SQLiteStore(h.db_path, box=box)
    else:
        store = PostgresStore(h.database_url, box=box, pool_size=2)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


def everything_stored(h: Herald) -> str:
    tables = ("herald_session_tokens", "herald_idempotency")
    return repr([h.query(f"SELECT * FROM {t}") for t in tables])


async def test_a_token_is_created_stored_as_a_hash_and_opens_the_portal(
    herald: Herald, api: Api
) -> None:
    status, headers, token = await api.post("/v2/token")
    assert status == 201, token
    assert set(token) == TOKEN_FIELDS
    assert token["object"] == "token"
    assert token["id"].startswith("tok_")
    assert token["token"].startswith("tk_")
    assert token["request_id"] == headers["X-Request-Id"]
    assert "RateLimit" in headers
    lifetime = (
        parse_timestamp(token["expires_at"]).epoch - parse_timestamp(token["created_at"]).epoch
    )
    assert lifetime == pytest.approx(1800, abs=0.001)
    rows = herald.query("SELECT id, tenant_id, token_hash FROM herald_session_tokens")
    assert rows == [(token["id"], "acme", sha256(token["token"]))]
    assert token["token"] not in everything_stored(herald)

    async with portal_store(herald) as store:
        tokens = Tokens(store)
        scope = await tokens.open_token(token["token"])
        assert (scope.token_id, scope.tenant_id) == (token["id"], "acme")
        session = await tokens.trade(token["token"])
        assert (await tokens.open_session(session.secret)).tenant_id == "acme"

        # Revoking the key that made it (as an operator does) ends the session.
        assert api.key is not None
        await herald.acli("keys", "revoke", "--tenant", "acme", api.key)
        with pytest.raises(TokenRefused) as refused:
            await tokens.open_session(session.secret)
        assert refused.value.code == "token_revoked"

    async def key_refused() -> bool:
        status, _, _ = await api.post("/v2/token")
        return status == 401

    await eventually(key_refused, what="the revoked key to be refused")


async def test_an_idempotent_repeat_gives_the_same_token_a_new_value(
    herald: Herald, api: Api
) -> None:
    key = {"Idempotency-Key": "portal-1"}
    status, _, first = await api.post("/v2/token", headers=key)
    assert status == 201, first
    status, headers, again = await api.post("/v2/token", headers=key)
    assert (status, headers["Idempotent-Replayed"]) == (201, "true")
    assert set(again) == TOKEN_FIELDS
    for field in ("id", "created_at", "expires_at", "request_id"):
        assert again[field] == first[field], field
    assert headers["X-Request-Id"] == first["request_id"]
    # Only a hash is kept, so the first value cannot be answered again: the token has a
    # new one and the first stops working.
    assert again["token"] != first["token"]
    stored = everything_stored(herald)
    assert first["token"] not in stored
    assert again["token"] not in stored
    assert herald.query("SELECT token_hash FROM herald_session_tokens") == [
        (sha256(again["token"]),)
    ]
    assert herald.query("SELECT COUNT(*) FROM herald_session_tokens") == [(1,)]

    async with portal_store(herald) as store:
        await Tokens(store).trade(again["token"])
    status, _, body = await api.post("/v2/token", headers=key)
    assert (status, error_of(body)["code"]) == (409, "token_unavailable")


@pytest.mark.backend_neutral
async def test_token_requests_are_refused_in_the_errors_shape(herald: Herald, api: Api) -> None:
    async with api.with_key(None) as anonymous:
        status, _, body = await anonymous.post("/v2/token")
    assert (status, error_of(body)["type"]) == (401, "auth")
    status, _, body = await api.post("/v2/token", json={"tenant": "globex"})
    assert (status, error_of(body)["code"]) == (400, "unknown_field")
    status, _, body = await api.get("/v2/token")
    assert (status, error_of(body)["code"]) == (405, "method_not_allowed")
    # A key makes tokens for its own tenant only.
    async with api.with_key(await create_key(herald, "globex")) as other:
        status, _, token = await other.post("/v2/token", json={})
    assert status == 201, token
    assert herald.query(
        "SELECT tenant_id FROM herald_session_tokens WHERE id = ?", (token["id"],)
    ) == [("globex",)]
