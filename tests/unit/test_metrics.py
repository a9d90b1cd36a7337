"""The per-attempt metrics, counted without prometheus-client's locks, read back
through prometheus-client's own parser of the exposition format."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from herald.metrics import Metrics
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


def test_exhausted_deliveries_and_failing_destinations() -> None:
    m = Metrics()
    m.signals_recorded(Recorded([], ["webhook", "webhook", "aws_sqs"]))
    m.failing_counted(2)
    got = samples(m)
    assert got["herald_deliveries_exhausted_total", (("type", "webhook"),)] == 2
    assert got["herald_deliveries_exhausted_total", (("type", "aws_sqs"),)] == 1
    assert got["herald_destinations_failing", ()] == 2
    m.failing_counted(0)
    assert samples(m)["herald_destinations_failing", ()] == 0
