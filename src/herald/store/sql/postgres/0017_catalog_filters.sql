-- A destination's payload filter (issue 27): the filter object as compact JSON, as the
-- caller gave it, or NULL for none. The relay compiles it when its catalog reloads and
-- fans an event out to the destination only when the event passes.
ALTER TABLE herald_destinations ADD COLUMN payload_filter TEXT;

-- A filter's test (POST /v2/event-destinations/{id}/filter/test) reads the tenant's
-- newest events, newest first.
CREATE INDEX herald_events_tenant_ingested ON herald_events (tenant_id, ingested_at);
