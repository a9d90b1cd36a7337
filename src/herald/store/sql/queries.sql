-- Herald's statements both dialects run as written, by name (herald.store.queries).
-- Parameters are numbered $1, $2 … as PostgreSQL writes them; SQLite reads each $n
-- (outside quotes) as ?n, and drops the casts PostgreSQL may need to type one
-- ($2::text IS NULL reads ?2 IS NULL): both take the same arguments in the same order.
-- A statement a dialect writes its own way is in sql/<dialect>/queries.sql instead,
-- under the same name in both dialects' files; a name defined here and there is an
-- error. A fragment ({_name}) may be defined here or in a dialect's file and used by
-- the queries of either.

-- migrations_done --
SELECT version FROM herald_schema_migrations

-- migration_applied --
INSERT INTO herald_schema_migrations VALUES ($1, $2, $3)

-- ping --
SELECT value FROM herald_meta LIMIT 1

-- schema_version --
SELECT MAX(version) FROM herald_schema_migrations

-- destinations_version --
SELECT value FROM herald_meta WHERE key = 'destinations_version'

-- bump_version --
UPDATE herald_meta SET value = value + 1 WHERE key = 'destinations_version'

-- insert_outbox --
-- One check under the write lock: not waiting in the outbox (UNIQUE) nor relayed already,
-- for this tenant (another tenant's event of the same id is another event)
INSERT INTO herald_outbox (id, tenant_id, type, data, created_at, traceparent, ordering_key)
SELECT $1, $2, $3, $4::text::jsonb, $5::text::timestamptz, $6, $7
WHERE NOT EXISTS (SELECT 1 FROM herald_events WHERE id = $1 AND tenant_id = $2)

-- list_rejected --
-- $2: one tenant's rows (as the row spelled it), or NULL for every tenant's
SELECT seq, id, tenant_id, type, data, created_at, reason, rejected_at, source
FROM herald_outbox_rejected WHERE $2::text IS NULL OR tenant_id = $2
ORDER BY rejected_at DESC, seq DESC LIMIT $1

-- outbox_event --
SELECT {_outbox_row} FROM herald_outbox WHERE id = $1 AND tenant_id = $2

-- drop_flow --
-- A deleted destination's flow row: its deliveries have ended, and the claim's flow
-- probe (flow_due) would otherwise visit the row on every claim for good
DELETE FROM herald_flow WHERE destination_id = $1

-- set_flow --
INSERT INTO herald_flow (destination_id, rate, breaker, tat, circuit, opened_at,
  next_probe_at, cooldown, gate_until)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON CONFLICT (destination_id) DO UPDATE SET rate = excluded.rate, breaker = excluded.breaker,
  tat = excluded.tat, circuit = excluded.circuit, opened_at = excluded.opened_at,
  next_probe_at = excluded.next_probe_at, cooldown = excluded.cooldown,
  gate_until = excluded.gate_until

-- flow_due --
-- The destinations under flow control with a delivery due in their lane by $1, and
-- their flow state as committed (unlocked: how many a claim asks for; herald.flow
-- admits them under the row's lock): one probe of herald_deliveries_flow each
SELECT {_flow_row}
FROM herald_flow f WHERE EXISTS (SELECT 1 FROM herald_deliveries d
  WHERE d.destination_id = f.destination_id AND d.status = 'pending' AND d.held = 0
  AND d.flow = 1 AND d.next_attempt_at <= $1)

-- unclaim --
-- A claimed delivery the flow keeps waiting: due again when it was, as if never claimed
UPDATE herald_deliveries SET lease_owner = NULL, next_attempt_at = $1
WHERE id = $2 AND lease_owner = $3 AND status = 'pending'

-- open_circuits --
SELECT f.destination_id FROM herald_flow f
JOIN herald_destinations d ON d.id = f.destination_id AND d.deleted_at IS NULL
WHERE f.breaker = 1 AND f.circuit <> 'closed'

-- finish_attempts --
-- Only a still-pending delivery moves on: one deleted meanwhile keeps its final state.
-- An ordered one (herald.ordering) only while no other instance leased it since ($7
-- the recorder's instance): its lease ran out and a peer repeats it now, and ending it
-- here would let the next of its key overtake that repeat
UPDATE herald_deliveries SET status = $1, attempt_count = $2, next_attempt_at = $3,
  lease_owner = NULL, updated_at = $4, last_attempt_id = $5
WHERE id = $6 AND status = 'pending'
  AND (ordering_key IS NULL OR lease_owner IS NULL OR lease_owner = $7)

-- order_take --
-- $1 more order_seq values: the new top comes back (the first is top - $1 + 1)
INSERT INTO herald_meta (key, value) VALUES ('order_seq', $1)
ON CONFLICT (key) DO UPDATE SET value = herald_meta.value + excluded.value RETURNING value

-- set_signal_state --
UPDATE herald_destinations SET consecutive_failures = $1, failing_since = $2 WHERE id = $3

-- verification_failed --
-- The verification ran out of attempts: the destination stays pending_verification
UPDATE herald_destinations SET verification_failed_at = $1, verification_error = $2
WHERE id = $3 AND status = 'pending_verification' AND deleted_at IS NULL

-- clear_verification_failure --
-- A new verification ping is on its way
UPDATE herald_destinations SET verification_failed_at = NULL, verification_error = NULL
WHERE id = $1

-- failing_count --
SELECT COUNT(*) FROM herald_destinations WHERE failing_since IS NOT NULL AND deleted_at IS NULL

-- set_held --
UPDATE herald_deliveries SET held = $1 WHERE destination_id = $2
  AND status = 'pending' AND kind = 'event' AND held = $3

-- flow_lane --
-- A destination comes under flow control: its pending event deliveries go in the flow
-- lane (herald_deliveries_flow), claimed as its gate lets
UPDATE herald_deliveries SET flow = 1 WHERE destination_id = $1
  AND status = 'pending' AND kind = 'event' AND flow = 0

-- next_due_at --
-- The first of each lane (flow: herald.flow), each the head of its range of the index
SELECT MIN(due) FROM (
  SELECT MIN(next_attempt_at) AS due FROM herald_deliveries
  WHERE status = 'pending' AND held = 0 AND flow = 0
  UNION ALL
  SELECT MIN(next_attempt_at) FROM herald_deliveries
  WHERE status = 'pending' AND held = 0 AND flow = 1) lanes

-- release_leases --
UPDATE herald_deliveries SET next_attempt_at = $1, lease_owner = NULL
WHERE status = 'pending' AND lease_owner = $2

-- release_all_leases --
UPDATE herald_deliveries SET next_attempt_at = $1, lease_owner = NULL
WHERE status = 'pending' AND lease_owner IS NOT NULL

-- list_instances --
SELECT id, hostname, pid, version, started_at, heartbeat_at FROM herald_instances
ORDER BY started_at, id

-- remove_instance --
DELETE FROM herald_instances WHERE id = $1

-- delivery_counts --
-- Three range counts on the pending index (two ranges each, one a lane): a GROUP BY
-- on an expression took 0.8 s at 1 M scheduled retries
SELECT (SELECT COUNT(*) FROM herald_deliveries
    WHERE status = 'pending' AND held = 0 AND flow IN (0, 1) AND next_attempt_at <= $1),
  (SELECT COUNT(*) FROM herald_deliveries
    WHERE status = 'pending' AND held = 0 AND flow IN (0, 1) AND next_attempt_at > $1),
  (SELECT COUNT(*) FROM herald_deliveries WHERE status = 'pending' AND held >= 1)

-- tenant_destination_count --
-- A tenant's destinations that are not deleted (the index on tenant_id)
SELECT COUNT(*) FROM herald_destinations WHERE tenant_id = $1 AND deleted_at IS NULL

-- destination_counts --
SELECT type, status, COUNT(*) FROM herald_destinations WHERE deleted_at IS NULL GROUP BY 1, 2

-- all_destinations --
SELECT id, tenant_id, name, type, config, secrets, events, status, created_at, updated_at,
  deleted_at, consecutive_failures, failing_since, verification_failed_at, verification_error,
  payload_filter, f.rate, f.breaker, f.circuit, f.opened_at, f.next_probe_at,
  ordering
FROM herald_destinations LEFT JOIN herald_flow f ON f.destination_id = id WHERE deleted_at IS NULL

-- create_destination --
INSERT INTO herald_destinations (id, tenant_id, name, type, config, secrets, events, status,
  created_at, updated_at, deleted_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)

-- set_destination_filter --
-- Written beside the row only when there is one: a database an older Herald made
-- (a migration's test fills one with this store) has no such column yet
UPDATE herald_destinations SET payload_filter = $1 WHERE id = $2

-- update_destination --
-- $9: the updated_at the caller read (optimistic concurrency), or NULL to write anyway
UPDATE herald_destinations SET name = $1, type = $2, config = $3, secrets = $4, events = $5,
  status = $6, updated_at = $7, payload_filter = $10, ordering = $11
WHERE id = $8 AND deleted_at IS NULL AND ($9::float8 IS NULL OR updated_at = $9)

-- fail_verifications --
-- A new verification supersedes the pending one
UPDATE herald_deliveries SET status = 'failure', next_attempt_at = NULL, lease_owner = NULL,
  updated_at = $1
WHERE destination_id = $2 AND kind = 'verification' AND status = 'pending'

-- get_destination --
SELECT id, tenant_id, name, type, config, secrets, events, status, created_at, updated_at,
  deleted_at, consecutive_failures, failing_since, verification_failed_at, verification_error,
  payload_filter, f.rate, f.breaker, f.circuit, f.opened_at, f.next_probe_at,
  ordering
FROM herald_destinations LEFT JOIN herald_flow f ON f.destination_id = id WHERE id = $1 AND ($2::text IS NULL OR tenant_id = $2)

-- list_destinations --
SELECT id, tenant_id, name, type, config, secrets, events, status, created_at, updated_at,
  deleted_at, consecutive_failures, failing_since, verification_failed_at, verification_error,
  payload_filter, f.rate, f.breaker, f.circuit, f.opened_at, f.next_probe_at,
  ordering
FROM herald_destinations LEFT JOIN herald_flow f ON f.destination_id = id WHERE ($1::text IS NULL OR tenant_id = $1) AND deleted_at IS NULL
  AND ($2::text IS NULL OR status = $2) AND ($3::text IS NULL OR type = $3)
  AND ($4::text IS NULL OR id < $4)
ORDER BY id DESC LIMIT $5

-- delete_destination --
UPDATE herald_destinations SET deleted_at = $1, updated_at = $1
WHERE id = $2 AND tenant_id = $3 AND deleted_at IS NULL

-- fail_deliveries_of --
UPDATE herald_deliveries SET status = 'failure', next_attempt_at = NULL, lease_owner = NULL,
  updated_at = $1
WHERE destination_id = $2 AND status = 'pending'

-- get_delivery --
SELECT d.id, d.tenant_id, d.event_id, d.event_type, d.destination_id, d.kind, d.status,
  d.attempt_count, d.max_attempts, d.next_attempt_at, d.held, d.created_at, d.updated_at,
  a.id, a.number, a.started_at, a.duration_ms, a.outcome, a.response_status, a.error,
  a.response_excerpt, d.replay_id, d.lease_owner IS NOT NULL
FROM herald_deliveries d LEFT JOIN herald_attempts a ON a.id = d.last_attempt_id
WHERE d.id = $1 AND ($2::text IS NULL OR d.tenant_id = $2)

-- attempts_of --
SELECT id, delivery_id, number, started_at, duration_ms, outcome, response_status, error,
  response_excerpt, exchange
FROM herald_attempts WHERE delivery_id = $1 ORDER BY number, started_at

-- _flow_row --
-- A herald_flow row as herald.store.rows.flow_from_row reads it
destination_id, rate, breaker, tat, circuit, opened_at, next_probe_at, cooldown, gate_until

-- _delivery_listing --
-- A delivery with its last attempt, as every listing of deliveries reads it
d.id, d.tenant_id, d.event_id, d.event_type, d.destination_id, d.kind, d.status,
  d.attempt_count, d.max_attempts, d.next_attempt_at, d.held, d.created_at, d.updated_at,
  a.id, a.number, a.started_at, a.duration_ms, a.outcome, a.response_status, a.error,
  a.response_excerpt, d.replay_id, d.lease_owner IS NOT NULL

-- list_deliveries --
-- {where}: the filter's clauses; {limit}: the limit's placeholder (both built per call)
SELECT {_delivery_listing}
FROM herald_deliveries d LEFT JOIN herald_attempts a ON a.id = d.last_attempt_id
WHERE {where} ORDER BY d.id DESC LIMIT {limit}

-- count_deliveries --
SELECT COUNT(*) FROM herald_deliveries d WHERE {where}

-- get_event --
SELECT id, tenant_id, type, created_at, created_ts, data, traceparent, ordering_key
FROM herald_events
WHERE id = $1 AND ($2::text IS NULL OR tenant_id = $2)

-- expire_rate_windows --
DELETE FROM herald_rate_limits WHERE window_no < $1

-- idempotency_expire --
DELETE FROM herald_idempotency WHERE created_at < $1

-- idempotency_reserve --
INSERT INTO herald_idempotency (tenant_id, key, fingerprint, created_at)
VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING RETURNING 1

-- idempotency_get --
SELECT fingerprint, status, body FROM herald_idempotency WHERE tenant_id = $1 AND key = $2

-- idempotency_finish --
UPDATE herald_idempotency SET status = $1, body = $2 WHERE tenant_id = $3 AND key = $4

-- idempotency_abort --
DELETE FROM herald_idempotency WHERE tenant_id = $1 AND key = $2 AND status IS NULL

-- purge_rejected --
DELETE FROM herald_outbox_rejected WHERE (source, seq) IN (SELECT source, seq
  FROM herald_outbox_rejected WHERE rejected_at < $1 LIMIT $2)

-- create_api_key --
INSERT INTO herald_api_keys (hash, tenant_id, hint, created_at, kind)
VALUES ($1, $2, $3, $4, $5)

-- api_key --
-- An unrevoked key by its hash, of either kind (herald.access.keys.KeyCache: every face's lookup)
SELECT hash, tenant_id, hint, created_at, revoked_at, kind FROM herald_api_keys
WHERE hash = $1 AND revoked_at IS NULL

-- list_api_keys --
SELECT hash, tenant_id, hint, created_at, revoked_at, kind FROM herald_api_keys
WHERE tenant_id = $1 AND kind = $2 ORDER BY created_at DESC, hash

-- reencrypt_update --
UPDATE herald_destinations SET secrets = $1 WHERE id = $2

-- create_replay --
INSERT INTO herald_replays (id, tenant_id, filter, requested_by, created_at, matched, requeued,
  finished_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)

-- update_replay --
-- $4: stopped before it had re-queued everything
UPDATE herald_replays SET requeued = $1, finished_at = $2, cut_short = $4 WHERE id = $3

-- end_unfinished_replays --
-- Replays a process that is gone left running (finished_at NULL): they end cut short
-- at $1, as far as their stored progress got
UPDATE herald_replays SET finished_at = $1, cut_short = $2 WHERE finished_at IS NULL

-- get_replay --
-- $2 NULL: any tenant's, and operator-wide ones (an operator asks)
SELECT id, tenant_id, filter, requested_by, created_at, matched, requeued, finished_at,
  cut_short
FROM herald_replays WHERE id = $1 AND ($2::text IS NULL OR tenant_id = $2)

-- list_replays --
SELECT id, tenant_id, filter, requested_by, created_at, matched, requeued, finished_at,
  cut_short
FROM herald_replays WHERE ($1::text IS NULL OR tenant_id = $1) AND ($2::text IS NULL OR id < $2)
ORDER BY id DESC LIMIT $3

-- create_token --
INSERT INTO herald_session_tokens (id, tenant_id, token_hash, key_hash, created_at, expires_at)
VALUES ($1, $2, $3, $4, $5, $6)

-- token_state --
-- Why a token did not open (read only after it did not)
SELECT t.traded_at, t.revoked_at, t.expires_at, k.revoked_at
FROM herald_session_tokens t LEFT JOIN herald_api_keys k ON k.hash = t.key_hash
WHERE t.token_hash = $1

-- session_state --
SELECT t.traded_at, t.revoked_at, t.expires_at, k.revoked_at
FROM herald_session_tokens t LEFT JOIN herald_api_keys k ON k.hash = t.key_hash
WHERE t.session_hash = $1

-- reissue_token --
-- A new tk_ value for a token not yet traded (an idempotent POST /v2/token repeated)
UPDATE herald_session_tokens SET token_hash = $1
WHERE id = $2 AND tenant_id = $3 AND traded_at IS NULL AND revoked_at IS NULL
  AND expires_at > $4
  AND EXISTS (SELECT 1 FROM herald_api_keys k WHERE k.hash = key_hash AND k.revoked_at IS NULL)
RETURNING id, tenant_id, created_at, expires_at

-- close_session --
UPDATE herald_session_tokens SET revoked_at = $2 WHERE session_hash = $1 AND revoked_at IS NULL

-- purge_tokens --
DELETE FROM herald_session_tokens WHERE id IN (SELECT id FROM herald_session_tokens
  WHERE expires_at < $1 LIMIT $2)

-- purge_replays --
-- Replays older than the retention's cut-off that no delivery carries any more
DELETE FROM herald_replays WHERE id IN (SELECT r.id FROM herald_replays r
  WHERE r.created_at < $1 AND NOT EXISTS (SELECT 1 FROM herald_deliveries d
    WHERE d.replay_id = r.id) LIMIT $2)

-- count_hour --
-- A destination's successful ($3) and failed ($4) attempts of hour $2, added
INSERT INTO herald_destination_hours (destination_id, hour, successes, failures)
VALUES ($1, $2, $3, $4)
ON CONFLICT (destination_id, hour) DO UPDATE SET
  successes = herald_destination_hours.successes + excluded.successes,
  failures = herald_destination_hours.failures + excluded.failures

-- destination_hours --
SELECT hour, successes, failures FROM herald_destination_hours
WHERE destination_id = $1 AND hour >= $2 ORDER BY hour

-- purge_hours --
-- Hours (since the epoch) before $1, up to $2 rows
DELETE FROM herald_destination_hours WHERE (destination_id, hour) IN (
  SELECT destination_id, hour FROM herald_destination_hours WHERE hour < $1 LIMIT $2)

-- replay_counts --
SELECT key, value FROM herald_meta WHERE key LIKE 'replay%:%'

-- operator_key_revoked --
SELECT 1 FROM herald_api_keys WHERE hash = $1 AND kind = 'operator' AND revoked_at IS NOT NULL

-- console_session_create --
INSERT INTO herald_console_sessions (id_hash, key_hash, created_at, last_seen)
VALUES ($1, $2, $3, $3)

-- console_session_get --
-- A session lives only while its operator key does: revoking the key ends it
SELECT s.key_hash, s.created_at, s.last_seen FROM herald_console_sessions s
JOIN herald_api_keys k ON k.hash = s.key_hash
WHERE s.id_hash = $1 AND k.kind = 'operator' AND k.revoked_at IS NULL

-- console_session_touch --
UPDATE herald_console_sessions SET last_seen = $1 WHERE id_hash = $2

-- console_session_delete --
DELETE FROM herald_console_sessions WHERE id_hash = $1

-- console_sessions_expire --
DELETE FROM herald_console_sessions WHERE last_seen < $1 OR created_at < $2

-- console_in_flight --
-- Leased deliveries: being attempted right now (herald_deliveries_leased)
SELECT COUNT(*) FROM herald_deliveries WHERE lease_owner IS NOT NULL

-- console_rejected_count --
-- Rejected outbox rows, counted up to $1 (their data is never read)
SELECT COUNT(*) FROM (SELECT 1 FROM herald_outbox_rejected LIMIT $1) AS r

-- failing_now --
-- Destinations in a failing episode, the longest failing first, $1 one tenant's or NULL
-- (herald_destinations_failing: its predicate written out)
SELECT id, tenant_id, name, failing_since, consecutive_failures FROM herald_destinations
WHERE failing_since IS NOT NULL AND deleted_at IS NULL AND ($1::text IS NULL OR tenant_id = $1)
ORDER BY failing_since LIMIT $2

-- attempt_hours --
-- Every destination's attempts per hour since hour $1 (herald_destination_hours_hour)
SELECT hour, SUM(successes), SUM(failures) FROM herald_destination_hours
WHERE hour >= $1 GROUP BY hour

-- tenant_attempt_hours --
-- attempt_hours for one tenant ($2): its destinations, then their hours by primary key
SELECT h.hour, SUM(h.successes), SUM(h.failures)
FROM herald_destinations t JOIN herald_destination_hours h ON h.destination_id = t.id
WHERE t.tenant_id = $2 AND h.hour >= $1 GROUP BY h.hour

-- source_release --
DELETE FROM herald_source_leases WHERE source = $1 AND owner = $2

-- recent_events --
-- A tenant's newest events, newest first (a filter's test picks those of its types)
SELECT id, tenant_id, type, created_at, created_ts, data, traceparent, ordering_key
FROM herald_events
WHERE tenant_id = $1 ORDER BY ingested_at DESC LIMIT $2

-- get_event_type --
SELECT tenant_id, type, description, schema, created_at, updated_at FROM herald_event_types
WHERE tenant_id = $1 AND type = $2

-- list_event_types --
-- One tenant's catalog in type order, types strictly after $2 ('' for the first page)
SELECT tenant_id, type, description, schema, created_at, updated_at FROM herald_event_types
WHERE tenant_id = $1 AND type > $2 ORDER BY type LIMIT $3

-- all_event_types --
SELECT tenant_id, type, description, schema, created_at, updated_at FROM herald_event_types

-- delete_event_type --
DELETE FROM herald_event_types WHERE tenant_id = $1 AND type = $2

-- requeue_ordered --
-- A re-queued delivery joins its key ($1) at $2 (order_seq), waiting behind what of
-- the key is pending ($3 = 1) or as its head
UPDATE herald_deliveries SET ordering_key = $1, order_seq = $2,
  held = CASE WHEN $3 = 1 THEN 2 ELSE held END
WHERE id = $4 AND status = 'pending'

-- set_destination_ordering --
-- Written beside the row only when ordered (as the filter: an older schema has no column)
UPDATE herald_destinations SET ordering = $1 WHERE id = $2

-- unorder_deliveries --
-- Destination $1 is no longer ordered: its pending deliveries leave their keys, and
-- those that waited are claimable now (held as any when it is not active)
UPDATE herald_deliveries SET ordering_key = NULL,
  held = CASE WHEN held <> 2 THEN held
    WHEN (SELECT t.status FROM herald_destinations t WHERE t.id = $1) = 'active' THEN 0
    ELSE 1 END
WHERE destination_id = $1 AND status = 'pending' AND ordering_key IS NOT NULL

-- blocked_keys --
-- An ordered destination's keys whose next delivery waits, with the delivery at their
-- head (the one it waits for), up to $2: one walk of herald_deliveries_keyed
SELECT h.ordering_key, h.id, h.status, h.attempt_count, h.next_attempt_at,
  h.lease_owner IS NOT NULL,
  (SELECT COUNT(*) FROM herald_deliveries w WHERE w.destination_id = h.destination_id
    AND w.ordering_key = h.ordering_key AND w.status = 'pending' AND w.held = 2)
FROM herald_deliveries h
WHERE h.destination_id = $1 AND h.status = 'pending' AND h.ordering_key IS NOT NULL
  AND h.held <> 2
  AND EXISTS (SELECT 1 FROM herald_deliveries w WHERE w.destination_id = h.destination_id
    AND w.ordering_key = h.ordering_key AND w.status = 'pending' AND w.held = 2)
ORDER BY h.next_attempt_at LIMIT $2

-- destination_last --
SELECT destination_id, last_success_at, last_failure_at FROM herald_destination_stats
WHERE destination_id = ANY($1::text[])

-- destination_rates --
-- The destinations' attempts since hour $1: at most 24 rows each, by primary key
SELECT destination_id, SUM(successes), SUM(failures) FROM herald_destination_hours
WHERE hour >= $1 AND destination_id = ANY($2::text[]) GROUP BY destination_id

-- purge_attempts --
DELETE FROM herald_attempts WHERE delivery_id = ANY($1)

-- replay_outcomes --
-- From herald_deliveries_replay alone (IS NOT NULL: its condition, said outright)
SELECT replay_id, status, COUNT(*) FROM herald_deliveries
WHERE replay_id IS NOT NULL AND replay_id = ANY($1) GROUP BY replay_id, status

-- requeue_keys --
-- Of the deliveries a re-queue takes, those of an ordered key now or before: whether
-- each is pending, its order so far, and its key as the re-queue gives it (the event's,
-- when its destination is ordered now)
SELECT d.id, d.destination_id, d.status = 'pending', d.order_seq, d.ordering_key,
  CASE WHEN t.ordering = 'key' THEN e.ordering_key END
FROM herald_deliveries d
JOIN herald_destinations t ON t.id = d.destination_id AND t.deleted_at IS NULL
JOIN herald_events e ON e.id = d.event_id AND e.tenant_id = d.tenant_id
WHERE d.kind = 'event' AND d.lease_owner IS NULL
  AND (d.ordering_key IS NOT NULL OR (t.ordering = 'key' AND e.ordering_key IS NOT NULL))
  AND d.id = ANY($1)
