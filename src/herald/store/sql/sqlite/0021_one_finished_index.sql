-- Retention reads the oldest finished deliveries through herald_deliveries_outcomes
-- (0012: updated_at, status, destination_id over the same finished rows), which
-- leads with the column herald_deliveries_finished (0004: updated_at alone) held.
-- The older index only cost one more entry to write for every finished delivery.
DROP INDEX herald_deliveries_finished;
