-- Flow control per destination (docs/flow-control.md): its rate limit and circuit
-- breaker, and their state, shared by every instance. A row only for a destination
-- that has ever had either; the claim and the recorder lock it last, after the
-- deliveries (lock order: destination, deliveries, flow).
--
-- tat: the rate's token bucket as a GCRA's theoretical arrival time (epoch seconds).
-- circuit: closed, open or half_open (its one probe is out). gate_until: no claim
-- takes the destination's event deliveries before it (the next token, or the next
-- probe), so its backlog occupies no claim while it waits.
CREATE TABLE herald_flow (
    destination_id TEXT PRIMARY KEY,
    rate           double precision,
    breaker        integer NOT NULL DEFAULT 0,
    tat            double precision NOT NULL DEFAULT 0,
    circuit        text NOT NULL DEFAULT 'closed',
    opened_at      double precision,
    next_probe_at  double precision,
    cooldown       double precision,
    gate_until     double precision NOT NULL DEFAULT 0
);
