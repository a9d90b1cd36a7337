"""bench/capacity.py: the PostgreSQL fleet model of docs/scaling.md."""

from __future__ import annotations

import pytest
from bench.capacity import (
    CapacityError,
    Costs,
    Fleet,
    error,
    instances_until_postgres_bound,
    predict,
)

COSTS = Costs(instance_us=200.0, postgres_us=100.0, other_us=20.0, wal_bytes=2000.0)


def test_few_instances_are_the_limit() -> None:
    got = predict(COSTS, Fleet(instances=1, cores_per_instance=2, postgres_cores=8))
    assert got.limit == "instances"
    assert got.per_s == pytest.approx(10_000)
    assert got.caps["postgres"] == pytest.approx(80_000)
    assert got.connections == 10


def test_many_instances_make_postgres_the_limit() -> None:
    fleet = Fleet(instances=11, cores_per_instance=2, postgres_cores=8, instance_utilisation=0.8)
    got = predict(COSTS, fleet)
    assert got.caps["instances"] == pytest.approx(88_000)
    assert got.limit == "postgres"
    assert got.per_s == pytest.approx(80_000)
    assert instances_until_postgres_bound(COSTS, fleet) == 10


def test_wal_bandwidth_caps_when_given() -> None:
    fleet = Fleet(instances=10, cores_per_instance=2, postgres_cores=8, wal_bytes_per_s=50e6)
    got = predict(COSTS, fleet)
    assert got.limit == "wal"
    assert got.per_s == pytest.approx(25_000)


def test_one_host_shares_its_cores() -> None:
    fleet = Fleet(instances=2, cores_per_instance=1, postgres_cores=2, host_cores=2)
    got = predict(COSTS, fleet)
    assert got.limit == "host"
    assert got.per_s == pytest.approx(2e6 / 320)


def test_connections_beyond_max_are_refused() -> None:
    fleet = Fleet(
        instances=11, cores_per_instance=2, postgres_cores=8, pool_size=10, max_connections=100
    )
    with pytest.raises(CapacityError, match="110 connections > max_connections 100"):
        predict(COSTS, fleet)


@pytest.mark.parametrize(
    ("costs", "fleet"),
    [
        (COSTS, Fleet(instances=0, cores_per_instance=2, postgres_cores=8)),
        (Costs(instance_us=0, postgres_us=1), Fleet(1, 2, 8)),
        (COSTS, Fleet(1, 2, 8, instance_utilisation=1.5)),
    ],
)
def test_bad_inputs_are_refused(costs: Costs, fleet: Fleet) -> None:
    with pytest.raises(CapacityError):
        predict(costs, fleet)


def test_error_is_relative_to_the_measurement() -> None:
    assert error(110, 100) == pytest.approx(0.10)
    assert error(90, 100) == pytest.approx(-0.10)
    with pytest.raises(CapacityError):
        error(1, 0)
