-- Counting pending deliveries by state (metrics) without scanning finished ones.
CREATE INDEX herald_deliveries_pending ON herald_deliveries (held, next_attempt_at)
    WHERE status = 'pending';
