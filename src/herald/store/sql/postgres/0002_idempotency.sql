-- Idempotency keys of create requests, kept 24 h.
CREATE TABLE herald_idempotency (
    tenant_id   text NOT NULL,
    key         text NOT NULL,
    fingerprint text NOT NULL,
    status      integer,
    body        bytea,
    created_at  double precision NOT NULL,
    PRIMARY KEY (tenant_id, key)
);
CREATE INDEX herald_idempotency_created ON herald_idempotency (created_at);
