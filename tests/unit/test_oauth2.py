"""The webhook's OAuth2 client as pure logic: the token request, the token response, the
cache's single flight and its 401 rule, and the TLS identity's checks."""

from __future__ import annotations

import asyncio
import base64
import time
from urllib.parse import parse_qs, unquote

import jwt
import orjson
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from tests.support.receiverauth import TestCA

from herald.adapters.oauth2 import (
    REFRESH_MARGIN,
    Client,
    TokenError,
    Tokens,
    read_token,
    token_request,
)
from herald.adapters.tlsidentity import Contexts, Identity, check_key

SECRET = "s3cret with:colon+plus"


def pem(key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


def client(**fields: str) -> Client:
    values = {"token_url": "https://auth.example.com/token", "client_id": "id:1", "secret": SECRET}
    return Client(**{**values, **fields})


def test_client_secret_basic_form_encodes_each_half() -> None:
    body, headers = token_request(client(scope="a b", audience="api"))
    assert parse_qs(body.decode()) == {
        "grant_type": ["client_credentials"],
        "scope": ["a b"],
        "audience": ["api"],
    }
    user, _, password = (
        base64.b64decode(headers["authorization"].removeprefix("Basic ")).decode().partition(":")
    )
    assert (unquote(user), unquote(password)) == ("id:1", SECRET)


def test_client_secret_post_sends_them_in_the_form() -> None:
    body, headers = token_request(client(auth_method="client_secret_post"))
    form = parse_qs(body.decode())
    assert form["client_id"] == ["id:1"]
    assert form["client_secret"] == [SECRET]
    assert "authorization" not in headers


@pytest.mark.parametrize(
    ("key", "algorithm"),
    [
        (rsa.generate_private_key(public_exponent=65537, key_size=2048), "RS256"),
        (ec.generate_private_key(ec.SECP384R1()), "ES384"),
        (ed25519.Ed25519PrivateKey.generate(), "EdDSA"),
    ],
)
def test_private_key_jwt_signs_rfc_7523_claims(
    key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey,
    algorithm: str,
) -> None:
    c = client(auth_method="private_key_jwt", private_key=pem(key), key_id="k1", secret="")
    body, headers = token_request(c)
    form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
    assert form["client_assertion_type"] == "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
    assertion = form["client_assertion"]
    assert jwt.get_unverified_header(assertion)["kid"] == "k1"
    claims = jwt.decode(
        assertion,
        key.public_key(),
        algorithms=[algorithm],
        audience=c.token_url,
    )
    assert claims["iss"] == claims["sub"] == "id:1"
    assert claims["exp"] - claims["iat"] == 60
    assert "authorization" not in headers
    # A fresh jti each time: the server may refuse a replayed assertion.
    assert jwt.decode(c.assertion(), options={"verify_signature": False})["jti"] != claims["jti"]


def test_a_token_is_used_until_a_minute_before_it_expires() -> None:
    body = orjson.dumps({"access_token": "t0k", "token_type": "bearer", "expires_in": 3600})
    assert read_token(200, body, now=1000.0) == ("t0k", 1000.0 + 3600 - REFRESH_MARGIN)
    no_expiry = orjson.dumps({"access_token": "t0k", "token_type": "Bearer"})
    assert read_token(200, no_expiry, now=0.0) == ("t0k", float("inf"))


@pytest.mark.parametrize(
    ("status", "body", "message", "permanent"),
    [
        (
            401,
            {"error": "invalid_client", "error_description": SECRET},
            "oauth2_token: 401 invalid_client",
            True,
        ),
        (400, {"error": "bad\nvalue"}, "oauth2_token: 400", True),
        (503, b"down", "oauth2_token: 503", False),
        (302, b"", "oauth2_token: 302", True),
        (200, {"token_type": "Bearer"}, "oauth2_token: 200 without a usable access_token", False),
        (
            200,
            {"access_token": "a\r\nb", "token_type": "Bearer"},
            "oauth2_token: 200 without a usable access_token",
            False,
        ),
        (
            200,
            {"access_token": "t", "token_type": "mac"},
            "oauth2_token: 200 with a token_type other than Bearer",
            True,
        ),
        (200, b"<html>", "oauth2_token: 200 with a body that is not a JSON object", False),
    ],
)
def test_a_refusal_names_the_status_and_code_never_the_body(
    status: int, body: object, message: str, permanent: bool
) -> None:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    with pytest.raises(TokenError) as info:
        read_token(status, raw, now=0.0)
    assert (info.value.message, info.value.permanent) == (message, permanent)


async def test_concurrent_callers_share_one_fetch_and_a_401_refetches_once() -> None:
    fetched: list[str] = []
    gate = asyncio.Event()

    async def fetch(c: Client) -> tuple[str, float]:
        fetched.append(c.client_id)
        await gate.wait()
        return f"token-{len(fetched)}", time.time() + 3600

    tokens = Tokens(fetch)
    c = client()
    waiters = [asyncio.create_task(tokens.get("d1", c)) for _ in range(50)]
    await asyncio.sleep(0)
    gate.set()
    assert set(await asyncio.gather(*waiters)) == {"token-1"}
    assert len(fetched) == 1
    tokens.refused("d1", "token-1")
    tokens.refused("d1", "token-1")
    assert await tokens.get("d1", c) == "token-2"
    tokens.refused("d1", "token-1")  # already replaced: no new fetch
    assert await tokens.get("d1", c) == "token-2"
    # Other credentials for the same destination never get its token.
    assert await tokens.get("d1", client(secret="other")) == "token-3"
    await tokens.close()


async def test_an_expired_token_is_fetched_again() -> None:
    count = 0

    async def fetch(c: Client) -> tuple[str, float]:
        nonlocal count
        count += 1
        return f"t{count}", time.time() - 1  # already past its use-by time

    tokens = Tokens(fetch)
    assert await tokens.get("d", client()) == "t1"
    assert await tokens.get("d", client()) == "t2"


def test_an_identity_has_one_context_shared_by_its_destinations() -> None:
    ca = TestCA()
    one, two = ca.issue("one"), ca.issue("two")
    first = Identity(one.certificate, one.key, ca.pem)
    contexts = Contexts()
    a = contexts.get("d1", first)
    assert contexts.get("d2", Identity(one.certificate, one.key, ca.pem)) is a
    b = contexts.get("d3", Identity(two.certificate, two.key, ca.pem))
    assert b is not a  # another certificate: another pool key, never a shared connection
    contexts.forget("d1")
    assert contexts.get("d2", first) is a  # still used by d2
    contexts.forget("d2")
    assert contexts.get("d2", first) is not a  # dropped once nobody used it


def test_a_key_is_checked_without_quoting_it() -> None:
    text = "-----BEGIN PRIVATE KEY-----\nnot-a-key-value\n-----END PRIVATE KEY-----"
    with pytest.raises(ValueError, match="PEM private key") as info:
        check_key(text)
    assert "not-a-key-value" not in str(info.value)
