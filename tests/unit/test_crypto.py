"""Tests for herald.crypto."""

from __future__ import annotations

import base64
import os
import pathlib
import stat
import threading
from collections.abc import Callable, Iterator

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from herald.crypto import SecretBox, generate_key, load_or_create_key_file, parse_key
from herald.errors import ConfigError, CryptoError

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))
AAD = b"endpoint:ep_123:secret"


def b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@pytest.fixture
def box() -> SecretBox:
    return SecretBox(KEY)


@pytest.mark.parametrize("plaintext", [b"", b"x", b"whsec_" + b"A" * 43, bytes(range(256)) * 8])
def test_roundtrip(box: SecretBox, plaintext: bytes) -> None:
    assert box.decrypt(box.encrypt(plaintext, aad=AAD), aad=AAD) == plaintext


def test_token_format(box: SecretBox) -> None:
    plaintext = b"secret value"
    token = box.encrypt(plaintext, aad=AAD)
    assert token.startswith("v1.")
    body = token[3:]
    assert "=" not in body
    assert set(body) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    sealed = b64url_decode(body)
    assert len(sealed) == 12 + len(plaintext) + 16
    # Independently decrypt: nonce first, then AES-GCM ciphertext with tag.
    assert AESGCM(KEY).decrypt(sealed[:12], sealed[12:], AAD) == plaintext


def test_fresh_nonce_each_time(box: SecretBox) -> None:
    tokens = {box.encrypt(b"same", aad=AAD) for _ in range(50)}
    assert len(tokens) == 50
    nonces = {b64url_decode(t[3:])[:12] for t in tokens}
    assert len(nonces) == 50


def test_wrong_key_fails(box: SecretBox) -> None:
    token = box.encrypt(b"secret", aad=AAD)
    with pytest.raises(CryptoError, match="wrong encryption key") as info:
        SecretBox(OTHER_KEY).decrypt(token, aad=AAD)
    assert info.value.code == "decryption_failed"


def test_wrong_aad_fails(box: SecretBox) -> None:
    token = box.encrypt(b"secret", aad=AAD)
    with pytest.raises(CryptoError):
        box.decrypt(token, aad=b"endpoint:ep_456:secret")
    with pytest.raises(CryptoError):
        box.decrypt(token, aad=b"")


def test_every_tampered_byte_is_detected(box: SecretBox) -> None:
    token = box.encrypt(b"tamper me", aad=AAD)
    sealed = b64url_decode(token[3:])
    for i in range(len(sealed)):
        mutated = bytearray(sealed)
        mutated[i] ^= 0x01
        forged = "v1." + base64.urlsafe_b64encode(bytes(mutated)).rstrip(b"=").decode()
        with pytest.raises(CryptoError):
            box.decrypt(forged, aad=AAD)


@pytest.mark.parametrize(
    "token",
    [
        "",
        "v1.",
        "v2.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        "V1.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        "v1.AAAA",
        "v1." + "A" * 37,
        "v1.A",
        "v1.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA+AAAAAAAAAAA",
        "v1.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA/AAAAAAAAAAA",
        "v1.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA==",
        "v1.AAAAAAAAAAAAAAAAAAAAAAAA AAAAAAAAAAAAAAAAAAAAAAAAAAA",
        "v1.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\n",
        "v1.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
    ],
)
def test_malformed_tokens_fail(box: SecretBox, token: str) -> None:
    with pytest.raises(CryptoError):
        box.decrypt(token, aad=AAD)


def test_stray_characters_are_not_ignored(box: SecretBox) -> None:
    token = box.encrypt(b"secret", aad=AAD)
    # The lenient base64 decoder would drop these four characters and decrypt fine.
    for stray in ["!!!!", "\n\n\n\n", "....", "  \t "]:
        with pytest.raises(CryptoError, match="not valid base64"):
            box.decrypt(token[:10] + stray + token[10:], aad=AAD)


@pytest.mark.parametrize("size", [0, 16, 24, 31, 33, 64])
def test_key_must_be_32_bytes(size: int) -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        SecretBox(bytes(size))


def test_generate_key() -> None:
    first, second = generate_key(), generate_key()
    assert first != second
    assert len(b64url_decode(first)) == 32
    assert parse_key(first) == b64url_decode(first)


@pytest.mark.parametrize(
    "encode",
    [
        lambda raw: base64.urlsafe_b64encode(raw).decode(),
        lambda raw: base64.urlsafe_b64encode(raw).decode().rstrip("="),
        lambda raw: base64.b64encode(raw).decode(),
        lambda raw: base64.b64encode(raw).decode().rstrip("="),
        lambda raw: "  " + base64.b64encode(raw).decode() + "\n",
    ],
)
def test_parse_key_accepted_encodings(encode: Callable[[bytes], str]) -> None:
    # These bytes encode with "+", "/" (standard) or "-", "_" (URL-safe) characters.
    raw = bytes([0xFB, 0xFF, 0xBF] * 10 + [0xFE, 0xFF])
    assert parse_key(encode(raw)) == raw


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "must be base64"),
        ("   ", "must be base64"),
        ("not base64!", "must be base64"),
        ("AAAA===", "must be base64"),
        ("A" * 40, "must decode to 32 bytes, got 30"),
        (base64.b64encode(bytes(31)).decode(), "got 31"),
        (base64.b64encode(bytes(33)).decode(), "got 33"),
        (base64.b64encode(bytes(16)).decode(), "got 16"),
        ("A" * 41, "not valid base64"),
        ("AAAA=AAA", "must be base64"),
    ],
)
def test_parse_key_rejects(text: str, reason: str) -> None:
    with pytest.raises(ConfigError, match=reason) as info:
        parse_key(text)
    assert info.value.field == "security.encryption_key"
    assert info.value.code == "config_invalid"


@pytest.fixture
def open_umask() -> Iterator[None]:
    """Clear the umask so the file mode seen is the one the code asked for."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.usefixtures("open_umask")
def test_creates_key_file_with_mode_0600(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "keys" / "herald.key"
    key = load_or_create_key_file(path)
    assert len(key) == 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert parse_key(path.read_text()) == key
    # Nothing but the key file is left behind.
    assert [p.name for p in path.parent.iterdir()] == ["herald.key"]


def test_reuses_existing_key_file(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "herald.key"
    first = load_or_create_key_file(path)
    assert load_or_create_key_file(path) == first
    assert SecretBox(first).decrypt(SecretBox(first).encrypt(b"x", aad=b""), aad=b"") == b"x"


def test_reads_hand_written_key_file(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "herald.key"
    path.write_text(base64.b64encode(KEY).decode() + "\n")
    path.chmod(0o644)
    assert load_or_create_key_file(path) == KEY
    # An existing file is read as it is; its mode is left alone.
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


@pytest.mark.parametrize("content", ["", "garbage", base64.b64encode(bytes(16)).decode()])
def test_invalid_key_file(tmp_path: pathlib.Path, content: str) -> None:
    path = tmp_path / "herald.key"
    path.write_text(content)
    with pytest.raises(ConfigError, match=r"herald\.key") as info:
        load_or_create_key_file(path)
    assert info.value.field == "security.encryption_key"
    assert path.read_text() == content


def test_unreadable_key_path(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "herald.key"
    path.mkdir()
    with pytest.raises(ConfigError, match="cannot read key file"):
        load_or_create_key_file(path)


def test_uncreatable_key_path(tmp_path: pathlib.Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="cannot create key file"):
        load_or_create_key_file(blocker / "herald.key")


class LateExistsPath(type(pathlib.Path())):  # type: ignore[misc]
    """A path whose existence check always says no, as if another process was faster."""

    def exists(self) -> bool:
        return False


def test_race_loser_reads_winners_key(tmp_path: pathlib.Path) -> None:
    winner = tmp_path / "herald.key"
    winner_key = load_or_create_key_file(winner)
    loser = LateExistsPath(winner)
    assert load_or_create_key_file(loser) == winner_key
    assert parse_key(winner.read_text()) == winner_key
    assert [p.name for p in tmp_path.iterdir()] == ["herald.key"]


def test_many_threads_agree_on_one_key(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "herald.key"
    barrier = threading.Barrier(16)
    results: list[bytes] = []
    lock = threading.Lock()

    def worker() -> None:
        barrier.wait()
        key = load_or_create_key_file(LateExistsPath(path))
        with lock:
            results.append(key)

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 16
    assert set(results) == {parse_key(path.read_text())}
    assert [p.name for p in tmp_path.iterdir()] == ["herald.key"]


@pytest.mark.usefixtures("open_umask")
def test_without_hard_links_creates_file_directly(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_link(src: object, dst: object) -> None:
        raise PermissionError("hard links not supported")

    monkeypatch.setattr(os, "link", no_link)
    path = tmp_path / "herald.key"
    key = load_or_create_key_file(path)
    assert parse_key(path.read_text()) == key
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["herald.key"]
    # A racing creator on such a filesystem still ends up with the existing key.
    assert load_or_create_key_file(LateExistsPath(path)) == key
