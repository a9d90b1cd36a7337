-- API requests per tenant per fixed window, counted in the database so that every
-- instance sharing it enforces one budget (api.rate_limit_*). Old windows are
-- deleted as new ones begin.
CREATE TABLE herald_rate_limits (
    tenant_id text NOT NULL,
    window_no bigint NOT NULL,
    count     integer NOT NULL,
    PRIMARY KEY (tenant_id, window_no)
);
