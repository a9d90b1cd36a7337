"""API keys: made here, stored only as their SHA-256, looked up by that digest."""

from __future__ import annotations

import hashlib
import secrets

API_KEY_PREFIX = "sk_live_"


def new_api_key() -> str:
    """A new secret key, ``sk_live_`` and 256 random bits."""
    return API_KEY_PREFIX + secrets.token_urlsafe(32)


def hash_api_key(key: str) -> str:
    """What is stored and looked up: the key's SHA-256, in hex. Looking a key up by its
    digest never compares the key itself, so the lookup's timing says nothing about it."""
    return hashlib.sha256(key.encode()).hexdigest()
