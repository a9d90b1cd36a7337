-- Retention deletes finished deliveries by age, oldest first, in batches.
CREATE INDEX herald_deliveries_finished ON herald_deliveries (updated_at)
    WHERE status <> 'pending';
CREATE INDEX herald_events_ingested ON herald_events (ingested_at);
