-- Replays get an id, and the deliveries they re-queue carry it; portal session tokens.
--
-- A replay is one row: its tenant (NULL for an operator-wide replay), the filter it
-- used as JSON, who asked, how many it matched and re-queued, and when it finished
-- (NULL while it runs, or if it was interrupted). A delivery carries the id of the
-- latest replay that re-queued it: a later replay of the same delivery takes it over.
CREATE TABLE herald_replays (
    id          TEXT PRIMARY KEY,
    tenant_id   TEXT,
    filter      TEXT NOT NULL,
    requested_by TEXT NOT NULL,
    created_at  REAL NOT NULL,
    matched     INTEGER NOT NULL,
    requeued    INTEGER NOT NULL DEFAULT 0,
    finished_at REAL
);
-- A tenant's replays, newest first (ids are time-ordered).
CREATE INDEX herald_replays_tenant ON herald_replays (tenant_id, id);

-- NULL for every delivery no replay touched: adding it rewrites nothing.
ALTER TABLE herald_deliveries ADD COLUMN replay_id TEXT;
-- A replay's outcome (its deliveries by status) is counted from this index alone,
-- and only re-queued deliveries are in it.
CREATE INDEX herald_deliveries_replay ON herald_deliveries (replay_id, status)
    WHERE replay_id IS NOT NULL;

-- Session tokens of POST /v2/token (spec 000): only the SHA-256 of the tk_ value is
-- stored, and of the portal session secret it is traded for (once). key_hash is the
-- API key that made it: revoking that key ends the token. expires_at slides by 30
-- minutes on each use, never past created_at + 24 h.
CREATE TABLE herald_session_tokens (
    id           TEXT PRIMARY KEY,
    tenant_id    TEXT NOT NULL,
    token_hash   TEXT NOT NULL UNIQUE,
    session_hash TEXT UNIQUE,
    key_hash     TEXT NOT NULL,
    created_at   REAL NOT NULL,
    expires_at   REAL NOT NULL,
    last_used_at REAL,
    traded_at    REAL,
    revoked_at   REAL
);
-- Retention deletes expired tokens.
CREATE INDEX herald_session_tokens_expires ON herald_session_tokens (expires_at);
