-- Operator keys open the web console; tenant keys (every key made before) the API.
-- A console session is stored by the SHA-256 of its id, as keys are: the cookie
-- itself is never in the database.
ALTER TABLE herald_api_keys ADD COLUMN kind text NOT NULL DEFAULT 'tenant';

CREATE TABLE herald_console_sessions (
    id_hash    text PRIMARY KEY,
    key_hash   text NOT NULL,
    created_at double precision NOT NULL,
    last_seen  double precision NOT NULL
);
CREATE INDEX herald_console_sessions_key ON herald_console_sessions (key_hash);
CREATE INDEX herald_console_sessions_seen ON herald_console_sessions (last_seen);

-- The console's overview counts finished deliveries by outcome over the last hour
-- and day, and the destinations failing most, from this index alone (updated_at is
-- when a delivery finished).
CREATE INDEX herald_deliveries_outcomes ON herald_deliveries (updated_at, status, destination_id)
    WHERE status <> 'pending';

-- (SQLite also indexes the failed deliveries alone, for a newest-first page of them
-- within a time range; PostgreSQL answers that page in about 150 ms at 1,000,000
-- deliveries without one, and its planner would AND such an index into the counts
-- of a replay's dry run.)
