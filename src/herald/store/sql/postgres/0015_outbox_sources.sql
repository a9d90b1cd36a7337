-- Outbox sources: producers' own databases Herald reads besides its own outbox.
--
-- A rejected row names its source ('herald' is the built-in outbox): the seq of one
-- source's row says nothing about another's, so the key is (source, seq).
ALTER TABLE herald_outbox_rejected ADD COLUMN source text NOT NULL DEFAULT 'herald';
ALTER TABLE herald_outbox_rejected DROP CONSTRAINT herald_outbox_rejected_pkey;
ALTER TABLE herald_outbox_rejected ADD PRIMARY KEY (source, seq);

-- Who relays each source: one instance at a time, until its lease runs out (a killed
-- instance's is taken over once it has).
CREATE TABLE herald_source_leases (
    source      text PRIMARY KEY,
    owner       text NOT NULL,
    lease_until double precision NOT NULL
);
