"""The capacity model of docs/scaling.md: deliveries/s of N Herald instances on one PostgreSQL.

Pure arithmetic, unit-tested in ``tests/unit/test_bench_capacity.py``; ``bench
postgres`` feeds it the CPU per delivery it measured with the smallest fleet
and prints its prediction for the larger ones beside what they measured.

Each resource caps the fleet's rate; the prediction is the smallest cap, and
``limit`` names it:

- ``instances``: ``N × C × u × 10⁶ / instance_us`` — N instances of C cores,
  each spending ``instance_us`` µs of CPU per delivery (daemon and attempt
  processes), of which they keep a fraction ``u`` busy (``u`` < 1: an instance
  also waits on PostgreSQL's round trips and the receiver);
- ``postgres``: ``P × u_pg × 10⁶ / postgres_us`` — PostgreSQL's P cores at
  ``postgres_us`` µs per delivery in its backends (plus its WAL writer, etc.
  when measured);
- ``wal``: the WAL device's bytes/s over WAL bytes per delivery (when given);
- ``host``: when everything shares one host of K cores (this benchmark's
  machine), ``K × 10⁶ / (instance_us + postgres_us + other_us)``, other_us
  being the receiver's and anything else's CPU per delivery there.

Connections: N × the pool size must fit in ``max_connections`` (less what
else uses it); a fleet that does not fit is refused with
:class:`CapacityError` rather than predicted.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class CapacityError(ValueError):
    """A fleet the model cannot predict: bad inputs, or more connections than allowed."""


@dataclass(frozen=True, slots=True)
class Costs:
    """What one delivery costs, measured (``bench postgres``)."""

    instance_us: float
    """CPU µs per delivery of one instance's processes (daemon + attempt processes)."""
    postgres_us: float
    """CPU µs per delivery of PostgreSQL (its backends serving Herald)."""
    other_us: float = 0.0
    """CPU µs per delivery of whatever else shares a host with them (the receiver)."""
    wal_bytes: float = 0.0
    """WAL bytes per delivery (0: not measured; no WAL cap)."""


@dataclass(frozen=True, slots=True)
class Fleet:
    instances: int
    cores_per_instance: float
    postgres_cores: float
    instance_utilisation: float = 1.0
    """The busy fraction of an instance's cores at full load (measured: CPU ÷ wall ÷ C)."""
    postgres_utilisation: float = 1.0
    host_cores: float | None = None
    """All of it on one host of this many cores (None: separate machines)."""
    wal_bytes_per_s: float | None = None
    """What the WAL device sustains (None: not a limit)."""
    pool_size: int = 10
    """``database.pool_size``: connections one instance may open."""
    max_connections: int | None = None
    """PostgreSQL's ``max_connections`` less what else needs (None: not checked)."""


@dataclass(frozen=True, slots=True)
class Prediction:
    per_s: float
    limit: str
    """The resource with the smallest cap."""
    caps: dict[str, float] = field(default_factory=dict)
    connections: int = 0


def predict(costs: Costs, fleet: Fleet) -> Prediction:
    """Deliveries per second of ``fleet`` at ``costs``: the smallest of the caps."""
    if fleet.instances < 1 or fleet.cores_per_instance <= 0 or fleet.postgres_cores <= 0:
        raise CapacityError(f"a fleet needs instances, cores and PostgreSQL cores: {fleet}")
    if costs.instance_us <= 0 or costs.postgres_us < 0 or costs.other_us < 0:
        raise CapacityError(f"CPU per delivery must be positive: {costs}")
    if not 0 < fleet.instance_utilisation <= 1 or not 0 < fleet.postgres_utilisation <= 1:
        raise CapacityError("utilisations are fractions in (0, 1]")
    connections = fleet.instances * fleet.pool_size
    if fleet.max_connections is not None and connections > fleet.max_connections:
        raise CapacityError(
            f"{fleet.instances} instances × pool_size {fleet.pool_size} = {connections}"
            f" connections > max_connections {fleet.max_connections}: lower"
            " database.pool_size or put a pooler in front"
        )
    caps = {
        "instances": fleet.instances
        * fleet.cores_per_instance
        * fleet.instance_utilisation
        * 1e6
        / costs.instance_us
    }
    if costs.postgres_us > 0:
        caps["postgres"] = (
            fleet.postgres_cores * fleet.postgres_utilisation * 1e6 / costs.postgres_us
        )
    if fleet.wal_bytes_per_s is not None and costs.wal_bytes > 0:
        caps["wal"] = fleet.wal_bytes_per_s / costs.wal_bytes
    if fleet.host_cores is not None:
        total = costs.instance_us + costs.postgres_us + costs.other_us
        caps["host"] = fleet.host_cores * 1e6 / total
    limit = min(caps, key=lambda k: caps[k])
    return Prediction(
        round(caps[limit], 1), limit, {k: round(v, 1) for k, v in caps.items()}, connections
    )


def instances_until_postgres_bound(costs: Costs, fleet: Fleet) -> int:
    """The smallest N at which PostgreSQL's cap is no longer above the instances' (N ≥ 1)."""
    if costs.postgres_us <= 0:
        raise CapacityError("PostgreSQL's CPU per delivery is needed")
    per_instance = fleet.cores_per_instance * fleet.instance_utilisation * 1e6 / costs.instance_us
    pg_cap = fleet.postgres_cores * fleet.postgres_utilisation * 1e6 / costs.postgres_us
    n = 1
    while n * per_instance < pg_cap:
        n += 1
    return n


def error(predicted: float, measured: float) -> float:
    """The prediction's relative error, (predicted − measured) ÷ measured."""
    if measured <= 0:
        raise CapacityError("nothing measured")
    return (predicted - measured) / measured
