"""Access: who may call Herald, and how often — one room for the API, the console, the
portal and the CLI alike.

- :mod:`~herald.access.keys`: API keys and operator keys (create, list, revoke, the
  credentials' re-encryption) and the one lookup of a key by its digest, cached for at
  most ``KEY_CACHE_SECONDS`` (1 s): a revoked key is refused by every face of every
  instance within that bound;
- :mod:`~herald.access.sessions`: operator sessions (the console's sign-in);
- :mod:`~herald.access.tokens`: session tokens and the portal's sessions on them;
- :mod:`~herald.access.idempotency`: the API's idempotency records;
- :mod:`~herald.access.ratelimit`: the rate budgets (per tenant or operator key, and
  per client address without a valid key), which the console shares with the API.

The store's access part (``herald.store.access``) is the SQL under it; no face reaches
the store for any of this.
"""

from __future__ import annotations

from herald.access.idempotency import Idempotency
from herald.access.keys import Keys
from herald.access.ratelimit import RateLimiter, request_limiters
from herald.access.sessions import Sessions
from herald.access.tokens import Tokens
from herald.config import Settings
from herald.store import Store
from herald.store.base import ApiKeyInfo


class Access:
    """Who may call, for one process: built once (``herald.wiring.components``) and
    handed to every face, so that they share one key cache and one set of budgets."""

    def __init__(self, store: Store, settings: Settings) -> None:
        self.keys = Keys(store)
        self.sessions = Sessions(store, settings.console, keys=self.keys)
        self.tokens = Tokens(store)
        self.idempotency = Idempotency(store, ttl=settings.api.idempotency_ttl_seconds)
        limiter, anonymous = request_limiters(
            settings.api, counter=store.count_request if store.shared else None
        )
        self.limiter: RateLimiter = limiter
        """Requests per tenant (the API, the portal) or operator key (the console)."""
        self.anonymous: RateLimiter = anonymous
        """Requests without a valid key, and failed sign-ins, per client address."""


__all__ = ["Access", "ApiKeyInfo", "Keys"]
