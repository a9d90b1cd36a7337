"""How many examples a property test tries.

``make test`` runs each property test's full count; ``make test-fast`` (the lane a
developer runs many times a day, ``HERALD_TEST_FAST=1``) a quarter of it, new
examples every run all the same. No deadline in either: a loaded machine makes one
example slow, which is not a failure of the code under test.
"""

from __future__ import annotations

import os

FAST = os.environ.get("HERALD_TEST_FAST") == "1"


def examples(full: int) -> int:
    """``full`` examples, or a quarter of them (at least 10) in the fast lane."""
    return max(10, full // 4) if FAST else full
