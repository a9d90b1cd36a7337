"""Tests for herald.match."""

from __future__ import annotations

import random
from typing import Any

import pytest

from herald.errors import ValidationError
from herald.match import (
    SubscriptionIndex,
    validate_event_type,
    validate_pattern,
    validate_subscription,
)


@pytest.mark.parametrize(
    "value",
    [
        "a",
        "invoice",
        "invoice.paid",
        "workflow_run.step.done",
        "user-created.v2",
        "0.1.2",
        "_._",
        "a" * 128,
        ".".join(["ab"] * 42) + ".a",
    ],
)
def test_valid_event_types(value: str) -> None:
    assert validate_event_type(value) == value
    assert validate_pattern(value) == value


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("", "empty"),
        ("a" * 129, "longer than 128"),
        ("Invoice.paid", "lowercase"),
        ("invoice..paid", "segments"),
        (".invoice", "segments"),
        ("invoice.", "segments"),
        ("invoice paid", "segments"),
        ("invoice/paid", "segments"),
        ("invoice.*", "segments"),
        ("*", "segments"),
        ("inv*", "segments"),
        ("facture.payée", "segments"),
        ("invoice.paid\n", "segments"),
        ("ｉnvoice", "segments"),
    ],
)
def test_invalid_event_types(value: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        validate_event_type(value)


@pytest.mark.parametrize(
    "value",
    ["*", "invoice.*", "workflow_run.*", "workflow_run.step.*", "a" * 128 + ".*", "x-y_z.*"],
)
def test_valid_patterns(value: str) -> None:
    assert validate_pattern(value) == value


@pytest.mark.parametrize(
    "value",
    [
        "",
        "**",
        "*.*",
        ".*",
        "*.paid",
        "invoice.*.paid",
        "invoice.**",
        "invoice*",
        "invoice.*.*",
        "invoice..*",
        "Invoice.*",
        " *",
        "a" * 129,
        "a" * 129 + ".*",
        "invoice.#",
        "invoice.>",
    ],
)
def test_invalid_patterns(value: str) -> None:
    with pytest.raises(ValidationError, match="invalid pattern") as info:
        validate_pattern(value)
    assert info.value.code == "validation_error"


def test_invalid_pattern_message_is_bounded() -> None:
    with pytest.raises(ValidationError) as info:
        validate_pattern("A" * 1000)
    assert len(info.value.message) < 200


@pytest.fixture
def index() -> SubscriptionIndex[str]:
    idx: SubscriptionIndex[str] = SubscriptionIndex()
    idx.add("all", ["*"])
    idx.add("paid", ["invoice.paid"])
    idx.add("invoices", ["invoice.*"])
    idx.add("runs", ["workflow_run.*"])
    idx.add("steps", ["workflow_run.step.*"])
    idx.add("two", ["invoice.created", "user.deleted"])
    return idx


@pytest.mark.parametrize(
    ("event_type", "expected"),
    [
        ("invoice.paid", {"all", "paid", "invoices"}),
        ("invoice.created", {"all", "invoices", "two"}),
        ("invoice.paid.late", {"all", "invoices"}),
        ("invoice", {"all"}),
        ("invoices.paid", {"all"}),
        ("workflow_run.started", {"all", "runs"}),
        ("workflow_run.step.done", {"all", "runs", "steps"}),
        ("workflow_run.step", {"all", "runs"}),
        ("workflow_run", {"all"}),
        ("workflow_runx.a", {"all"}),
        ("user.deleted", {"all", "two"}),
        ("user.deleted.soft", {"all"}),
        ("other", {"all"}),
    ],
)
def test_match(index: SubscriptionIndex[str], event_type: str, expected: set[str]) -> None:
    assert index.match(event_type) == expected


def test_match_returns_a_fresh_set(index: SubscriptionIndex[str]) -> None:
    result = index.match("invoice.paid")
    result.clear()
    result.add("intruder")
    assert index.match("invoice.paid") == {"all", "paid", "invoices"}
    assert index.match("other") == {"all"}


def test_empty_index() -> None:
    idx: SubscriptionIndex[int] = SubscriptionIndex()
    assert len(idx) == 0
    assert idx.match("anything") == set()
    assert idx.match("a.b.c") == set()


def test_len_counts_keys_not_patterns(index: SubscriptionIndex[str]) -> None:
    assert len(index) == 6
    index.add("two", ["invoice.voided"])
    assert len(index) == 6
    assert index.match("invoice.voided") == {"all", "invoices", "two"}
    assert index.patterns("two") == {"invoice.created", "user.deleted", "invoice.voided"}


def test_duplicate_patterns_are_harmless() -> None:
    idx: SubscriptionIndex[str] = SubscriptionIndex()
    idx.add("k", ["a.b", "a.b", "a.*", "a.*"])
    assert idx.match("a.b") == {"k"}
    assert idx.patterns("k") == {"a.b", "a.*"}
    idx.remove("k")
    assert idx.match("a.b") == set()


def test_bad_pattern_leaves_index_untouched(index: SubscriptionIndex[str]) -> None:
    with pytest.raises(ValidationError):
        index.add("new", ["order.created", "Order.*"])
    assert len(index) == 6
    assert "new" not in index
    assert index.match("order.created") == {"all"}


def test_remove(index: SubscriptionIndex[str]) -> None:
    index.remove("invoices")
    index.remove("all")
    index.remove("never-added")
    assert len(index) == 4
    assert "invoices" not in index
    assert index.match("invoice.paid") == {"paid"}
    assert index.match("invoice.created") == {"two"}
    assert index.patterns("invoices") == frozenset()
    index.add("invoices", ["invoice.paid"])
    assert index.match("invoice.paid") == {"paid", "invoices"}
    assert index.match("invoice.created") == {"two"}


def test_remove_then_everything_is_empty(index: SubscriptionIndex[str]) -> None:
    for key in ["all", "paid", "invoices", "runs", "steps", "two"]:
        index.remove(key)
    assert len(index) == 0
    for event_type in ["invoice.paid", "workflow_run.step.done", "x"]:
        assert index.match(event_type) == set()


def test_hashable_keys_of_any_kind() -> None:
    idx: SubscriptionIndex[tuple[str, int]] = SubscriptionIndex()
    idx.add(("tenant", 1), ["a.*"])
    idx.add(("tenant", 2), ["a.b"])
    assert idx.match("a.b") == {("tenant", 1), ("tenant", 2)}


def naive_match(pattern: str, event_type: str) -> bool:
    if pattern == "*":
        return not event_type.startswith("herald.")
    if pattern.endswith(".*"):
        return event_type.startswith(pattern[:-1])
    return pattern == event_type


def test_agrees_with_naive_matcher() -> None:
    rng = random.Random(7)
    words = ["a", "b", "ab", "a_b", "b-a", "run", "runs", "herald", "heralds"]

    def rand_type() -> str:
        return ".".join(rng.choice(words) for _ in range(rng.randint(1, 4)))

    def rand_pattern() -> str:
        roll = rng.random()
        if roll < 0.05:
            return "*"
        if roll < 0.5:
            return rand_type() + ".*"
        return rand_type()

    subscriptions = {k: [rand_pattern() for _ in range(rng.randint(1, 3))] for k in range(300)}
    idx: SubscriptionIndex[int] = SubscriptionIndex()
    for key, pats in subscriptions.items():
        idx.add(key, pats)
    for _ in range(2000):
        event_type = rand_type()
        expected = {
            k for k, pats in subscriptions.items() if any(naive_match(p, event_type) for p in pats)
        }
        assert idx.match(event_type) == expected, event_type


class CountingDict(dict[str, Any]):
    """A dict that counts lookups, to check how much work one match does."""

    probes = 0

    def get(self, key: str, default: Any = None) -> Any:
        CountingDict.probes += 1
        return super().get(key, default)


@pytest.mark.parametrize("keys", [10, 5000])
def test_lookup_cost_follows_segments_not_keys(keys: int) -> None:
    idx: SubscriptionIndex[int] = SubscriptionIndex()
    for k in range(keys):
        idx.add(k, [f"type{k}.created", f"family{k}.*"])
    idx.add(-1, ["a.b.*"])
    idx._exact = CountingDict(idx._exact)
    idx._families = CountingDict(idx._families)
    CountingDict.probes = 0
    assert idx.match("a.b.c.d.e") == {-1}
    # One exact probe plus one family probe per proper prefix ("a", "a.b", "a.b.c", "a.b.c.d").
    assert CountingDict.probes == 5


# --- Herald's operational events (herald.…) -----------------------------------------
def test_the_wildcard_does_not_match_operational_events() -> None:
    idx: SubscriptionIndex[str] = SubscriptionIndex()
    idx.add("everything", ["*"])
    idx.add("all-signals", ["herald.*"])
    idx.add("destinations", ["herald.destination.*"])
    idx.add("exhausted", ["herald.delivery.exhausted"])
    idx.add("both", ["*", "herald.destination.failing"])
    assert idx.match("herald.delivery.exhausted") == {"all-signals", "exhausted"}
    assert idx.match("herald.destination.failing") == {"all-signals", "destinations", "both"}
    assert idx.match("herald.destination.recovered") == {"all-signals", "destinations"}
    # Only the prefix with its dot is reserved.
    assert idx.match("heralds.x") == {"everything", "both"}
    assert idx.match("herald") == {"everything", "both"}
    assert idx.match("a.b") == {"everything", "both"}


@pytest.mark.parametrize(
    "pattern",
    [
        "herald.*",
        "herald.destination.*",
        "herald.delivery.*",
        "herald.delivery.exhausted",
        "herald.destination.failing",
        "herald.destination.recovered",
        "herald.destination.verification_failed",
        "herald",
        "heralds.*",
        "*",
    ],
)
def test_subscriptions_to_operational_events(pattern: str) -> None:
    assert validate_subscription(pattern) == pattern


@pytest.mark.parametrize(
    "pattern",
    ["herald.delivery.exausted", "herald.destinations.*", "herald.foo", "herald.destination.x.*"],
)
def test_a_misspelt_operational_subscription_is_refused(pattern: str) -> None:
    with pytest.raises(ValidationError, match="unknown operational event pattern"):
        validate_subscription(pattern)
    # The index still takes it: a destination stored with it loads.
    assert validate_pattern(pattern) == pattern
