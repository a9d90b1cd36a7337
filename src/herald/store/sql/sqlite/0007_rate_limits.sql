-- API requests per tenant per fixed window, counted in the database so that every
-- instance sharing it enforces one budget (api.rate_limit_*). Old windows are
-- deleted as new ones begin. (One SQLite file has one instance, which counts in
-- memory; the table keeps both backends' schemas the same.)
CREATE TABLE herald_rate_limits (
    tenant_id TEXT NOT NULL,
    window_no INTEGER NOT NULL,
    count     INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, window_no)
) WITHOUT ROWID;
