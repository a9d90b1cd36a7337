-- A destination's payload filter (issue 27): the filter object as compact JSON, as the
-- caller gave it, or NULL for none. The relay compiles it when its catalog reloads and
-- fans an event out to the destination only when the event passes.
ALTER TABLE herald_destinations ADD COLUMN payload_filter TEXT;
