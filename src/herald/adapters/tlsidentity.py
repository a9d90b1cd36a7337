"""A webhook's own TLS: the client certificate it presents (mutual TLS) and the CA it
trusts for the receiver instead of the system's.

The PEM texts are checked when a destination is created or changed (each check
raises ValueError saying what is wrong, never quoting the key) and turned into one
``ssl.SSLContext`` per identity. aiohttp keys its connection pool on the context,
so :class:`Contexts` hands the same context to every destination with the same
identity and a different one otherwise: two destinations with different
certificates never share a connection.
"""

from __future__ import annotations

import hashlib
import os
import ssl
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa

__all__ = ["Contexts", "Identity", "check_ca", "check_certificate", "check_key", "key_matches"]

MAX_PEM_LENGTH = 65536
"""Characters of one PEM field (a certificate chain, a key or a CA bundle)."""

_KEY_TYPES = (rsa.RSAPrivateKey, ec.EllipticCurvePrivateKey, ed25519.Ed25519PrivateKey)


def _certificates(value: str) -> list[x509.Certificate]:
    if len(value) > MAX_PEM_LENGTH:
        raise ValueError(f"must be at most {MAX_PEM_LENGTH} characters")
    try:
        certs = x509.load_pem_x509_certificates(value.encode())
    except ValueError:
        raise ValueError("must be PEM certificates (-----BEGIN CERTIFICATE-----)") from None
    return certs


def check_certificate(value: str, *, now: datetime | None = None) -> x509.Certificate:
    """The leaf of a PEM certificate chain (the leaf first), refused when expired or not
    yet valid."""
    leaf = _certificates(value)[0]
    moment = now or datetime.now(UTC)
    if leaf.not_valid_after_utc <= moment:
        raise ValueError(f"the certificate expired on {leaf.not_valid_after_utc:%Y-%m-%d}")
    if leaf.not_valid_before_utc > moment:
        raise ValueError(
            f"the certificate is not valid before {leaf.not_valid_before_utc:%Y-%m-%d}"
        )
    return leaf


def check_key(
    value: str,
) -> rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey:
    """An unencrypted PEM private key (RSA, EC or Ed25519); ValueError otherwise, never
    quoting it."""
    if len(value) > MAX_PEM_LENGTH:
        raise ValueError(f"must be at most {MAX_PEM_LENGTH} characters")
    try:
        key = serialization.load_pem_private_key(value.encode(), password=None)
    except (ValueError, TypeError):
        raise ValueError(
            "must be an unencrypted PEM private key (-----BEGIN PRIVATE KEY-----)"
        ) from None
    except Exception:  # the backend's unsupported-algorithm error
        raise ValueError("must be an RSA, EC or Ed25519 private key") from None
    if isinstance(key, ed448.Ed448PrivateKey) or not isinstance(key, _KEY_TYPES):
        raise ValueError("must be an RSA, EC or Ed25519 private key")
    return key


def key_matches(certificate: str, key: str) -> bool:
    """Whether ``key`` is the private half of the leaf certificate's public key."""
    raw = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    public = _certificates(certificate)[0].public_key().public_bytes(der, raw)
    return check_key(key).public_key().public_bytes(der, raw) == public


def check_ca(value: str) -> None:
    """One or more PEM CA certificates."""
    _certificates(value)


@dataclass(frozen=True, slots=True)
class Identity:
    """What a destination's TLS is made of; None fields take the defaults."""

    certificate: str | None = None
    key: str | None = field(default=None, repr=False)
    ca: str | None = None

    def fingerprint(self) -> str:
        digest = hashlib.sha256()
        for part in (self.certificate, self.key, self.ca):
            digest.update(b"\x00" if part is None else b"\x01" + part.encode() + b"\x00")
        return digest.hexdigest()

    def context(self) -> ssl.SSLContext:
        """A client context verifying the receiver (against ``ca`` when set) and
        presenting the certificate when set."""
        context = (
            ssl.create_default_context(cadata=self.ca) if self.ca else ssl.create_default_context()
        )
        if self.certificate and self.key:
            # The ssl module reads a certificate chain from files only: written to a
            # private directory, loaded, and removed at once.
            with tempfile.TemporaryDirectory(prefix="herald-tls-") as folder:
                cert_path = os.path.join(folder, "cert.pem")
                key_path = os.path.join(folder, "key.pem")
                for path, text in ((cert_path, self.certificate), (key_path, self.key)):
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                    with os.fdopen(fd, "w") as out:
                        out.write(text)
                context.load_cert_chain(cert_path, key_path)
        return context


class Contexts:
    """One SSL context per identity, shared by the destinations that have it."""

    def __init__(self) -> None:
        self._contexts: dict[str, ssl.SSLContext] = {}
        self._used_by: dict[str, str] = {}

    def get(self, dest_id: str, identity: Identity) -> ssl.SSLContext:
        key = identity.fingerprint()
        self.forget(dest_id, keep=key)
        context = self._contexts.get(key)
        if context is None:
            context = self._contexts[key] = identity.context()
        self._used_by[dest_id] = key
        return context

    def forget(self, dest_id: str, *, keep: str | None = None) -> None:
        """``dest_id`` no longer uses its context; a context nobody uses is dropped
        (its idle connections close with the connector's cleanup)."""
        old = self._used_by.pop(dest_id, None)
        if old is not None and old != keep and old not in self._used_by.values():
            self._contexts.pop(old, None)
