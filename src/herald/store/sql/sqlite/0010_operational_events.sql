-- Operational events (herald.…): the signal state of each destination, updated in the
-- transaction that records the attempts causing it (SQLite's single writer keeps
-- the count and the episode consistent).
ALTER TABLE herald_destinations ADD COLUMN consecutive_failures INTEGER NOT NULL DEFAULT 0;
ALTER TABLE herald_destinations ADD COLUMN failing_since REAL;
ALTER TABLE herald_destinations ADD COLUMN verification_failed_at REAL;
ALTER TABLE herald_destinations ADD COLUMN verification_error TEXT;
-- For the herald_destinations_failing gauge: only destinations in an episode.
CREATE INDEX herald_destinations_failing ON herald_destinations (failing_since)
    WHERE failing_since IS NOT NULL AND deleted_at IS NULL;
-- Set by Herald alone on the operational events it writes into the outbox: the
-- destination the event is about (never delivered to it). A row of a herald.… type
-- without it is a producer's, and is rejected.
ALTER TABLE herald_outbox ADD COLUMN about_destination TEXT;
