"""Credentials at rest: AES-256-GCM tokens under the configured key.

A box encrypts under its current key and decrypts under that key or any previous
one, so a key rotation can re-encrypt rows in batches while every row stays readable
(:meth:`SecretBox.reencrypt`).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hmac
import os
import pathlib
import re
import secrets
import time
from collections.abc import Sequence

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from herald.errors import ConfigError, CryptoError

__all__ = ["SecretBox", "generate_key", "load_or_create_key_file", "parse_key"]

KEY_FIELD = "security.encryption_key"
_KEY_BYTES = 32
_NONCE_BYTES = 12
_TAG_BYTES = 16
_TOKEN_PREFIX = "v1."
_URLSAFE = re.compile(r"[A-Za-z0-9_-]+", re.ASCII)
_ANY_BASE64 = re.compile(r"[A-Za-z0-9+/_-]+={0,2}", re.ASCII)


_MAC_CONTEXT = b"herald mac v1"


def _mac(key: bytes, message: bytes) -> str:
    digest = hmac.digest(key, message, "sha256")
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def _b64_pad(text: str) -> str:
    return text + "=" * (-len(text) % 4)


class SecretBox:
    """Encrypts and decrypts small secrets, bound to caller-chosen associated data.

    ``previous`` keys only decrypt: tokens written under them stay readable after
    the current key has changed, until they are re-encrypted.
    """

    __slots__ = ("_aead", "_macs", "_previous")

    def __init__(self, key: bytes, previous: Sequence[bytes] = ()) -> None:
        for k in (key, *previous):
            if len(k) != _KEY_BYTES:
                raise ValueError(f"encryption key must be {_KEY_BYTES} bytes, got {len(k)}")
        self._aead = AESGCM(key)
        self._previous = tuple(AESGCM(k) for k in previous if k != key)
        # The MAC keys are derived, never the AES keys themselves: one key, two uses kept apart.
        self._macs = tuple(
            hmac.digest(k, _MAC_CONTEXT, "sha256") for k in dict.fromkeys((key, *previous))
        )

    def mac(self, message: bytes) -> str:
        """An HMAC-SHA256 tag of ``message`` under the current key (base64url, unpadded):
        only a holder of the key can make one, and :meth:`mac_matches` checks it."""
        return _mac(self._macs[0], message)

    def mac_matches(self, message: bytes, tag: str) -> bool:
        """Whether ``tag`` is :meth:`mac`'s of ``message`` under this box's current key
        or a previous one (a tag made before a key rotation still matches)."""
        return any(hmac.compare_digest(_mac(k, message), tag) for k in self._macs)

    def encrypt(self, plaintext: bytes, *, aad: bytes) -> str:
        """Encrypt to a ``v1.`` token; ``aad`` must be given again to decrypt."""
        # Random 96-bit nonces are safe for far more secrets than Herald will ever store.
        nonce = secrets.token_bytes(_NONCE_BYTES)
        sealed = nonce + self._aead.encrypt(nonce, plaintext, aad)
        return _TOKEN_PREFIX + base64.urlsafe_b64encode(sealed).rstrip(b"=").decode("ascii")

    def decrypt(self, token: str, *, aad: bytes) -> bytes:
        """Decrypt a token; raise CryptoError if it is malformed, tampered or under another key."""
        nonce, ciphertext = self._split(token)
        for aead in (self._aead, *self._previous):
            try:
                return aead.decrypt(nonce, ciphertext, aad)
            except InvalidTag:
                continue
        raise CryptoError(
            "stored secret could not be decrypted: wrong encryption key or corrupted data"
        )

    def reencrypt(self, token: str, *, aad: bytes) -> str | None:
        """The token re-encrypted under the current key; None if it already is under it.

        Raises CryptoError when no key of this box opens the token.
        """
        nonce, ciphertext = self._split(token)
        try:
            self._aead.decrypt(nonce, ciphertext, aad)
        except InvalidTag:
            return self.encrypt(self.decrypt(token, aad=aad), aad=aad)
        return None

    @staticmethod
    def _split(token: str) -> tuple[bytes, bytes]:
        if not token.startswith(_TOKEN_PREFIX):
            raise CryptoError("stored secret has an unknown format")
        body = token[len(_TOKEN_PREFIX) :]
        # urlsafe_b64decode silently skips stray characters, so check the alphabet first.
        if _URLSAFE.fullmatch(body) is None:
            raise CryptoError("stored secret is not valid base64")
        try:
            sealed = base64.urlsafe_b64decode(_b64_pad(body))
        except binascii.Error:
            raise CryptoError("stored secret is not valid base64") from None
        if len(sealed) < _NONCE_BYTES + _TAG_BYTES:
            raise CryptoError("stored secret is truncated")
        return sealed[:_NONCE_BYTES], sealed[_NONCE_BYTES:]


def generate_key() -> str:
    """A new key: URL-safe base64 of 32 random bytes."""
    return base64.urlsafe_b64encode(secrets.token_bytes(_KEY_BYTES)).decode("ascii")


def parse_key(text: str) -> bytes:
    """Decode a key given in URL-safe or standard base64, padded or not; must be 32 bytes."""
    stripped = text.strip()
    if _ANY_BASE64.fullmatch(stripped) is None:
        raise ConfigError(
            "encryption key must be base64 (URL-safe or standard) of 32 bytes", field=KEY_FIELD
        )
    normalized = stripped.rstrip("=").replace("-", "+").replace("_", "/")
    try:
        key = base64.b64decode(_b64_pad(normalized), validate=True)
    except binascii.Error:
        raise ConfigError("encryption key is not valid base64", field=KEY_FIELD) from None
    if len(key) != _KEY_BYTES:
        raise ConfigError(
            f"encryption key must decode to {_KEY_BYTES} bytes, got {len(key)}; "
            "generate one with 32 random bytes",
            field=KEY_FIELD,
        )
    return key


def read_key_file(path: pathlib.Path) -> bytes:
    """The key in an existing key file; ConfigError naming the file if it is unusable."""
    try:
        text = path.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read key file {path}: {exc}", field=KEY_FIELD) from None
    try:
        return parse_key(text)
    except ConfigError as exc:
        raise ConfigError(f"key file {path}: {exc.message}", field=KEY_FIELD) from None


def load_or_create_key_file(path: pathlib.Path) -> bytes:
    """Read the key in ``path``, or create the file (mode 0600) with a new key.

    Creation publishes a complete file in one step (written under a temporary name, then
    hard-linked into place), so a process racing to create the same file reads either
    nothing or the whole key; the loser of the race uses the winner's key.
    """
    if path.exists():
        return read_key_file(path)
    text = generate_key()
    data = (text + "\n").encode("ascii")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        created = _publish(path, data)
    except OSError as exc:
        raise ConfigError(f"cannot create key file {path}: {exc}", field=KEY_FIELD) from None
    if not created:
        return read_key_file(path)
    return parse_key(text)


def _publish(path: pathlib.Path, data: bytes) -> bool:
    """Create ``path`` holding ``data`` unless it exists; False if another process won."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    try:
        _write_new(tmp, data)
        try:
            # link() fails if the target exists, unlike rename(), which would replace a key
            # another process may already be using.
            os.link(tmp, path)
        except FileExistsError:
            return False
        except OSError:
            # No hard links on this filesystem: create the file itself exclusively instead.
            try:
                _write_new(path, data)
            except FileExistsError:
                _wait_for_content(path)
                return False
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    # Make the new directory entry durable too; best effort where directories can't sync.
    with contextlib.suppress(OSError):
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    return True


def _write_new(path: pathlib.Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _wait_for_content(path: pathlib.Path) -> None:
    """Give a racing creator that writes in place a moment to finish its write."""
    for _ in range(50):
        with contextlib.suppress(OSError):
            if path.read_bytes().endswith(b"\n"):
                return
        time.sleep(0.01)
