-- Running instances and their heartbeats: a peer that stops beating is presumed dead
-- and its leased deliveries are released without waiting for the leases to run out.
CREATE TABLE herald_instances (
    id           text PRIMARY KEY,
    hostname     text NOT NULL,
    pid          integer NOT NULL,
    version      text NOT NULL,
    started_at   double precision NOT NULL,
    heartbeat_at double precision NOT NULL
);
