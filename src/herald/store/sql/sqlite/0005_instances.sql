-- Running instances and their heartbeats: a peer that stops beating is presumed dead
-- and its leased deliveries are released without waiting for the leases to run out.
CREATE TABLE herald_instances (
    id           TEXT PRIMARY KEY,
    hostname     TEXT NOT NULL,
    pid          INTEGER NOT NULL,
    version      TEXT NOT NULL,
    started_at   REAL NOT NULL,
    heartbeat_at REAL NOT NULL
);
