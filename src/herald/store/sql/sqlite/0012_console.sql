-- Operator keys open the web console; tenant keys (every key made before) the API.
-- A console session is stored by the SHA-256 of its id, as keys are: the cookie
-- itself is never in the database.
ALTER TABLE herald_api_keys ADD COLUMN kind TEXT NOT NULL DEFAULT 'tenant';

CREATE TABLE herald_console_sessions (
    id_hash    TEXT PRIMARY KEY,
    key_hash   TEXT NOT NULL,
    created_at REAL NOT NULL,
    last_seen  REAL NOT NULL
);
CREATE INDEX herald_console_sessions_key ON herald_console_sessions (key_hash);
CREATE INDEX herald_console_sessions_seen ON herald_console_sessions (last_seen);

-- The console's overview counts finished deliveries by outcome over the last hour
-- and day, and the destinations failing most, from this index alone (updated_at is
-- when a delivery finished).
CREATE INDEX herald_deliveries_outcomes ON herald_deliveries (updated_at, status, destination_id)
    WHERE status <> 'pending';

-- Failed deliveries, newest first, of every tenant: what an operator looks for. They
-- are few, so a walk of all ids for a page of them (with a time range, say) would
-- read the whole table (0.8 s at 1,000,000 deliveries); this index holds only them,
-- with created_at so that the range is checked in the index.
CREATE INDEX herald_deliveries_failed ON herald_deliveries (id, created_at)
    WHERE status = 'failure';
