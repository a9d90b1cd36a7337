-- The flow lane (docs/flow-control.md). An event delivery of a destination under flow
-- control (a herald_flow row) is stored with flow = 1 and claimed per destination, as
-- far as its gate lets (the next token, the next probe), through
-- herald_deliveries_flow; the common claim reads flow = 0 alone. A backlog of 100,000
-- behind a shut gate was read row by row by every claim (a core at 50 deliveries/s);
-- now no claim reads it.
ALTER TABLE herald_deliveries ADD COLUMN flow INTEGER NOT NULL DEFAULT 0;
UPDATE herald_deliveries SET flow = 1 WHERE status = 'pending' AND kind = 'event'
    AND destination_id IN (SELECT destination_id FROM herald_flow);
DROP INDEX herald_deliveries_pending;
CREATE INDEX herald_deliveries_pending
    ON herald_deliveries (held, flow, next_attempt_at, destination_id)
    WHERE status = 'pending';
CREATE INDEX herald_deliveries_flow ON herald_deliveries (destination_id, next_attempt_at)
    WHERE status = 'pending' AND held = 0 AND flow = 1;
