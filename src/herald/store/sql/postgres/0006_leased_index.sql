-- Only the deliveries leased right now: releasing an instance's leases (at start,
-- at stop, when a peer reaps a dead one) finds them without walking every pending
-- delivery, which took over a second with a million scheduled retries.
CREATE INDEX herald_deliveries_leased ON herald_deliveries (lease_owner)
    WHERE lease_owner IS NOT NULL;
