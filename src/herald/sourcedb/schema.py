"""The DDL a producer runs in its own database for an outbox source
(``herald outbox schema``): the table, its index on ``seq`` (the key), and on
PostgreSQL the trigger whose ``NOTIFY`` wakes Herald."""

from __future__ import annotations

DIALECTS = ("postgresql", "mysql", "sqlite")


def outbox_ddl(dialect: str, table: str = "herald_outbox") -> str:
    """The statements, ``;``-terminated, for ``dialect`` (see :data:`DIALECTS`)."""
    if dialect == "postgresql":
        fn = table.replace(".", "_") + "_notify"
        return f"""CREATE TABLE {table} (
    seq          bigserial PRIMARY KEY,
    id           text NOT NULL,
    tenant_id    text NOT NULL DEFAULT 'default',
    type         text NOT NULL,
    data         jsonb NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    traceparent  text,
    ordering_key text
);
CREATE UNIQUE INDEX {table.rpartition(".")[2]}_id ON {table} (id, tenant_id);

-- Wakes Herald within milliseconds of a commit (it polls as well, less often).
CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('herald_outbox', TG_TABLE_NAME);
    RETURN NULL;
END;
$$;
CREATE TRIGGER {fn} AFTER INSERT ON {table}
    FOR EACH STATEMENT EXECUTE FUNCTION {fn}();
"""
    if dialect == "mysql":
        return f"""CREATE TABLE {table} (
    seq          BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    id           VARCHAR(255) NOT NULL,
    tenant_id    VARCHAR(255) NOT NULL DEFAULT 'default',
    type         VARCHAR(255) NOT NULL,
    data         LONGTEXT NOT NULL,
    created_at   DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    traceparent  VARCHAR(55),
    ordering_key VARCHAR(255),
    UNIQUE KEY {table.rpartition(".")[2]}_id (id, tenant_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
"""
    if dialect == "sqlite":
        return f"""CREATE TABLE {table} (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    id           TEXT NOT NULL,
    tenant_id    TEXT NOT NULL DEFAULT 'default',
    type         TEXT NOT NULL,
    data         TEXT NOT NULL,
    created_at   TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    traceparent  TEXT,
    ordering_key TEXT,
    UNIQUE (id, tenant_id)
);
"""
    raise ValueError(f"unknown dialect {dialect!r}; expected one of {', '.join(DIALECTS)}")
