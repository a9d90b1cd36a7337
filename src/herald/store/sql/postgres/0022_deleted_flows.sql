-- A deleted destination keeps no flow row (herald_flow, 0018): its deliveries ended
-- with its deletion, and the claim's probe for due lanes (flow_due) visited every
-- row on every claim. Deleting a destination drops its row from now on; this drops
-- the rows that destinations deleted before it left.
DELETE FROM herald_flow
WHERE destination_id IN (SELECT id FROM herald_destinations WHERE deleted_at IS NOT NULL);
