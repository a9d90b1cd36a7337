-- Outbox sources: producers' own databases Herald reads besides its own outbox.
--
-- A rejected row names its source ('herald' is the built-in outbox): the seq of one
-- source's row says nothing about another's, so the key is (source, seq). SQLite
-- cannot change a table's key in place: the table is rebuilt the documented way,
-- inside the migration's transaction.
-- The new column comes last, as PostgreSQL's ALTER TABLE adds it.
CREATE TABLE herald_outbox_rejected_new (
    seq         INTEGER NOT NULL,
    id          TEXT,
    tenant_id   TEXT,
    type        TEXT,
    data        TEXT,
    created_at  TEXT,
    reason      TEXT NOT NULL,
    rejected_at REAL NOT NULL,
    source      TEXT NOT NULL DEFAULT 'herald',
    PRIMARY KEY (source, seq)
);
INSERT INTO herald_outbox_rejected_new
    (seq, id, tenant_id, type, data, created_at, reason, rejected_at, source)
    SELECT seq, id, tenant_id, type, data, created_at, reason, rejected_at, 'herald'
    FROM herald_outbox_rejected;
DROP TABLE herald_outbox_rejected;
ALTER TABLE herald_outbox_rejected_new RENAME TO herald_outbox_rejected;

-- Who relays each source: one instance at a time, until its lease runs out (a killed
-- instance's is taken over once it has).
CREATE TABLE herald_source_leases (
    source      TEXT PRIMARY KEY,
    owner       TEXT NOT NULL,
    lease_until REAL NOT NULL
);
