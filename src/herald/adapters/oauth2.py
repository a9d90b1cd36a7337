"""OAuth2 client credentials (RFC 6749 §4.4) for webhooks: the bearer token each
attempt carries, fetched from the destination's token server and reused.

A token is fetched once per destination *and* credentials (a changed secret, scope
or token URL never reuses an old token) and reused until :data:`REFRESH_MARGIN`
seconds before its ``expires_in``. Concurrent attempts wait for the one fetch in
flight (single flight: at most one token request at a time per destination, per
process); an attempt that gives up waiting (its deadline) does not abort the fetch
the others wait for. A receiver's 401 drops the token it refused — only if it is
still the current one, so a 401 on a token already replaced costs no new fetch.

The client authenticates by ``client_secret_basic`` (RFC 6749 §2.3.1),
``client_secret_post`` or ``private_key_jwt`` (RFC 7523 §2.2, the assertion signed
with PyJWT). A failure reads ``oauth2_token: <what>`` — the status and the
server's ``error`` code, never the secret, the assertion or a token — and is the
attempt's failure. The token is held in memory only: never stored, never logged.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from urllib.parse import quote, urlencode

import jwt
import orjson
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.serialization import load_pem_private_key

__all__ = [
    "AUTH_METHODS",
    "Client",
    "TokenError",
    "Tokens",
    "token_request",
]

AUTH_METHODS = ("client_secret_basic", "client_secret_post", "private_key_jwt")
REFRESH_MARGIN = 60.0
"""Seconds before a token's expiry when it is fetched anew instead of used."""
ASSERTION_LIFETIME = 60
"""Seconds a ``private_key_jwt`` assertion is valid for."""
MAX_TOKEN_RESPONSE = 65536
"""Bytes of a token response read at most (a JWT access token can be a few KiB)."""
ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
# RFC 6749 §5.2: the error code's characters.
_ERROR_CODE = re.compile(r"[\x20\x21\x23-\x5b\x5d-\x7e]{1,64}")
_EC_ALGORITHMS = {"secp256r1": "ES256", "secp384r1": "ES384", "secp521r1": "ES512"}


class TokenError(Exception):
    """The token server did not give a token; ``message`` is safe to record."""

    def __init__(self, message: str, *, permanent: bool) -> None:
        super().__init__(message)
        self.message = f"oauth2_token: {message}"
        self.permanent = permanent


@dataclass(frozen=True, slots=True)
class Client:
    """A destination's OAuth2 client: where it asks for a token, and how it proves itself."""

    token_url: str
    client_id: str
    auth_method: str = "client_secret_basic"
    secret: str | None = field(default=None, repr=False)
    private_key: str | None = field(default=None, repr=False)
    key_id: str | None = None
    scope: str | None = None
    audience: str | None = None

    def fingerprint(self) -> str:
        """Every field, hashed: a token is reused only for the very same client."""
        digest = hashlib.sha256()
        for value in (
            self.token_url,
            self.client_id,
            self.auth_method,
            self.secret,
            self.private_key,
            self.key_id,
            self.scope,
            self.audience,
        ):
            digest.update(b"\x00" if value is None else b"\x01" + value.encode() + b"\x00")
        return digest.hexdigest()

    def form_and_headers(self) -> tuple[dict[str, str], dict[str, str]]:
        """The token request's form fields and headers (the client's authentication)."""
        form = {"grant_type": "client_credentials"}
        if self.scope:
            form["scope"] = self.scope
        if self.audience:
            form["audience"] = self.audience
        headers = {
            "content-type": "application/x-www-form-urlencoded",
            "accept": "application/json",
        }
        if self.auth_method == "client_secret_post":
            form["client_id"] = self.client_id
            form["client_secret"] = self.secret or ""
        elif self.auth_method == "private_key_jwt":
            form["client_id"] = self.client_id
            form["client_assertion_type"] = ASSERTION_TYPE
            form["client_assertion"] = self.assertion()
        else:  # client_secret_basic: each half form-encoded first (§2.3.1)
            pair = f"{quote(self.client_id, safe='')}:{quote(self.secret or '', safe='')}"
            headers["authorization"] = f"Basic {base64.b64encode(pair.encode()).decode()}"
        return form, headers

    def assertion(self, *, now: float | None = None) -> str:
        """The signed JWT of RFC 7523 §3 that authenticates the client."""
        assert self.private_key is not None
        key = load_pem_private_key(self.private_key.encode(), password=None)
        issued = int(now if now is not None else time.time())
        claims = {
            "iss": self.client_id,
            "sub": self.client_id,
            "aud": self.token_url,
            "jti": secrets.token_urlsafe(16),
            "iat": issued,
            "exp": issued + ASSERTION_LIFETIME,
        }
        headers = {"kid": self.key_id} if self.key_id else None
        return jwt.encode(claims, key, algorithm=signing_algorithm(key), headers=headers)  # type: ignore[arg-type]


def signing_algorithm(key: object) -> str:
    """The JWS algorithm for a private key: RS256, ES256/384/512 by curve, or EdDSA."""
    if isinstance(key, rsa.RSAPrivateKey):
        return "RS256"
    if isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name in _EC_ALGORITHMS:
        return _EC_ALGORITHMS[key.curve.name]
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return "EdDSA"
    raise ValueError("must be an RSA, EC (P-256, P-384, P-521) or Ed25519 private key")


def token_request(client: Client) -> tuple[bytes, dict[str, str]]:
    """The body and headers of ``client``'s token request."""
    form, headers = client.form_and_headers()
    return urlencode(form).encode(), headers


def read_token(status: int, body: bytes, *, now: float) -> tuple[str, float]:
    """(the access token, when to stop using it) from a token response; TokenError
    naming what is wrong otherwise (never quoting the body)."""
    try:
        obj = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        obj = None
    if status != 200:
        code = obj.get("error") if isinstance(obj, dict) else None
        said = f" {code}" if isinstance(code, str) and _ERROR_CODE.fullmatch(code) else ""
        # A refused client or grant (or a redirect, never followed) needs a change of
        # config; the server's trouble passes.
        permanent = status < 500 and status not in (408, 429)
        raise TokenError(f"{status}{said}", permanent=permanent)
    if not isinstance(obj, dict):
        raise TokenError("200 with a body that is not a JSON object", permanent=False)
    token = obj.get("access_token")
    if not isinstance(token, str) or not token or not token.isascii() or not token.isprintable():
        raise TokenError("200 without a usable access_token", permanent=False)
    token_type = obj.get("token_type")
    if not isinstance(token_type, str) or token_type.lower() != "bearer":
        raise TokenError("200 with a token_type other than Bearer", permanent=True)
    lifetime = obj.get("expires_in")
    if isinstance(lifetime, str) and lifetime.isdigit():
        lifetime = int(lifetime)
    if isinstance(lifetime, int | float) and not isinstance(lifetime, bool):
        # A token shorter-lived than the margin is still used once rather than never.
        return token, now + max(float(lifetime) - REFRESH_MARGIN, 0.0)
    # No expires_in (RFC 6749 §5.1 only recommends it): used until the receiver refuses it.
    return token, float("inf")


Fetch = Callable[[Client], Awaitable[tuple[str, float]]]
"""Asks the token server once: (the token, when to stop using it), or TokenError."""


@dataclass(slots=True)
class _Entry:
    fingerprint: str
    token: str | None = field(default=None, repr=False)
    until: float = 0.0
    fetching: asyncio.Task[tuple[str, float]] | None = None


class Tokens:
    """The tokens of one adapter's destinations (module docstring); ``fetch`` asks the
    token server (the adapter's session, under the egress guard)."""

    def __init__(self, fetch: Fetch) -> None:
        self._fetch = fetch
        self._entries: dict[str, _Entry] = {}

    async def get(self, dest_id: str, client: Client) -> str:
        """A token for ``client``: the cached one while it lasts, else the one fetch's."""
        fingerprint = client.fingerprint()
        entry = self._entries.get(dest_id)
        if entry is None or entry.fingerprint != fingerprint:
            entry = self._entries[dest_id] = _Entry(fingerprint)
        if entry.token is not None and time.monotonic() < entry.until:
            return entry.token
        if entry.fetching is None:
            entry.fetching = asyncio.create_task(
                self._fetched(entry, client), name="webhook-oauth2-token"
            )
            # A failure nobody awaits any more must not be reported as never retrieved.
            entry.fetching.add_done_callback(lambda t: t.cancelled() or t.exception())
        token, _ = await asyncio.shield(entry.fetching)
        return token

    def refused(self, dest_id: str, token: str) -> None:
        """The receiver answered 401 to ``token``: drop it, unless already replaced."""
        entry = self._entries.get(dest_id)
        if entry is not None and entry.token == token:
            entry.token = None

    def forget(self, dest_id: str) -> None:
        self._entries.pop(dest_id, None)

    async def close(self) -> None:
        """Cancel the fetches in flight (the adapter is closing its sessions)."""
        tasks = [e.fetching for e in self._entries.values() if e.fetching is not None]
        self._entries.clear()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    async def _fetched(self, entry: _Entry, client: Client) -> tuple[str, float]:
        try:
            token, lifetime_end = await self._fetch(client)
            # Wall-clock expiry from the fetch, kept on the monotonic clock.
            entry.token = token
            entry.until = time.monotonic() + (lifetime_end - time.time())
            return token, entry.until
        finally:
            entry.fetching = None
