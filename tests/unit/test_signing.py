"""Tests for herald.signing, including interop with the standardwebhooks library."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from herald.errors import ValidationError
from herald.signing import (
    SECRET_PREFIX,
    generate_secret,
    parse_secret,
    sign,
    signature_header,
)

KNOWN_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
KNOWN_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
KNOWN_TS = 1614265330
KNOWN_BODY = b'{"test": 2432232314}'
KNOWN_SIG = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def headers(msg_id: str, ts: int, signature: str) -> dict[str, str]:
    return {"webhook-id": msg_id, "webhook-timestamp": str(ts), "webhook-signature": signature}


def test_known_answer() -> None:
    key = parse_secret(KNOWN_SECRET)
    assert len(key) == 24
    assert sign(key, KNOWN_ID, KNOWN_TS, KNOWN_BODY) == KNOWN_SIG


def test_sign_is_hmac_over_id_timestamp_body() -> None:
    key = b"k" * 32
    expected = hmac.new(key, b"id1.99.\x00\xffraw", hashlib.sha256).digest()
    assert sign(key, "id1", 99, b"\x00\xffraw") == "v1," + base64.b64encode(expected).decode()


@pytest.mark.parametrize(
    ("msg_id", "ts", "body"),
    [
        (KNOWN_ID + "x", KNOWN_TS, KNOWN_BODY),
        (KNOWN_ID, KNOWN_TS + 1, KNOWN_BODY),
        (KNOWN_ID, KNOWN_TS, KNOWN_BODY + b" "),
    ],
)
def test_any_change_changes_signature(msg_id: str, ts: int, body: bytes) -> None:
    assert sign(parse_secret(KNOWN_SECRET), msg_id, ts, body) != KNOWN_SIG


def test_signature_header_orders_keys_current_first() -> None:
    current, previous = b"c" * 32, b"p" * 32
    header = signature_header([current, previous], "m", 1, b"{}")
    assert header.split(" ") == [sign(current, "m", 1, b"{}"), sign(previous, "m", 1, b"{}")]
    assert signature_header([current], "m", 1, b"{}") == sign(current, "m", 1, b"{}")


def test_signature_header_needs_a_key() -> None:
    with pytest.raises(ValueError, match="at least one"):
        signature_header([], "m", 1, b"{}")


def test_verified_by_standardwebhooks_single_key() -> None:
    secret = generate_secret()
    ts = int(time.time())
    body = b'{"type": "invoice.paid", "data": {"amount": 1200, "note": "caf\xc3\xa9"}}'
    header = signature_header([parse_secret(secret)], "msg_1", ts, body)
    payload = Webhook(secret).verify(body, headers("msg_1", ts, header))
    assert payload == {"type": "invoice.paid", "data": {"amount": 1200, "note": "café"}}


def test_verified_by_standardwebhooks_during_rotation() -> None:
    old, new = generate_secret(), generate_secret()
    ts = int(time.time())
    body = b'{"ok": true}'
    header = signature_header([parse_secret(new), parse_secret(old)], "msg_2", ts, body)
    # Receivers on either secret accept the message while the rotation overlaps.
    assert Webhook(new).verify(body, headers("msg_2", ts, header)) == {"ok": True}
    assert Webhook(old).verify(body, headers("msg_2", ts, header)) == {"ok": True}
    with pytest.raises(WebhookVerificationError):
        Webhook(generate_secret()).verify(body, headers("msg_2", ts, header))


def test_standardwebhooks_rejects_tampered_body() -> None:
    secret = generate_secret()
    ts = int(time.time())
    header = signature_header([parse_secret(secret)], "msg_3", ts, b'{"n": 1}')
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(b'{"n": 2}', headers("msg_3", ts, header))


def test_known_secret_accepted_by_standardwebhooks_too() -> None:
    ts = int(time.time())
    header = signature_header([parse_secret(KNOWN_SECRET)], KNOWN_ID, ts, KNOWN_BODY)
    assert Webhook(KNOWN_SECRET).verify(KNOWN_BODY, headers(KNOWN_ID, ts, header)) == {
        "test": 2432232314
    }


def test_generate_secret_shape() -> None:
    first, second = generate_secret(), generate_secret()
    assert first != second
    assert first.startswith(SECRET_PREFIX)
    assert len(parse_secret(first)) == 32
    assert base64.b64decode(first[len(SECRET_PREFIX) :], validate=True) == parse_secret(first)


@pytest.mark.parametrize(
    ("size", "padded"),
    [(24, True), (32, True), (32, False), (33, True), (33, False), (64, True)],
)
def test_parse_secret_sizes_and_padding(size: int, padded: bool) -> None:
    raw = bytes(range(size))
    encoded = base64.b64encode(raw).decode()
    if not padded:
        encoded = encoded.rstrip("=")
    assert parse_secret(SECRET_PREFIX + encoded) == raw


@pytest.mark.parametrize(
    ("secret", "reason"),
    [
        ("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "must start with 'whsec_'"),
        ("WHSEC_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "must start with 'whsec_'"),
        ("whsec_", "standard base64"),
        ("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaS-", "standard base64"),
        ("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaS_", "standard base64"),
        ("whsec_MfKQ9r8GKYqrTwjUPD8I LPZIo2LaLaSw", "standard base64"),
        ("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n", "standard base64"),
        ("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw===", "standard base64"),
        ("whsec_MfKQ9r8GKYqr=TwjUPD8ILPZIo2LaLaSw", "standard base64"),
        ("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSwA", "not valid base64"),
        ("whsec_" + base64.b64encode(bytes(23)).decode(), "24-64 bytes, got 23"),
        ("whsec_" + base64.b64encode(bytes(65)).decode(), "24-64 bytes, got 65"),
    ],
)
def test_parse_secret_rejects(secret: str, reason: str) -> None:
    with pytest.raises(ValidationError, match=reason) as info:
        parse_secret(secret)
    assert info.value.field is None
    assert info.value.code == "validation_error"
