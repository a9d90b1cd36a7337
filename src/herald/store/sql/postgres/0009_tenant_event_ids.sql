-- Event ids are unique per tenant, not across tenants (the design's outbox table):
-- one tenant's id must neither be refused nor be an oracle for another's. The key
-- of an event is (id, tenant_id) in the outbox and in herald_events; id comes first
-- so that lookups by id alone (the relay's batch check, retention's probes) read
-- the key's prefix. A delivery refers to its event by (tenant_id, event_id): its
-- tenant is always its event's. Every row stays: a key unique on id alone is
-- unique on (id, tenant_id).
ALTER TABLE herald_outbox DROP CONSTRAINT herald_outbox_id_key;
ALTER TABLE herald_outbox ADD CONSTRAINT herald_outbox_id_tenant_id_key UNIQUE (id, tenant_id);
ALTER TABLE herald_events DROP CONSTRAINT herald_events_pkey;
ALTER TABLE herald_events ADD CONSTRAINT herald_events_pkey PRIMARY KEY (id, tenant_id);
