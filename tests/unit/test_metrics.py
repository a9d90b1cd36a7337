"""The per-attempt metrics, counted without prometheus-client's locks, read back
through prometheus-client's own parser of the exposition format."""

from __future__ import annotations

import time
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from herald import metrics
from herald.metrics import DatabaseCounts, Metrics, replay_source
from herald.model import Recorded


def samples(m: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = m.exposition().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def attempt(m: Metrics, outcome: str, duration: float, **kw: object) -> None:
    args: dict[str, object] = {
        "destination_type": "webhook",
        "destination_id": "evtd_1",
        "outcome": outcome,
        "duration": duration,
        "final_status": None,
        "latency": None,
    }
    args.update(kw)
    m.attempts.observe(**args)  # type: ignore[arg-type]


def test_counters_and_histograms_add_up() -> None:
    m = Metrics()
    attempt(m, "success", 0.005, final_status="success", latency=0.2)  # exactly on a bound
    attempt(m, "success", 0.0051, final_status="success", latency=-1.0)  # clock skew
    attempt(m, "failure_retryable", 99.0)
    attempt(m, "timeout", 5.0, final_status="failure", destination_type="sqs")
    got = samples(m)
    wh = (("destination_type", "webhook"),)

    def attempts(type_id: str, outcome: str) -> float:
        key = (("destination_type", type_id), ("outcome", outcome))
        return got[("herald_delivery_attempts_total", key)]

    assert attempts("webhook", "success") == 2
    assert attempts("webhook", "failure_retryable") == 1
    assert attempts("sqs", "timeout") == 1
    done = (("destination_type", "webhook"), ("status", "success"))
    assert got[("herald_deliveries_completed_total", done)] == 2
    assert ("herald_deliveries_completed_total", (done[0], ("status", "failure"))) not in got
    sqs_failed = (("destination_type", "sqs"), ("status", "failure"))
    assert got[("herald_deliveries_completed_total", sqs_failed)] == 1

    def bucket(name: str, le: str) -> float:
        return got[(name, (*wh, ("le", le)))]

    duration = "herald_delivery_attempt_duration_seconds"
    assert bucket(duration + "_bucket", "0.005") == 1  # le is "less than or equal"
    assert bucket(duration + "_bucket", "0.01") == 2
    assert bucket(duration + "_bucket", "60.0") == 2
    assert bucket(duration + "_bucket", "+Inf") == 3
    assert got[(duration + "_count", wh)] == 3
    assert abs(got[(duration + "_sum", wh)] - 99.0101) < 1e-9
    latency = "herald_event_delivery_latency_seconds"
    assert bucket(latency + "_bucket", "0.01") == 1  # the negative latency counts as 0
    assert bucket(latency + "_bucket", "0.25") == 2
    assert got[(latency + "_count", wh)] == 2
    assert got[(latency + "_sum", wh)] == 0.2


def test_a_destination_label_only_when_asked_for() -> None:
    plain, per = Metrics(), Metrics(per_destination=True)
    for m in (plain, per):
        attempt(m, "success", 0.01, final_status="success")
    key = (("destination_type", "webhook"), ("outcome", "success"))
    assert samples(plain)[("herald_delivery_attempts_total", key)] == 1
    with_id = (("destination_id", "evtd_1"), *key)
    assert samples(per)[("herald_delivery_attempts_total", with_id)] == 1
    done = (("destination_id", "evtd_1"), ("destination_type", "webhook"), ("status", "success"))
    assert samples(per)[("herald_deliveries_completed_total", done)] == 1


def test_nothing_is_exposed_before_the_first_attempt() -> None:
    names = {name for name, _ in samples(Metrics())}
    assert not any(n.startswith("herald_delivery_attempt") for n in names)
    text = Metrics().exposition().decode()
    assert "# TYPE herald_delivery_attempts_total counter" in text  # described, no samples yet


# --- the database's health, and what the refresh reads from it -----------------------


def test_database_up_follows_every_components_last_round_trip(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    m = Metrics()
    db = ("herald_database_up", ())
    assert samples(m)[db] == 0  # no round trip yet: not known to be up
    m.database_result("relay", True)
    assert samples(m)[db] == 1
    m.database_result("recorder", False)
    m.database_result("relay", True)  # reads work, writes fail: still down
    assert samples(m)[db] == 0
    assert samples(m)[("herald_storage_errors_total", (("component", "recorder"),))] == 1
    m.database_result("recorder", True)
    assert samples(m)[db] == 1
    # An occasional caller's failure ends with anyone's success: it may not call again.
    m.database_result("api", False)
    assert samples(m)[db] == 0
    m.database_result("gauges", True)
    assert samples(m)[db] == 1
    # A loop's failure stops counting once it is old, if nothing renews it.
    m.database_result("heartbeat", False)
    clock[0] += metrics.DATABASE_FAILURE_MEMORY - 1
    assert samples(m)[db] == 0
    clock[0] += 2
    assert samples(m)[db] == 1


def test_component_up_is_read_at_scrape_time() -> None:
    m = Metrics()
    state = {"relay": True}
    m.track_components(relay=lambda: state["relay"], workers=lambda: True)
    key = ("herald_component_up", (("component", "relay"),))
    assert samples(m)[key] == 1
    state["relay"] = False
    assert samples(m)[key] == 0


def counts(**kw: Any) -> DatabaseCounts:
    args: dict[str, Any] = {
        "outbox_pending": 3,
        "outbox_oldest": 90.0,
        "deliveries": {"due": 2, "held": 1},
        "next_due_at": 40.0,
        "destinations": [("webhook", "active", 4)],
        "replays": {"cli": (2, 30), "api": (1, 5)},
    }
    args.update(kw)
    return DatabaseCounts(**args)


def test_database_counts_are_dropped_when_their_refresh_fails() -> None:
    m = Metrics()
    m.database_counted(counts(), now=100.0)
    got = samples(m)
    assert got[("herald_outbox_pending", (("source", "herald"),))] == 3
    assert got[("herald_outbox_lag_seconds", (("source", "herald"),))] == 10
    assert got[("herald_oldest_due_delivery_age_seconds", ())] == 60
    assert got[("herald_deliveries_pending", (("state", "due"),))] == 2
    assert got[("herald_deliveries_pending", (("state", "scheduled_retry"),))] == 0
    assert got[("herald_destinations", (("status", "active"), ("type", "webhook")))] == 4
    assert got[("herald_replays_total", (("source", "cli"),))] == 2
    assert got[("herald_deliveries_replayed_total", (("source", "cli"),))] == 30
    assert got[("herald_replays_total", (("source", "console"),))] == 0
    m.database_count_failed()
    names = {name for name, _ in samples(m)}
    for gone in ("herald_outbox_pending", "herald_deliveries_pending", "herald_destinations"):
        assert gone not in names  # stale in Prometheus, not frozen at 3
    m.database_counted(counts(next_due_at=None, outbox_oldest=None), now=100.0)
    got = samples(m)
    assert got[("herald_oldest_due_delivery_age_seconds", ())] == 0
    assert got[("herald_outbox_lag_seconds", (("source", "herald"),))] == 0
    # Due in the future (a retry not yet due): nothing waits.
    m.database_counted(counts(next_due_at=150.0), now=100.0)
    assert samples(m)[("herald_oldest_due_delivery_age_seconds", ())] == 0


def test_instances_are_dropped_when_the_heartbeat_fails() -> None:
    m = Metrics()
    m.instances_seen([], now=0, timeout=10)
    assert samples(m)[("herald_instances", ())] == 0
    m.instances_unknown()
    assert ("herald_instances", ()) not in samples(m)


def test_api_requests_by_route_method_and_status() -> None:
    m = Metrics()
    m.api_answered("/v2/event-deliveries/{id}", "GET", 404, 0.003)
    m.api_answered("/v2/event-deliveries/{id}", "GET", 404, 0.2)
    got = samples(m)
    route = (("method", "GET"), ("route", "/v2/event-deliveries/{id}"))
    assert got[("herald_api_requests_total", (*route[:1], route[1], ("status", "404")))] == 2
    assert got[("herald_api_request_duration_seconds_count", route)] == 2
    assert got[("herald_api_request_duration_seconds_bucket", (("le", "0.005"), *route))] == 1


def test_replay_sources_are_bounded() -> None:
    assert replay_source("cli:alice") == "cli"
    assert replay_source("api:tenant_1") == "api"
    assert replay_source("console:op") == "console"
    assert replay_source("service") == "other"
    assert replay_source("x" * 500) == "other"


def test_exhausted_deliveries_and_failing_destinations() -> None:
    m = Metrics()
    m.signals_recorded(Recorded([], ["webhook", "webhook", "aws_sqs"]))
    m.database_counted(counts(failing=2), now=100.0)
    got = samples(m)
    assert got["herald_deliveries_exhausted_total", (("type", "webhook"),)] == 2
    assert got["herald_deliveries_exhausted_total", (("type", "aws_sqs"),)] == 1
    assert got["herald_destinations_failing", ()] == 2
    m.database_counted(counts(failing=0), now=100.0)
    assert samples(m)["herald_destinations_failing", ()] == 0
    # Read with the other counts: dropped with them when the read fails.
    m.database_count_failed()
    assert ("herald_destinations_failing", ()) not in samples(m)


def test_an_open_circuit_is_labelled_by_its_destination() -> None:
    """Issue 26: ``herald_circuit_open{destination}``, only with per-destination metrics."""
    per = Metrics(per_destination=True)
    per.database_counted(counts(open_circuits=["evtd_a", "evtd_b"]), now=100.0)
    got = samples(per)
    assert got[("herald_circuits_open", ())] == 2
    assert got[("herald_circuit_open", (("destination", "evtd_a"),))] == 1
    assert got[("herald_circuit_open", (("destination", "evtd_b"),))] == 1
    plain = Metrics()
    plain.database_counted(counts(open_circuits=["evtd_a"]), now=100.0)
    assert not any(name == "herald_circuit_open" for name, _ in samples(plain))
