-- Only what this dialect writes its own way is here (herald.store.queries):
-- the statements PostgreSQL writes differently, then those only SQLite has (its single
-- writer claims in two statements, reads before locking when idle, updates then inserts
-- a heartbeat, purges unused events in one pass, and reads the destinations' signal
-- state under its write lock). Every other statement is in ../queries.sql.

-- Herald's statements on SQLite, by name (herald.store.queries). Parameters are
-- numbered (?1, ?2 …) so that both dialects take the same arguments in the same order.
-- {ids} is a list argument, always the last: expanded to one placeholder per value.

-- ---- Also in PostgreSQL's file, written otherwise there ----

-- migrations_table --
CREATE TABLE IF NOT EXISTS herald_schema_migrations
  (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)

-- _outbox_row --
-- An outbox row as the relay parses it (herald.ingest.parse_row). Text columns read as
-- bytes: one row of invalid UTF-8 must not fail the batch
seq, CAST(id AS BLOB), CAST(tenant_id AS BLOB), CAST(type AS BLOB),
  CAST(data AS BLOB), CAST(created_at AS BLOB), about_destination, CAST(traceparent AS BLOB),
  CAST(ordering_key AS BLOB)

-- relay_claim --
SELECT {_outbox_row} FROM herald_outbox ORDER BY seq LIMIT ?1

-- relay_existing --
-- (tenant, id) of the batch's ids already stored: an id is unique per tenant only
SELECT tenant_id, id FROM herald_events WHERE id IN ({ids})

-- relay_reject --
INSERT OR REPLACE INTO herald_outbox_rejected
  (seq, id, tenant_id, type, data, created_at, reason, rejected_at, source)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)

-- relay_delete --
-- The single writer claimed every row from the first to the last
DELETE FROM herald_outbox WHERE seq BETWEEN ?1 AND ?2

-- insert_events --
INSERT INTO herald_events (id, tenant_id, type, data, created_at, created_ts, ingested_at,
  traceparent, ordering_key)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)

-- destination_statuses --
-- (and whether it is under flow control: its event deliveries go in the flow lane)
SELECT id, status, ordering,
  EXISTS (SELECT 1 FROM herald_flow f WHERE f.destination_id = herald_destinations.id)
FROM herald_destinations WHERE deleted_at IS NULL AND id IN ({ids})

-- insert_deliveries --
INSERT INTO herald_deliveries (id, tenant_id, event_id, event_type, destination_id, kind,
  max_attempts, next_attempt_at, held, created_at, lease_owner, ordering_key, order_seq, flow,
  status, attempt_count, updated_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, 'pending', 0, ?10)

-- outbox_stats --
SELECT COUNT(*), (SELECT CAST(created_at AS BLOB) FROM herald_outbox ORDER BY seq LIMIT 1)
FROM herald_outbox

-- flow_lock --
-- The flow rows (herald.flow) of these destinations (the write lock holds them)
SELECT {_flow_row}
FROM herald_flow WHERE destination_id IN ({ids}) ORDER BY destination_id

-- breaker_lock --
-- The same, of the destinations whose breaker is on
SELECT {_flow_row}
FROM herald_flow WHERE breaker = 1 AND destination_id IN ({ids}) ORDER BY destination_id

-- events_by_id --
-- Every tenant's event of each id: the caller picks its delivery's tenant's
SELECT id, tenant_id, type, created_at, created_ts, data, traceparent, ordering_key
FROM herald_events
WHERE id IN ({ids})

-- renew_leases --
UPDATE herald_deliveries SET next_attempt_at = ?1
WHERE id IN ({ids}) AND lease_owner = ?2 AND status = 'pending'

-- insert_attempts --
INSERT INTO herald_attempts (id, delivery_id, number, started_at, duration_ms, outcome,
  response_status, error, response_excerpt, exchange)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)

-- order_lock --
-- Taken first by a relay pass that may plan ordered deliveries, and by a re-queue of
-- ordered ones: one at a time, so the relay's order (order_seq) is the order it took
-- the rows in (SQLite: the write lock already is that)
SELECT 1

-- keys_lock --
-- The (destination, key) pairs of ?1 (a JSON array of [destination, key]) are this
-- transaction's to change (PostgreSQL: advisory locks; SQLite: the write lock)
SELECT ?1 IS NULL

-- keys_busy --
-- Which of the pairs have a pending delivery (herald_deliveries_keyed: a probe each).
-- ?1 a JSON array of [destination, key]
SELECT json_extract(k.value, '$[0]'), json_extract(k.value, '$[1]') FROM json_each(?1) k
WHERE EXISTS (SELECT 1 FROM herald_deliveries d
  WHERE d.status = 'pending' AND d.ordering_key IS NOT NULL
    AND d.destination_id = json_extract(k.value, '$[0]') AND d.ordering_key = json_extract(k.value, '$[1]'))

-- release_next --
-- A delivery of ordered key ended: the next of its key (the lowest order_seq pending)
-- becomes claimable now, unless its destination is not active (then held as any).
-- ?1 the ended delivery, ?2 now
UPDATE herald_deliveries SET next_attempt_at = ?2,
  held = (SELECT CASE WHEN t.status = 'active' THEN 0 ELSE 1 END
    FROM herald_destinations t WHERE t.id = destination_id)
WHERE held = 2 AND id = (SELECT n.id FROM herald_deliveries f
  JOIN herald_deliveries n INDEXED BY herald_deliveries_keyed
    ON n.destination_id = f.destination_id AND n.ordering_key = f.ordering_key
  WHERE f.id = ?1 AND f.ordering_key IS NOT NULL AND f.status <> 'pending'
    AND n.status = 'pending' AND n.ordering_key IS NOT NULL
  ORDER BY n.order_seq LIMIT 1)

-- activate_destination --
-- Only the current verification counts: it succeeded, and no later ping was sent
-- (ids are time-ordered), so an attempt in flight when the target changed cannot verify
UPDATE herald_destinations SET status = 'active', updated_at = MAX(?1, updated_at + 0.000001),
  verification_failed_at = NULL, verification_error = NULL
WHERE id = ?2 AND status = 'pending_verification' AND deleted_at IS NULL
  AND EXISTS (SELECT 1 FROM herald_deliveries WHERE id = ?3 AND status = 'success'
    AND kind = 'verification')
  AND NOT EXISTS (SELECT 1 FROM herald_deliveries WHERE destination_id = ?2
    AND kind = 'verification' AND id > ?3)

-- insert_signal --
-- An operational event, into the outbox like a producer's: the relay fans it out. Its
-- id is derived from its cause, so a repeated recording writes it once
INSERT OR IGNORE INTO herald_outbox (id, tenant_id, type, data, created_at, about_destination)
SELECT ?1, ?2, ?3, ?4, ?5, ?6
WHERE NOT EXISTS (SELECT 1 FROM herald_events WHERE id = ?1 AND tenant_id = ?2)

-- finished_failed --
-- Of the deliveries given, those that ended as failure, with their last attempt and
-- their destination's type: the recording that did it is the one whose attempt it is
SELECT d.id, d.last_attempt_id, t.type FROM herald_deliveries d
JOIN herald_destinations t ON t.id = d.destination_id
WHERE d.status = 'failure' AND d.id IN ({ids})

-- event_deliveries --
-- One event's deliveries, newest first: ?1 tenant, ?2 event id, ?3 limit. Found by the
-- event id's index (a few rows, of every tenant that used the id), then its tenant's
-- kept: a limit applied before the tenant would let another tenant's reuse of the id
-- crowd this tenant's deliveries out.
-- INDEXED BY: without statistics SQLite would rather walk the tenant's deliveries
-- backwards by (tenant_id, id) for the order, every one of them.
SELECT {_delivery_listing}
FROM herald_deliveries d INDEXED BY herald_deliveries_event
  LEFT JOIN herald_attempts a ON a.id = d.last_attempt_id
WHERE d.event_id = ?2 AND d.tenant_id = ?1 ORDER BY d.id DESC LIMIT ?3

-- requeue --
-- A pending one keeps its place in its key (herald.ordering); a finished one leaves
-- its key, which requeue_ordered gives it again, at the end. Finished deliveries get ?1 more attempts; deleted destinations and pings are left alone.
-- Each goes in its destination's lane (herald.flow: it may have come under flow control
-- since it finished).
-- ?3: the replay re-queuing them takes them over (NULL: a retry, which keeps theirs)
UPDATE herald_deliveries SET
  max_attempts = CASE WHEN status = 'pending' THEN max_attempts ELSE attempt_count + ?1 END,
  status = 'pending', next_attempt_at = ?2, lease_owner = NULL, updated_at = ?2,
  replay_id = COALESCE(?3, replay_id),
  held = CASE WHEN status = 'pending' AND held = 2 THEN 2
    ELSE (SELECT CASE WHEN t.status = 'active' THEN 0 ELSE 1 END
      FROM herald_destinations t WHERE t.id = destination_id) END,
  ordering_key = CASE WHEN status = 'pending' THEN ordering_key END,
  flow = EXISTS (SELECT 1 FROM herald_flow f WHERE f.destination_id = herald_deliveries.destination_id)
WHERE id IN ({ids}) AND kind = 'event' AND lease_owner IS NULL
  AND destination_id IN (SELECT id FROM herald_destinations WHERE deleted_at IS NULL)

-- count_request --
INSERT INTO herald_rate_limits (tenant_id, window_no, count) VALUES (?1, ?2, 1)
ON CONFLICT (tenant_id, window_no) DO UPDATE SET count = count + 1 RETURNING count

-- purge_select --
SELECT id FROM herald_deliveries WHERE status <> 'pending' AND updated_at < ?1
ORDER BY updated_at LIMIT ?2

-- purge_deliveries --
DELETE FROM herald_deliveries WHERE id IN ({ids})

-- revoke_api_keys --
UPDATE herald_api_keys SET revoked_at = ?1
WHERE tenant_id = ?2 AND substr(hash, 1, ?3) = ?4 AND revoked_at IS NULL
  AND kind = ?5

-- reencrypt_select --
SELECT id, secrets FROM herald_destinations WHERE id > ?1 ORDER BY id LIMIT ?2

-- open_token --
-- One statement: the checks and the extension (?2 now + ?3 idle, never past created_at
-- + ?4, never shorter than it was) are one atomic step
UPDATE herald_session_tokens SET last_used_at = ?2,
  expires_at = MAX(expires_at, MIN(?2 + ?3, created_at + ?4))
WHERE token_hash = ?1 AND traded_at IS NULL AND revoked_at IS NULL AND expires_at > ?2
  AND EXISTS (SELECT 1 FROM herald_api_keys k WHERE k.hash = key_hash AND k.revoked_at IS NULL)
RETURNING id, tenant_id, created_at, expires_at

-- trade_token --
-- The tk_ value is spent: from now on only the session secret (?5) opens the token
UPDATE herald_session_tokens SET last_used_at = ?2, traded_at = ?2, session_hash = ?5,
  expires_at = MAX(expires_at, MIN(?2 + ?3, created_at + ?4))
WHERE token_hash = ?1 AND traded_at IS NULL AND revoked_at IS NULL AND expires_at > ?2
  AND EXISTS (SELECT 1 FROM herald_api_keys k WHERE k.hash = key_hash AND k.revoked_at IS NULL)
RETURNING id, tenant_id, created_at, expires_at

-- open_session --
UPDATE herald_session_tokens SET last_used_at = ?2,
  expires_at = MAX(expires_at, MIN(?2 + ?3, created_at + ?4))
WHERE session_hash = ?1 AND revoked_at IS NULL AND expires_at > ?2
  AND EXISTS (SELECT 1 FROM herald_api_keys k WHERE k.hash = key_hash AND k.revoked_at IS NULL)
RETURNING id, tenant_id, created_at, expires_at

-- count_last --
-- When a destination last answered well (?2) and badly (?3), the later of the stored
-- and the given (SQLite's MAX is NULL if either is: COALESCE keeps the
-- other); rows come in destination order (the lock order)
INSERT INTO herald_destination_stats (destination_id, last_success_at, last_failure_at)
VALUES (?1, ?2, ?3)
ON CONFLICT (destination_id) DO UPDATE SET
  last_success_at = COALESCE(MAX(herald_destination_stats.last_success_at, excluded.last_success_at),
    herald_destination_stats.last_success_at, excluded.last_success_at),
  last_failure_at = COALESCE(MAX(herald_destination_stats.last_failure_at, excluded.last_failure_at),
    herald_destination_stats.last_failure_at, excluded.last_failure_at)

-- count_replay --
-- Replays by who asked (?1), for every instance's metrics: replays:?1 and replayed:?1
INSERT INTO herald_meta (key, value) VALUES ('replays:' || ?1, 1), ('replayed:' || ?1, ?2)
ON CONFLICT (key) DO UPDATE SET value = value + excluded.value

-- console_outcomes --
-- Finished deliveries by outcome and time bucket since ?1, ?2 seconds a bucket,
-- read from herald_deliveries_outcomes alone
SELECT status, CAST(floor(updated_at / ?2) AS INTEGER), COUNT(*) FROM herald_deliveries
WHERE status <> 'pending' AND updated_at >= ?1 GROUP BY 1, 2

-- console_failing --
-- The destinations with the most failed deliveries since ?1, from herald_deliveries_outcomes
-- (its predicate is written out: SQLite does not infer it from status = 'failure'; and
-- named: without statistics SQLite would walk herald_deliveries_destination for the GROUP BY)
SELECT destination_id, COUNT(*) FROM herald_deliveries INDEXED BY herald_deliveries_outcomes
WHERE status <> 'pending' AND status = 'failure' AND updated_at >= ?1
GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT ?2

-- tenant_outcomes --
-- console_outcomes for one tenant (?3), the portal's overview: its destinations'
-- deliveries, still from herald_deliveries_outcomes (which holds destination_id)
SELECT status, CAST(floor(updated_at / ?2) AS INTEGER), COUNT(*) FROM herald_deliveries INDEXED BY herald_deliveries_outcomes
WHERE status <> 'pending' AND updated_at >= ?1 AND destination_id IN (SELECT id FROM herald_destinations WHERE tenant_id = ?3)
GROUP BY 1, 2

-- tenant_failing --
-- console_failing for one tenant (?3)
SELECT destination_id, COUNT(*) FROM herald_deliveries INDEXED BY herald_deliveries_outcomes
WHERE status <> 'pending' AND status = 'failure' AND updated_at >= ?1 AND destination_id IN (SELECT id FROM herald_destinations WHERE tenant_id = ?3)
GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT ?2

-- tenant_in_flight --
-- console_in_flight for one tenant (?1): the leased rows are few, so from their index
-- (named: SQLite would rather walk every delivery of the tenant)
SELECT COUNT(*) FROM herald_deliveries INDEXED BY herald_deliveries_leased
WHERE lease_owner IS NOT NULL AND tenant_id = ?1

-- tenant_delivery_counts --
-- delivery_counts for one tenant (?2), by its destinations on the pending index
SELECT (SELECT COUNT(*) FROM herald_deliveries INDEXED BY herald_deliveries_pending
    WHERE status = 'pending' AND held = 0 AND flow IN (0, 1) AND next_attempt_at <= ?1 AND destination_id IN (SELECT id FROM herald_destinations WHERE tenant_id = ?2)),
  (SELECT COUNT(*) FROM herald_deliveries INDEXED BY herald_deliveries_pending
    WHERE status = 'pending' AND held = 0 AND flow IN (0, 1) AND next_attempt_at > ?1 AND destination_id IN (SELECT id FROM herald_destinations WHERE tenant_id = ?2)),
  (SELECT COUNT(*) FROM herald_deliveries INDEXED BY herald_deliveries_pending
    WHERE status = 'pending' AND held >= 1 AND destination_id IN (SELECT id FROM herald_destinations WHERE tenant_id = ?2))

-- tenant_next_due_at --
-- next_due_at for one tenant (?1)
SELECT MIN(due) FROM (
  SELECT MIN(next_attempt_at) AS due FROM herald_deliveries INDEXED BY herald_deliveries_pending
  WHERE status = 'pending' AND held = 0 AND flow = 0 AND destination_id IN (SELECT id FROM herald_destinations WHERE tenant_id = ?1)
  UNION ALL
  SELECT MIN(next_attempt_at) FROM herald_deliveries INDEXED BY herald_deliveries_pending
  WHERE status = 'pending' AND held = 0 AND flow = 1 AND destination_id IN (SELECT id FROM herald_destinations WHERE tenant_id = ?1))

-- last_failed_attempt --
-- The last attempt of destination ?1's newest delivery that failed it: a walk of
-- herald_deliveries_destination from the newest, one primary-key probe of
-- herald_attempts a delivery
SELECT a.started_at, a.response_status, a.error
FROM herald_deliveries d INDEXED BY herald_deliveries_destination
JOIN herald_attempts a ON a.id = d.last_attempt_id
WHERE d.destination_id = ?1 AND a.outcome <> 'success'
ORDER BY d.id DESC LIMIT 1

-- list_events --
-- Events newest first, walking herald_events_ingested backwards: ?1 one tenant's or NULL,
-- ?2 one type or NULL, stored within [?3, ?4]; with a cursor (?5 its id, ?6 its tenant,
-- ?4 its ingested_at), only those after it in this order; ?7 the limit
SELECT id, tenant_id, type, created_at, ingested_at
FROM herald_events INDEXED BY herald_events_ingested
WHERE ingested_at >= ?3 AND ingested_at <= ?4 AND (?1 IS NULL OR tenant_id = ?1)
  AND (?2 IS NULL OR type = ?2)
  AND (?5 IS NULL OR ingested_at < ?4 OR id < ?5 OR (id = ?5 AND tenant_id < ?6))
ORDER BY ingested_at DESC, id DESC, tenant_id DESC LIMIT ?7

-- source_existing --
-- An outbox source's batch: the events already stored under its ids, with what they
-- hold, so that a row relayed before a crash (its source delete lost) is known again
SELECT tenant_id, id, type, data FROM herald_events WHERE id IN ({ids})

-- source_lease --
-- Take or renew the lease on one outbox source (?1) for ?2 until ?3: it is this
-- instance's already, or its holder's ran out before ?4. A row back: the lease is ours
INSERT INTO herald_source_leases (source, owner, lease_until) VALUES (?1, ?2, ?3)
ON CONFLICT (source) DO UPDATE SET owner = excluded.owner, lease_until = excluded.lease_until
WHERE herald_source_leases.owner = excluded.owner OR herald_source_leases.lease_until < ?4
RETURNING owner

-- put_event_type --
INSERT INTO herald_event_types (tenant_id, type, description, schema, created_at, updated_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?5)
ON CONFLICT (tenant_id, type) DO UPDATE SET description = excluded.description,
  schema = excluded.schema, updated_at = MAX(excluded.updated_at, updated_at + 0.000001)

-- ---- Only SQLite has these ----

-- outbox_any --
-- An idle relay's look before it takes the write lock
SELECT 1 FROM herald_outbox LIMIT 1

-- claim_select --
-- Plain ? in order: {where} adds a due_since bound, excluded destinations and excluded
-- tenants per call. The common lane (flow = 0); the last columns: whether the
-- destination is under flow control (it came under it since: herald.flow admits it),
-- then the delivery's ordering key (of an ordered destination's: herald.ordering; only
-- a key's head has held = 0)
SELECT id, destination_id, kind, attempt_count, max_attempts, tenant_id, event_id,
  next_attempt_at,
  EXISTS (SELECT 1 FROM herald_flow f WHERE f.destination_id = herald_deliveries.destination_id),
  ordering_key
FROM herald_deliveries
WHERE status = 'pending' AND held = 0 AND flow = 0 AND next_attempt_at <= ?{where}
ORDER BY next_attempt_at LIMIT ?

-- claim_flow_select --
-- The flow lane of one destination (?2), its oldest due first, as many as its gate
-- lets (?3); ?4 and on: excluded tenants ({where})
SELECT id, destination_id, kind, attempt_count, max_attempts, tenant_id, event_id,
  next_attempt_at, 1, ordering_key
FROM herald_deliveries INDEXED BY herald_deliveries_flow
WHERE status = 'pending' AND held = 0 AND flow = 1 AND destination_id = ?2
  AND next_attempt_at <= ?1{where}
ORDER BY next_attempt_at LIMIT ?3

-- claim_lease --
UPDATE herald_deliveries SET lease_owner = ?1, next_attempt_at = ?2 WHERE id IN ({ids})

-- signal_state --
-- The signal state of the batch's live destinations (the write lock holds it)
SELECT id, type, consecutive_failures, failing_since FROM herald_destinations
WHERE deleted_at IS NULL AND id IN ({ids})

-- heartbeat_update --
UPDATE herald_instances SET heartbeat_at = ?1 WHERE id = ?2

-- heartbeat_insert --
INSERT INTO herald_instances VALUES (?1, ?2, ?3, ?4, ?5, ?6)

-- reap_select --
SELECT id FROM herald_instances WHERE heartbeat_at < ?1

-- purge_events --
-- By rowid: another tenant's event of the same id may still have deliveries
DELETE FROM herald_events WHERE rowid IN (SELECT e.rowid FROM herald_events e
  WHERE e.ingested_at < ?1 AND NOT EXISTS (SELECT 1 FROM herald_deliveries d
    WHERE d.event_id = e.id AND d.tenant_id = e.tenant_id) LIMIT ?2)
