-- Idempotency keys of create requests, kept 24 h.
CREATE TABLE herald_idempotency (
    tenant_id   TEXT NOT NULL,
    key         TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    status      INTEGER,
    body        BLOB,
    created_at  REAL NOT NULL,
    PRIMARY KEY (tenant_id, key)
);
CREATE INDEX herald_idempotency_created ON herald_idempotency (created_at);
