"""Standard Webhooks signatures: ``whsec_`` secrets and ``v1,`` HMAC-SHA256 signatures."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import secrets
from collections.abc import Sequence

from herald.errors import ValidationError

__all__ = [
    "SECRET_PREFIX",
    "generate_secret",
    "parse_secret",
    "sign",
    "signature_header",
]

SECRET_PREFIX = "whsec_"
_MIN_KEY_BYTES = 24
_MAX_KEY_BYTES = 64
# Standard alphabet only: a URL-safe secret would decode differently in other libraries.
_BASE64 = re.compile(r"[A-Za-z0-9+/]+={0,2}", re.ASCII)


def parse_secret(secret: str) -> bytes:
    """Decode a ``whsec_`` secret into its HMAC key; raise ValidationError if malformed."""
    if not secret.startswith(SECRET_PREFIX):
        raise ValidationError(f"webhook secret must start with {SECRET_PREFIX!r}")
    encoded = secret[len(SECRET_PREFIX) :]
    if _BASE64.fullmatch(encoded) is None:
        raise ValidationError(
            f"webhook secret must be {SECRET_PREFIX!r} followed by standard base64"
        )
    # Padding is optional on input, as the reference libraries accept both.
    encoded = encoded.rstrip("=")
    try:
        key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except binascii.Error:
        raise ValidationError("webhook secret is not valid base64") from None
    if not _MIN_KEY_BYTES <= len(key) <= _MAX_KEY_BYTES:
        raise ValidationError(
            f"webhook secret must decode to {_MIN_KEY_BYTES}-{_MAX_KEY_BYTES} bytes, got {len(key)}"
        )
    return key


def generate_secret() -> str:
    """A new ``whsec_`` secret holding 32 random bytes."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode("ascii")


def sign(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``v1,`` signature of one message under one key."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.digest(key, signed, hashlib.sha256)
    return "v1," + base64.b64encode(digest).decode("ascii")


def signature_header(keys: Sequence[bytes], msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value: one signature per key, current key first."""
    if not keys:
        raise ValueError("at least one signing key is required")
    return " ".join([sign(key, msg_id, timestamp, body) for key in keys])
