-- Ordered delivery per key (docs/ordering.md). The producer's ordering_key rides on the
-- outbox row and is kept with the event; a destination with ordering = 'key' gets it
-- on each delivery planned for it, with order_seq, the relay's order (one counter,
-- herald_meta 'order_seq', made by its first use). Of a key's pending
-- deliveries only the head (lowest order_seq) is claimable: the others wait with
-- held = 2, and the recording that ends the head releases the next one.
ALTER TABLE herald_outbox ADD COLUMN ordering_key TEXT;
ALTER TABLE herald_events ADD COLUMN ordering_key TEXT;
ALTER TABLE herald_destinations ADD COLUMN ordering TEXT NOT NULL DEFAULT 'none';
ALTER TABLE herald_deliveries ADD COLUMN ordering_key TEXT;
ALTER TABLE herald_deliveries ADD COLUMN order_seq INTEGER;
-- The head of a key, and whether a key has anything pending: one probe each.
CREATE INDEX herald_deliveries_keyed ON herald_deliveries (destination_id, ordering_key, order_seq)
    WHERE status = 'pending' AND ordering_key IS NOT NULL;
