-- Herald schema, version 1 (SQLite).
-- Times Herald writes are epoch seconds (REAL); the outbox keeps the
-- producer-facing ISO 8601 text of the design.

CREATE TABLE herald_outbox (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    id         TEXT NOT NULL UNIQUE,
    tenant_id  TEXT NOT NULL DEFAULT 'default',
    type       TEXT NOT NULL,
    data       TEXT NOT NULL,
    created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);

CREATE TABLE herald_outbox_rejected (
    seq         INTEGER PRIMARY KEY,
    id          TEXT,
    tenant_id   TEXT,
    type        TEXT,
    data        TEXT,
    created_at  TEXT,
    reason      TEXT NOT NULL,
    rejected_at REAL NOT NULL
);

CREATE TABLE herald_events (
    id          TEXT PRIMARY KEY,
    tenant_id   TEXT NOT NULL,
    type        TEXT NOT NULL,
    data        TEXT NOT NULL,
    created_at  TEXT NOT NULL,
    created_ts  REAL NOT NULL,
    ingested_at REAL NOT NULL
);

CREATE TABLE herald_destinations (
    id         TEXT PRIMARY KEY,
    tenant_id  TEXT NOT NULL,
    name       TEXT NOT NULL,
    type       TEXT NOT NULL,
    config     TEXT NOT NULL,
    secrets    TEXT,
    events     TEXT NOT NULL,
    status     TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    deleted_at REAL
);
CREATE INDEX herald_destinations_tenant ON herald_destinations (tenant_id, id);

CREATE TABLE herald_deliveries (
    id              TEXT PRIMARY KEY,
    tenant_id       TEXT NOT NULL,
    event_id        TEXT NOT NULL,
    event_type      TEXT NOT NULL,
    destination_id  TEXT NOT NULL,
    kind            TEXT NOT NULL,
    status          TEXT NOT NULL,
    attempt_count   INTEGER NOT NULL DEFAULT 0,
    max_attempts    INTEGER NOT NULL,
    next_attempt_at REAL,
    held            INTEGER NOT NULL DEFAULT 0,
    lease_owner     TEXT,
    created_at      REAL NOT NULL,
    updated_at      REAL NOT NULL,
    last_attempt_id TEXT
);
-- The due query reads only this partial index: finished and held rows cost nothing.
CREATE INDEX herald_deliveries_due ON herald_deliveries (next_attempt_at)
    WHERE status = 'pending' AND held = 0;
CREATE INDEX herald_deliveries_destination ON herald_deliveries (destination_id, id);
CREATE INDEX herald_deliveries_tenant ON herald_deliveries (tenant_id, id);
CREATE INDEX herald_deliveries_event ON herald_deliveries (event_id);

CREATE TABLE herald_attempts (
    id               TEXT PRIMARY KEY,
    delivery_id      TEXT NOT NULL,
    number           INTEGER NOT NULL,
    started_at       REAL NOT NULL,
    duration_ms      REAL NOT NULL,
    outcome          TEXT NOT NULL,
    response_status  INTEGER,
    error            TEXT,
    response_excerpt TEXT
);
CREATE INDEX herald_attempts_delivery ON herald_attempts (delivery_id, number);

CREATE TABLE herald_api_keys (
    hash       TEXT PRIMARY KEY,
    tenant_id  TEXT NOT NULL,
    hint       TEXT NOT NULL,
    created_at REAL NOT NULL,
    revoked_at REAL
);

CREATE TABLE herald_meta (
    key   TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
INSERT INTO herald_meta (key, value) VALUES ('destinations_version', 0);
