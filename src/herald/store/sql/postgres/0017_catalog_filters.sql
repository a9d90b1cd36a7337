-- A destination's payload filter (issue 27): the filter object as compact JSON, as the
-- caller gave it, or NULL for none. The relay compiles it when its catalog reloads and
-- fans an event out to the destination only when the event passes.
ALTER TABLE herald_destinations ADD COLUMN payload_filter text;

-- A filter's test (POST /v2/event-destinations/{id}/filter/test) reads the tenant's
-- newest events, newest first.
CREATE INDEX herald_events_tenant_ingested ON herald_events (tenant_id, ingested_at);

-- The tenants' event-type catalogs: a description and, optionally, the JSON Schema
-- (2020-12, compact JSON) a payload of the type must match, checked at publish and by
-- the relay. A change bumps destinations_version, so every catalog reloads it.
CREATE TABLE herald_event_types (
    tenant_id   text NOT NULL,
    type        text COLLATE "C" NOT NULL,
    description text NOT NULL,
    schema      text,
    created_at  double precision NOT NULL,
    updated_at  double precision NOT NULL,
    PRIMARY KEY (tenant_id, type)
);
