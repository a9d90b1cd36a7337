-- Per-destination counters, kept by the recorder in the transaction that records the
-- attempts (never counted from herald_deliveries): the console's destination list
-- and page, and `herald destinations show`, read them by primary key.
--
-- Every attempt counts (event deliveries, verifications, test pings): each says
-- whether the destination answered. One row per destination and hour (hours since
-- the epoch, of the attempt's start) with its successful and failed attempts: the
-- failure rate over the last 24 hours sums at most 24 rows, and the destination
-- page's chart draws them. Retention's purge deletes the hours older than its cut-off.
-- Concurrent recorders upsert these rows last in their transaction, in destination
-- order, so they cannot deadlock on them.
CREATE TABLE herald_destination_hours (
    destination_id text COLLATE "C" NOT NULL,
    hour           bigint NOT NULL,
    successes      integer NOT NULL DEFAULT 0,
    failures       integer NOT NULL DEFAULT 0,
    PRIMARY KEY (destination_id, hour)
);
CREATE INDEX herald_destination_hours_hour ON herald_destination_hours (hour);

-- When each destination last answered well and badly (attempt start times); one row
-- per destination that has had an attempt, never purged (it is one row).
CREATE TABLE herald_destination_stats (
    destination_id  text COLLATE "C" PRIMARY KEY,
    last_success_at double precision,
    last_failure_at double precision
);

-- A replay the daemon stopped before it had re-queued everything says so: its
-- finished_at is when it stopped and requeued how far it got.
ALTER TABLE herald_replays ADD COLUMN cut_short boolean NOT NULL DEFAULT false;
