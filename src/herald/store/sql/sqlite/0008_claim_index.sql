-- The claim skips destinations at their concurrency limit (destination_id NOT IN
-- (...)). With destination_id in the pending index, the rows it skips are judged
-- from the index alone: a slow destination's 4,500 due deliveries cost each claim
-- 0.3 ms instead of 1.5 ms (a row fetched for each). The index covers every query
-- that herald_deliveries_due served (the claim, next_due_at, the pending counts),
-- which goes: one index less to maintain on each delivery written.
DROP INDEX herald_deliveries_due;
DROP INDEX herald_deliveries_pending;
CREATE INDEX herald_deliveries_pending ON herald_deliveries (held, next_attempt_at, destination_id)
    WHERE status = 'pending';
