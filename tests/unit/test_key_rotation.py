"""Key rotation at the SecretBox and config level: previous keys decrypt, never encrypt."""

from __future__ import annotations

from pathlib import Path

import pytest

from herald.config import load_settings
from herald.crypto import SecretBox, generate_key, parse_key
from herald.errors import ConfigError, CryptoError

OLD, NEW, OTHER = (parse_key(generate_key()) for _ in range(3))
AAD = b"evtd_1"


def test_previous_keys_decrypt_and_the_current_key_encrypts() -> None:
    under_old = SecretBox(OLD).encrypt(b"s3cret", aad=AAD)
    ring = SecretBox(NEW, [OLD])
    assert ring.decrypt(under_old, aad=AAD) == b"s3cret"
    fresh = ring.encrypt(b"s3cret", aad=AAD)
    assert SecretBox(NEW).decrypt(fresh, aad=AAD) == b"s3cret"
    with pytest.raises(CryptoError):
        SecretBox(OLD).decrypt(fresh, aad=AAD)  # written under the new key only


def test_reencrypt_moves_a_token_to_the_current_key_once() -> None:
    under_old = SecretBox(OLD).encrypt(b"s3cret", aad=AAD)
    ring = SecretBox(NEW, [OLD])
    moved = ring.reencrypt(under_old, aad=AAD)
    assert moved is not None
    assert SecretBox(NEW).decrypt(moved, aad=AAD) == b"s3cret"
    assert ring.reencrypt(moved, aad=AAD) is None  # already under the current key


def test_reencrypt_refuses_a_token_no_key_opens() -> None:
    foreign = SecretBox(OTHER).encrypt(b"s3cret", aad=AAD)
    with pytest.raises(CryptoError):
        SecretBox(NEW, [OLD]).reencrypt(foreign, aad=AAD)
    # The associated data still binds a token to its row.
    with pytest.raises(CryptoError):
        SecretBox(NEW, [OLD]).reencrypt(SecretBox(OLD).encrypt(b"x", aad=AAD), aad=b"evtd_2")


def test_previous_keys_must_be_keys() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        SecretBox(NEW, [b"short"])


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "herald.toml"
    path.write_text(text)
    return path


def test_config_previous_keys_are_validated_without_echoing_them(tmp_path: Path) -> None:
    good = generate_key()
    s = load_settings(write(tmp_path, f'[security]\nprevious_encryption_keys = ["{good}"]\n'))
    assert [k.get_secret_value() for k in s.security.previous_encryption_keys] == [good]
    for bad in ('["not-a-key-at-all"]', '"not-a-key-at-all"', "[42]"):
        with pytest.raises(ConfigError) as info:
            load_settings(write(tmp_path, f"[security]\nprevious_encryption_keys = {bad}\n"))
        assert "security.previous_encryption_keys" in info.value.message
        assert "not-a-key-at-all" not in info.value.message


def test_config_encryption_key_is_validated_at_load_without_echoing_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, '[security]\nencryption_key = "c2VjcmV0LXRvby1zaG9ydA"\n'))
    assert "security.encryption_key" in info.value.message
    assert "32 bytes" in info.value.message
    assert "c2VjcmV0LXRvby1zaG9ydA" not in info.value.message
