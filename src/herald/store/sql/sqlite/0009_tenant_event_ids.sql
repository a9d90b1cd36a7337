-- Event ids are unique per tenant, not across tenants (the design's outbox table):
-- one tenant's id must neither be refused nor be an oracle for another's. The key
-- of an event is (id, tenant_id) in the outbox and in herald_events; id comes first
-- so that lookups by id alone (the relay's batch check, retention's probes) read
-- the key's prefix. A delivery refers to its event by (tenant_id, event_id): its
-- tenant is always its event's.
--
-- SQLite cannot change a table's constraints in place: each table is rebuilt the
-- documented way (create the new one, copy every row, drop the old, rename the new,
-- recreate its indexes), inside the migration's transaction. No foreign keys, views
-- or triggers refer to these tables.

CREATE TABLE herald_outbox_new (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    id         TEXT NOT NULL,
    tenant_id  TEXT NOT NULL DEFAULT 'default',
    type       TEXT NOT NULL,
    data       TEXT NOT NULL,
    created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    UNIQUE (id, tenant_id)
);
-- The new table continues the old one's sequence, not its highest remaining seq: the
-- relay deletes the rows it took, and a seq given out again would overwrite the
-- herald_outbox_rejected row (keyed by seq) of the row that first had it.
INSERT INTO sqlite_sequence (name, seq)
    SELECT 'herald_outbox_new', seq FROM sqlite_sequence WHERE name = 'herald_outbox';
INSERT INTO herald_outbox_new (seq, id, tenant_id, type, data, created_at)
    SELECT seq, id, tenant_id, type, data, created_at FROM herald_outbox;
DROP TABLE herald_outbox;
ALTER TABLE herald_outbox_new RENAME TO herald_outbox;

CREATE TABLE herald_events_new (
    id          TEXT NOT NULL,
    tenant_id   TEXT NOT NULL,
    type        TEXT NOT NULL,
    data        TEXT NOT NULL,
    created_at  TEXT NOT NULL,
    created_ts  REAL NOT NULL,
    ingested_at REAL NOT NULL,
    PRIMARY KEY (id, tenant_id)
);
INSERT INTO herald_events_new (id, tenant_id, type, data, created_at, created_ts, ingested_at)
    SELECT id, tenant_id, type, data, created_at, created_ts, ingested_at FROM herald_events;
DROP TABLE herald_events;
ALTER TABLE herald_events_new RENAME TO herald_events;
CREATE INDEX herald_events_ingested ON herald_events (ingested_at);
