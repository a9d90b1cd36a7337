"""Session tokens on both backends, on a clock the test moves: 30 minutes after the last
use, each use extending by 30 minutes, never past 24 hours after creation; spent once
traded for a portal session; ended by signing out or by revoking the key that made it."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from herald.access.keys import hash_api_key, new_api_key
from herald.access.tokens import IDLE_SECONDS, LIFETIME_SECONDS, TokenRefused, Tokens
from tests.integration.conftest import Harness

T0 = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


async def tenant_key(h: Harness, tenant: str = "acme") -> str:
    """A stored API key of ``tenant``; its hash, as the API hands it to a token."""
    key = new_api_key()
    digest = hash_api_key(key)
    await h.store.create_api_key(key_hash=digest, tenant_id=tenant, hint=key[-4:], now=T0)
    return digest


async def refused(code: str, pending: object) -> None:
    with pytest.raises(TokenRefused) as caught:
        await pending  # type: ignore[misc]
    assert caught.value.code == code
    assert caught.value.status == 401


async def test_a_token_slides_by_30_minutes_and_stops_at_24_hours(harness: Harness) -> None:
    h, clock = harness, Clock()
    tokens = Tokens(h.store, clock=clock)
    issued = await tokens.create("acme", key_hash=await tenant_key(h))
    assert issued.id.startswith("tok_")
    assert issued.token.startswith("tk_")
    assert (issued.created_at, issued.expires_at) == (T0, T0 + IDLE_SECONDS)
    # Only the token's SHA-256 is stored, nowhere its value.
    stored = h.rows("SELECT * FROM herald_session_tokens")
    assert len(stored) == 1
    assert issued.token not in repr(stored)
    assert h.scalar("SELECT token_hash FROM herald_session_tokens") == (
        hashlib.sha256(issued.token.encode()).hexdigest()
    )

    clock.now = T0 + 1000
    scope = await tokens.open_token(issued.token)
    assert (scope.token_id, scope.tenant_id) == (issued.id, "acme")
    assert scope.expires_at == T0 + 1000 + IDLE_SECONDS
    # A use just before the expiry extends it again; a use at the expiry is too late.
    clock.now = scope.expires_at - 0.001
    scope = await tokens.open_token(issued.token)
    assert scope.expires_at == clock.now + IDLE_SECONDS
    clock.now = scope.expires_at
    await refused("token_expired", tokens.open_token(issued.token))

    # Used every 25 minutes, it lives exactly 24 hours, and the last extension is cut.
    clock.now = T0
    other = await tokens.create("acme", key_hash=await tenant_key(h))
    uses = 0
    while True:
        clock.now += 25 * 60
        if clock.now >= T0 + LIFETIME_SECONDS:
            break
        scope = await tokens.open_token(other.token)
        uses += 1
        assert scope.expires_at == min(clock.now + IDLE_SECONDS, T0 + LIFETIME_SECONDS)
    assert uses == 57
    assert scope.expires_at == T0 + LIFETIME_SECONDS
    await refused("token_expired", tokens.open_token(other.token))

    # A use stamped earlier (another instance's clock behind) never shortens it.
    clock.now = T0
    third = await tokens.create("acme", key_hash=await tenant_key(h))
    clock.now = T0 + 600
    later = await tokens.open_token(third.token)
    clock.now = T0 + 300
    assert (await tokens.open_token(third.token)).expires_at == later.expires_at


async def test_a_token_is_traded_once_for_a_portal_session(harness: Harness) -> None:
    h, clock = harness, Clock()
    tokens = Tokens(h.store, clock=clock)
    issued = await tokens.create("acme", key_hash=await tenant_key(h))
    clock.now = T0 + 60
    session = await tokens.trade(issued.token)
    assert session.secret.startswith("tks_")
    assert (session.scope.token_id, session.scope.tenant_id) == (issued.id, "acme")
    assert session.scope.expires_at == T0 + 60 + IDLE_SECONDS
    assert session.secret not in repr(h.rows("SELECT * FROM herald_session_tokens"))
    # The tk_ value travelled in a URL: it is spent.
    await refused("token_used", tokens.trade(issued.token))
    await refused("token_used", tokens.open_token(issued.token))
    assert await tokens.reissue("acme", issued.id) is None

    # The session opens the same token, extending it; signing out ends it.
    clock.now = T0 + 1200
    scope = await tokens.open_session(session.secret)
    assert (scope.token_id, scope.expires_at) == (issued.id, T0 + 1200 + IDLE_SECONDS)
    clock.now = scope.expires_at + 1
    await refused("token_expired", tokens.open_session(session.secret))
    assert await tokens.close_session(session.secret) is True
    await refused("token_revoked", tokens.open_session(session.secret))
    assert await tokens.close_session(session.secret) is False

    for bad in ("", "tk_short", "sk_live_" + "a" * 43, "tk_" + "a" * 42 + "!", "tk_" + "a" * 43):
        await refused("token_invalid", tokens.open_token(bad))
    await refused("token_invalid", tokens.open_session("tks_" + "b" * 43))
    await refused("token_invalid", tokens.open_session(issued.token))


async def test_revoking_the_key_ends_its_tokens_and_sessions(harness: Harness) -> None:
    h, clock = harness, Clock()
    tokens = Tokens(h.store, clock=clock)
    digest = await tenant_key(h)
    kept = await tokens.create("acme", key_hash=await tenant_key(h))
    fresh = await tokens.create("acme", key_hash=digest)
    traded = await tokens.create("acme", key_hash=digest)
    session = await tokens.trade(traded.token)
    assert await h.store.revoke_api_keys(tenant_id="acme", hash_prefix=digest, now=T0) == 1
    await refused("token_revoked", tokens.open_token(fresh.token))
    await refused("token_revoked", tokens.open_session(session.secret))
    assert await tokens.reissue("acme", fresh.id) is None
    assert (await tokens.open_token(kept.token)).tenant_id == "acme"  # another key's


async def test_a_reissued_value_replaces_the_first(harness: Harness) -> None:
    h, clock = harness, Clock()
    tokens = Tokens(h.store, clock=clock)
    issued = await tokens.create("acme", key_hash=await tenant_key(h))
    assert await tokens.reissue("globex", issued.id) is None  # not another tenant's
    again = await tokens.reissue("acme", issued.id)
    assert again is not None
    assert (again.id, again.created_at, again.expires_at) == (issued.id, T0, issued.expires_at)
    assert again.token != issued.token
    await refused("token_invalid", tokens.open_token(issued.token))
    assert (await tokens.open_token(again.token)).token_id == issued.id
    clock.now = T0 + LIFETIME_SECONDS
    assert await tokens.reissue("acme", issued.id) is None  # expired


async def test_concurrent_trades_from_two_instances_spend_a_token_once(
    harness: Harness,
) -> None:
    """Two instances (two stores, two pools on PostgreSQL) trade the same token at once:
    one gets the session, the other is told it is used. Concurrent opens all extend."""
    h, clock = harness, Clock()
    second = h.new_store()
    await second.open()
    try:
        one, two = Tokens(h.store, clock=clock), Tokens(second, clock=clock)
        for _ in range(5):
            issued = await one.create("acme", key_hash=await tenant_key(h))
            results = await asyncio.gather(
                one.trade(issued.token), two.trade(issued.token), return_exceptions=True
            )
            won = [r for r in results if not isinstance(r, BaseException)]
            lost = [r for r in results if isinstance(r, TokenRefused)]
            assert (len(won), len(lost)) == (1, 1), results
            assert lost[0].code == "token_used"
        issued = await one.create("acme", key_hash=await tenant_key(h))
        clock.now = T0 + 100
        opened = await asyncio.gather(
            *(t.open_token(issued.token) for t in (one, two) for _ in range(5))
        )
        assert {s.expires_at for s in opened} == {T0 + 100 + IDLE_SECONDS}
    finally:
        await second.close()


async def test_retention_deletes_expired_tokens(harness: Harness) -> None:
    h, clock = harness, Clock()
    tokens = Tokens(h.store, clock=clock)
    digest = await tenant_key(h)
    old = await tokens.create("acme", key_hash=digest)
    clock.now = T0 + 3600
    live = await tokens.create("acme", key_hash=digest)
    await h.store.purge(before=T0 + 3600, limit=100)
    assert [r[0] for r in h.rows("SELECT id FROM herald_session_tokens")] == [live.id]
    await refused("token_invalid", tokens.open_token(old.token))
