-- A producer's W3C trace context (issue 17): the `traceparent` it wrote beside the event,
-- kept with the stored event so that a retry hours later still continues its trace.
-- Optional: NULL for every event written before, and for producers that do not trace.
-- An invalid value never rejects the row: the relay stores the event without it.
ALTER TABLE herald_outbox ADD COLUMN traceparent text;
ALTER TABLE herald_events ADD COLUMN traceparent text;
