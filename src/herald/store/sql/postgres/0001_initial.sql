-- Herald schema, version 1 (PostgreSQL).
-- Times Herald writes are epoch seconds (double precision), as in SQLite, so
-- both backends share one store contract; the outbox keeps the producer-facing
-- types of the design. Ids sort bytewise (COLLATE "C"): pagination relies on it.

CREATE TABLE herald_outbox (
    seq        bigserial PRIMARY KEY,
    id         text COLLATE "C" NOT NULL UNIQUE,
    tenant_id  text NOT NULL DEFAULT 'default',
    type       text NOT NULL,
    data       jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- Wake the relays within milliseconds of a producer's commit; polling stays the fallback.
CREATE FUNCTION herald_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('herald_outbox', '');
    RETURN NULL;
END;
$$;
CREATE TRIGGER herald_outbox_notify AFTER INSERT ON herald_outbox
    FOR EACH STATEMENT EXECUTE FUNCTION herald_outbox_notify();

CREATE TABLE herald_outbox_rejected (
    seq         bigint PRIMARY KEY,
    id          text,
    tenant_id   text,
    type        text,
    data        text,
    created_at  text,
    reason      text NOT NULL,
    rejected_at double precision NOT NULL
);

CREATE TABLE herald_events (
    id          text COLLATE "C" PRIMARY KEY,
    tenant_id   text NOT NULL,
    type        text NOT NULL,
    data        text NOT NULL,
    created_at  text NOT NULL,
    created_ts  double precision NOT NULL,
    ingested_at double precision NOT NULL
);

CREATE TABLE herald_destinations (
    id         text COLLATE "C" PRIMARY KEY,
    tenant_id  text NOT NULL,
    name       text NOT NULL,
    type       text NOT NULL,
    config     text NOT NULL,
    secrets    text,
    events     text NOT NULL,
    status     text NOT NULL,
    created_at double precision NOT NULL,
    updated_at double precision NOT NULL,
    deleted_at double precision
);
CREATE INDEX herald_destinations_tenant ON herald_destinations (tenant_id, id);

CREATE TABLE herald_deliveries (
    id              text COLLATE "C" PRIMARY KEY,
    tenant_id       text NOT NULL,
    event_id        text COLLATE "C" NOT NULL,
    event_type      text NOT NULL,
    destination_id  text COLLATE "C" NOT NULL,
    kind            text NOT NULL,
    status          text NOT NULL,
    attempt_count   integer NOT NULL DEFAULT 0,
    max_attempts    integer NOT NULL,
    next_attempt_at double precision,
    held            integer NOT NULL DEFAULT 0,
    lease_owner     text,
    created_at      double precision NOT NULL,
    updated_at      double precision NOT NULL,
    last_attempt_id text COLLATE "C"
);
CREATE INDEX herald_deliveries_due ON herald_deliveries (next_attempt_at)
    WHERE status = 'pending' AND held = 0;
CREATE INDEX herald_deliveries_destination ON herald_deliveries (destination_id, id);
CREATE INDEX herald_deliveries_tenant ON herald_deliveries (tenant_id, id);
CREATE INDEX herald_deliveries_event ON herald_deliveries (event_id);

CREATE TABLE herald_attempts (
    id               text COLLATE "C" PRIMARY KEY,
    delivery_id      text COLLATE "C" NOT NULL,
    number           integer NOT NULL,
    started_at       double precision NOT NULL,
    duration_ms      double precision NOT NULL,
    outcome          text NOT NULL,
    response_status  integer,
    error            text,
    response_excerpt text
);
CREATE INDEX herald_attempts_delivery ON herald_attempts (delivery_id, number);

CREATE TABLE herald_api_keys (
    hash       text PRIMARY KEY,
    tenant_id  text NOT NULL,
    hint       text NOT NULL,
    created_at double precision NOT NULL,
    revoked_at double precision
);

CREATE TABLE herald_meta (
    key   text PRIMARY KEY,
    value bigint NOT NULL
);
INSERT INTO herald_meta (key, value) VALUES ('destinations_version', 0);
