"""API keys: made here, stored only as their SHA-256, looked up by that digest.

Two kinds: a tenant key (``sk_live_…``) opens the REST API for its tenant; an
operator key (``sk_op_…``) opens the web console, for every tenant, and nothing
else. The kind is stored with the hash, so a tenant key never opens the console
whatever it looks like.
"""

from __future__ import annotations

import hashlib
import secrets

API_KEY_PREFIX = "sk_live_"
OPERATOR_KEY_PREFIX = "sk_op_"
TENANT_KIND = "tenant"
OPERATOR_KIND = "operator"
OPERATOR_TENANT = ""
"""The tenant column of an operator key: it belongs to no tenant."""

KEY_ID_LENGTH = 12
"""A key is named by the first hex digits of its SHA-256 (the key itself is gone)."""


def new_api_key(*, operator: bool = False) -> str:
    """A new secret key, its kind's prefix and 256 random bits."""
    return (OPERATOR_KEY_PREFIX if operator else API_KEY_PREFIX) + secrets.token_urlsafe(32)


def hash_api_key(key: str) -> str:
    """What is stored and looked up: the key's SHA-256, in hex. Looking a key up by its
    digest never compares the key itself, so the lookup's timing says nothing about it."""
    return hashlib.sha256(key.encode()).hexdigest()


def key_id(key_hash: str) -> str:
    """The name a key goes by in lists, logs and audit lines."""
    return key_hash[:KEY_ID_LENGTH]
