-- herald_deliveries_pending (held, next_attempt_at) serves every query that
-- herald_deliveries_due (next_attempt_at) served: the claim, next_due_at and the
-- pending counts read it already. One index less to maintain on each delivery
-- written. (SQLite's 0008 also adds destination_id to the pending index, so that
-- its claim judges skipped destinations from the index; PostgreSQL filters such a
-- column only after fetching the row, so it gains nothing from it.)
DROP INDEX herald_deliveries_due;
