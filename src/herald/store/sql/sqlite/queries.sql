-- Herald's statements on SQLite, by name (herald.store.queries). Parameters are
-- numbered (?1, ?2 …) so that both dialects take the same arguments in the same order.
-- {ids} is a list argument, always the last: expanded to one placeholder per value.

-- migrations_table --
CREATE TABLE IF NOT EXISTS herald_schema_migrations
  (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)

-- migrations_done --
SELECT version FROM herald_schema_migrations

-- migration_applied --
INSERT INTO herald_schema_migrations VALUES (?1, ?2, ?3)

-- ping --
SELECT value FROM herald_meta LIMIT 1

-- schema_version --
SELECT MAX(version) FROM herald_schema_migrations

-- destinations_version --
SELECT value FROM herald_meta WHERE key = 'destinations_version'

-- bump_version --
UPDATE herald_meta SET value = value + 1 WHERE key = 'destinations_version'

-- outbox_any --
-- An idle relay's look before it takes the write lock
SELECT 1 FROM herald_outbox LIMIT 1

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
SELECT id, status, ordering FROM herald_destinations WHERE deleted_at IS NULL AND id IN ({ids})

-- insert_deliveries --
INSERT INTO herald_deliveries (id, tenant_id, event_id, event_type, destination_id, kind,
  max_attempts, next_attempt_at, held, created_at, lease_owner, ordering_key, order_seq,
  status, attempt_count, updated_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, 'pending', 0, ?10)

-- insert_outbox --
-- One check under the write lock: not waiting in the outbox (UNIQUE) nor relayed already,
-- for this tenant (another tenant's event of the same id is another event)
INSERT INTO herald_outbox (id, tenant_id, type, data, created_at, traceparent, ordering_key)
SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7
WHERE NOT EXISTS (SELECT 1 FROM herald_events WHERE id = ?1 AND tenant_id = ?2)

-- outbox_stats --
SELECT COUNT(*), (SELECT CAST(created_at AS BLOB) FROM herald_outbox ORDER BY seq LIMIT 1)
FROM herald_outbox

-- list_rejected --
-- ?2: one tenant's rows (as the row spelled it), or NULL for every tenant's
SELECT seq, id, tenant_id, type, data, created_at, reason, rejected_at, source
FROM herald_outbox_rejected WHERE ?2 IS NULL OR tenant_id = ?2
ORDER BY rejected_at DESC, seq DESC LIMIT ?1

-- outbox_event --
SELECT {_outbox_row} FROM herald_outbox WHERE id = ?1 AND tenant_id = ?2

-- claim_select --
-- Plain ? in order: {where} adds a due_since bound, excluded destinations and excluded
-- tenants per call; then now again, for the flow gates (herald.flow). The last column:
-- whether the destination is under flow control, then the delivery's ordering key (of
-- an ordered destination's: herald.ordering; only a key's head has held = 0)
SELECT id, destination_id, kind, attempt_count, max_attempts, tenant_id, event_id,
  next_attempt_at,
  EXISTS (SELECT 1 FROM herald_flow f WHERE f.destination_id = herald_deliveries.destination_id),
  ordering_key
FROM herald_deliveries WHERE status = 'pending' AND held = 0 AND next_attempt_at <= ?{where}
  AND (kind <> 'event' OR NOT EXISTS (SELECT 1 FROM herald_flow f
    WHERE f.destination_id = herald_deliveries.destination_id AND f.gate_until > ?))
ORDER BY next_attempt_at LIMIT ?

-- flow_lock --
-- The flow rows (herald.flow) of these destinations (the write lock holds them)
SELECT destination_id, rate, breaker, tat, circuit, opened_at, next_probe_at, cooldown,
  gate_until
FROM herald_flow WHERE destination_id IN ({ids}) ORDER BY destination_id

-- breaker_lock --
-- The same, of the destinations whose breaker is on
SELECT destination_id, rate, breaker, tat, circuit, opened_at, next_probe_at, cooldown,
  gate_until
FROM herald_flow WHERE breaker = 1 AND destination_id IN ({ids}) ORDER BY destination_id

-- set_flow --
INSERT INTO herald_flow (destination_id, rate, breaker, tat, circuit, opened_at,
  next_probe_at, cooldown, gate_until)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
ON CONFLICT (destination_id) DO UPDATE SET rate = excluded.rate, breaker = excluded.breaker,
  tat = excluded.tat, circuit = excluded.circuit, opened_at = excluded.opened_at,
  next_probe_at = excluded.next_probe_at, cooldown = excluded.cooldown,
  gate_until = excluded.gate_until

-- unclaim --
-- A claimed delivery the flow keeps waiting: due again when it was, as if never claimed
UPDATE herald_deliveries SET lease_owner = NULL, next_attempt_at = ?1
WHERE id = ?2 AND lease_owner = ?3 AND status = 'pending'

-- open_circuits --
SELECT f.destination_id FROM herald_flow f
JOIN herald_destinations d ON d.id = f.destination_id AND d.deleted_at IS NULL
WHERE f.breaker = 1 AND f.circuit <> 'closed'

-- claim_lease --
UPDATE herald_deliveries SET lease_owner = ?1, next_attempt_at = ?2 WHERE id IN ({ids})

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

-- finish_attempts --
-- Only a still-pending delivery moves on: one deleted meanwhile keeps its final state.
-- An ordered one (herald.ordering) only while no other instance leased it since (?7
-- the recorder's instance): its lease ran out and a peer repeats it now, and ending it
-- here would let the next of its key overtake that repeat
UPDATE herald_deliveries SET status = ?1, attempt_count = ?2, next_attempt_at = ?3,
  lease_owner = NULL, updated_at = ?4, last_attempt_id = ?5
WHERE id = ?6 AND status = 'pending'
  AND (ordering_key IS NULL OR lease_owner IS NULL OR lease_owner = ?7)

-- order_lock --
-- Taken first by a relay pass that may plan ordered deliveries, and by a re-queue of
-- ordered ones: one at a time, so the relay's order (order_seq) is the order it took
-- the rows in (SQLite: the write lock already is that)
SELECT 1

-- order_take --
-- ?1 more order_seq values: the new top comes back (the first is top - ?1 + 1)
INSERT INTO herald_meta (key, value) VALUES ('order_seq', ?1)
ON CONFLICT (key) DO UPDATE SET value = herald_meta.value + excluded.value RETURNING value

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

-- signal_state --
-- The signal state of the batch's live destinations (the write lock holds it)
SELECT id, type, consecutive_failures, failing_since FROM herald_destinations
WHERE deleted_at IS NULL AND id IN ({ids})

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

-- set_signal_state --
UPDATE herald_destinations SET consecutive_failures = ?1, failing_since = ?2 WHERE id = ?3

-- verification_failed --
-- The verification ran out of attempts: the destination stays pending_verification
UPDATE herald_destinations SET verification_failed_at = ?1, verification_error = ?2
WHERE id = ?3 AND status = 'pending_verification' AND deleted_at IS NULL

-- clear_verification_failure --
-- A new verification ping is on its way
UPDATE herald_destinations SET verification_failed_at = NULL, verification_error = NULL
WHERE id = ?1

-- failing_count --
SELECT COUNT(*) FROM herald_destinations WHERE failing_since IS NOT NULL AND deleted_at IS NULL

-- set_held --
UPDATE herald_deliveries SET held = ?1 WHERE destination_id = ?2
  AND status = 'pending' AND kind = 'event' AND held = ?3

-- next_due_at --
SELECT MIN(next_attempt_at) FROM herald_deliveries WHERE status = 'pending' AND held = 0

-- release_leases --
UPDATE herald_deliveries SET next_attempt_at = ?1, lease_owner = NULL
WHERE status = 'pending' AND lease_owner = ?2

-- release_all_leases --
UPDATE herald_deliveries SET next_attempt_at = ?1, lease_owner = NULL
WHERE status = 'pending' AND lease_owner IS NOT NULL

-- heartbeat_update --
UPDATE herald_instances SET heartbeat_at = ?1 WHERE id = ?2

-- heartbeat_insert --
INSERT INTO herald_instances VALUES (?1, ?2, ?3, ?4, ?5, ?6)

-- reap_select --
SELECT id FROM herald_instances WHERE heartbeat_at < ?1

-- list_instances --
SELECT id, hostname, pid, version, started_at, heartbeat_at FROM herald_instances
ORDER BY started_at, id

-- remove_instance --
DELETE FROM herald_instances WHERE id = ?1

-- delivery_counts --
-- Three range counts on the pending index: a GROUP BY on an expression took 0.8 s
-- at 1 M scheduled retries
SELECT (SELECT COUNT(*) FROM herald_deliveries
    WHERE status = 'pending' AND held = 0 AND next_attempt_at <= ?1),
  (SELECT COUNT(*) FROM herald_deliveries
    WHERE status = 'pending' AND held = 0 AND next_attempt_at > ?1),
  (SELECT COUNT(*) FROM herald_deliveries WHERE status = 'pending' AND held >= 1)

-- tenant_destination_count --
-- A tenant's destinations that are not deleted (the index on tenant_id)
SELECT COUNT(*) FROM herald_destinations WHERE tenant_id = ?1 AND deleted_at IS NULL

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
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)

-- set_destination_filter --
-- Written beside the row only when there is one: a database an older Herald made
-- (a migration's test fills one with this store) has no such column yet
UPDATE herald_destinations SET payload_filter = ?1 WHERE id = ?2

-- update_destination --
-- ?9: the updated_at the caller read (optimistic concurrency), or NULL to write anyway
UPDATE herald_destinations SET name = ?1, type = ?2, config = ?3, secrets = ?4, events = ?5,
  status = ?6, updated_at = ?7, payload_filter = ?10, ordering = ?11
WHERE id = ?8 AND deleted_at IS NULL AND (?9 IS NULL OR updated_at = ?9)

-- fail_verifications --
-- A new verification supersedes the pending one
UPDATE herald_deliveries SET status = 'failure', next_attempt_at = NULL, lease_owner = NULL,
  updated_at = ?1
WHERE destination_id = ?2 AND kind = 'verification' AND status = 'pending'

-- get_destination --
SELECT id, tenant_id, name, type, config, secrets, events, status, created_at, updated_at,
  deleted_at, consecutive_failures, failing_since, verification_failed_at, verification_error,
  payload_filter, f.rate, f.breaker, f.circuit, f.opened_at, f.next_probe_at,
  ordering
FROM herald_destinations LEFT JOIN herald_flow f ON f.destination_id = id WHERE id = ?1 AND (?2 IS NULL OR tenant_id = ?2)

-- list_destinations --
SELECT id, tenant_id, name, type, config, secrets, events, status, created_at, updated_at,
  deleted_at, consecutive_failures, failing_since, verification_failed_at, verification_error,
  payload_filter, f.rate, f.breaker, f.circuit, f.opened_at, f.next_probe_at,
  ordering
FROM herald_destinations LEFT JOIN herald_flow f ON f.destination_id = id WHERE (?1 IS NULL OR tenant_id = ?1) AND deleted_at IS NULL
  AND (?2 IS NULL OR status = ?2) AND (?3 IS NULL OR type = ?3) AND (?4 IS NULL OR id < ?4)
ORDER BY id DESC LIMIT ?5

-- delete_destination --
UPDATE herald_destinations SET deleted_at = ?1, updated_at = ?1
WHERE id = ?2 AND tenant_id = ?3 AND deleted_at IS NULL

-- fail_deliveries_of --
UPDATE herald_deliveries SET status = 'failure', next_attempt_at = NULL, lease_owner = NULL,
  updated_at = ?1
WHERE destination_id = ?2 AND status = 'pending'

-- get_delivery --
SELECT d.id, d.tenant_id, d.event_id, d.event_type, d.destination_id, d.kind, d.status,
  d.attempt_count, d.max_attempts, d.next_attempt_at, d.held, d.created_at, d.updated_at,
  a.id, a.number, a.started_at, a.duration_ms, a.outcome, a.response_status, a.error,
  a.response_excerpt, d.replay_id, d.lease_owner IS NOT NULL
FROM herald_deliveries d LEFT JOIN herald_attempts a ON a.id = d.last_attempt_id
WHERE d.id = ?1 AND (?2 IS NULL OR d.tenant_id = ?2)

-- attempts_of --
SELECT id, delivery_id, number, started_at, duration_ms, outcome, response_status, error,
  response_excerpt, exchange
FROM herald_attempts WHERE delivery_id = ?1 ORDER BY number, started_at

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

-- count_deliveries --
SELECT COUNT(*) FROM herald_deliveries d WHERE {where}

-- requeue --
-- A pending one keeps its place in its key (herald.ordering); a finished one leaves
-- its key, which requeue_ordered gives it again, at the end. Finished deliveries get ?1 more attempts; deleted destinations and pings are left alone.
-- ?3: the replay re-queuing them takes them over (NULL: a retry, which keeps theirs)
UPDATE herald_deliveries SET
  max_attempts = CASE WHEN status = 'pending' THEN max_attempts ELSE attempt_count + ?1 END,
  status = 'pending', next_attempt_at = ?2, lease_owner = NULL, updated_at = ?2,
  replay_id = COALESCE(?3, replay_id),
  held = CASE WHEN status = 'pending' AND held = 2 THEN 2
    ELSE (SELECT CASE WHEN t.status = 'active' THEN 0 ELSE 1 END
      FROM herald_destinations t WHERE t.id = destination_id) END,
  ordering_key = CASE WHEN status = 'pending' THEN ordering_key END
WHERE id IN ({ids}) AND kind = 'event' AND lease_owner IS NULL
  AND destination_id IN (SELECT id FROM herald_destinations WHERE deleted_at IS NULL)

-- get_event --
SELECT id, tenant_id, type, created_at, created_ts, data, traceparent, ordering_key
FROM herald_events
WHERE id = ?1 AND (?2 IS NULL OR tenant_id = ?2)

-- expire_rate_windows --
DELETE FROM herald_rate_limits WHERE window_no < ?1

-- count_request --
INSERT INTO herald_rate_limits (tenant_id, window_no, count) VALUES (?1, ?2, 1)
ON CONFLICT (tenant_id, window_no) DO UPDATE SET count = count + 1 RETURNING count

-- idempotency_expire --
DELETE FROM herald_idempotency WHERE created_at < ?1

-- idempotency_reserve --
INSERT INTO herald_idempotency (tenant_id, key, fingerprint, created_at)
VALUES (?1, ?2, ?3, ?4) ON CONFLICT DO NOTHING RETURNING 1

-- idempotency_get --
SELECT fingerprint, status, body FROM herald_idempotency WHERE tenant_id = ?1 AND key = ?2

-- idempotency_finish --
UPDATE herald_idempotency SET status = ?1, body = ?2 WHERE tenant_id = ?3 AND key = ?4

-- idempotency_abort --
DELETE FROM herald_idempotency WHERE tenant_id = ?1 AND key = ?2 AND status IS NULL

-- purge_select --
SELECT id FROM herald_deliveries WHERE status <> 'pending' AND updated_at < ?1
ORDER BY updated_at LIMIT ?2

-- purge_attempts --
DELETE FROM herald_attempts WHERE delivery_id IN ({ids})

-- purge_deliveries --
DELETE FROM herald_deliveries WHERE id IN ({ids})

-- purge_events --
-- By rowid: another tenant's event of the same id may still have deliveries
DELETE FROM herald_events WHERE rowid IN (SELECT e.rowid FROM herald_events e
  WHERE e.ingested_at < ?1 AND NOT EXISTS (SELECT 1 FROM herald_deliveries d
    WHERE d.event_id = e.id AND d.tenant_id = e.tenant_id) LIMIT ?2)

-- purge_rejected --
DELETE FROM herald_outbox_rejected WHERE (source, seq) IN (SELECT source, seq
  FROM herald_outbox_rejected WHERE rejected_at < ?1 LIMIT ?2)

-- create_api_key --
INSERT INTO herald_api_keys (hash, tenant_id, hint, created_at, kind)
VALUES (?1, ?2, ?3, ?4, ?5)

-- api_key --
-- An unrevoked key by its hash, of either kind (herald.apikeys.KeyCache: every face's lookup)
SELECT hash, tenant_id, hint, created_at, revoked_at, kind FROM herald_api_keys
WHERE hash = ?1 AND revoked_at IS NULL

-- list_api_keys --
SELECT hash, tenant_id, hint, created_at, revoked_at, kind FROM herald_api_keys
WHERE tenant_id = ?1 AND kind = ?2 ORDER BY created_at DESC, hash

-- revoke_api_keys --
UPDATE herald_api_keys SET revoked_at = ?1
WHERE tenant_id = ?2 AND substr(hash, 1, ?3) = ?4 AND revoked_at IS NULL
  AND kind = ?5

-- reencrypt_select --
SELECT id, secrets FROM herald_destinations WHERE id > ?1 ORDER BY id LIMIT ?2

-- reencrypt_update --
UPDATE herald_destinations SET secrets = ?1 WHERE id = ?2

-- create_replay --
INSERT INTO herald_replays (id, tenant_id, filter, requested_by, created_at, matched, requeued,
  finished_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)

-- update_replay --
-- ?4: stopped before it had re-queued everything
UPDATE herald_replays SET requeued = ?1, finished_at = ?2, cut_short = ?4 WHERE id = ?3

-- end_unfinished_replays --
-- Replays a process that is gone left running (finished_at NULL): they end cut short
-- at ?1, as far as their stored progress got
UPDATE herald_replays SET finished_at = ?1, cut_short = ?2 WHERE finished_at IS NULL

-- get_replay --
-- ?2 NULL: any tenant's, and operator-wide ones (an operator asks)
SELECT id, tenant_id, filter, requested_by, created_at, matched, requeued, finished_at,
  cut_short
FROM herald_replays WHERE id = ?1 AND (?2 IS NULL OR tenant_id = ?2)

-- list_replays --
SELECT id, tenant_id, filter, requested_by, created_at, matched, requeued, finished_at,
  cut_short
FROM herald_replays WHERE (?1 IS NULL OR tenant_id = ?1) AND (?2 IS NULL OR id < ?2)
ORDER BY id DESC LIMIT ?3

-- replay_outcomes --
-- From herald_deliveries_replay alone (IS NOT NULL: its condition, said outright)
SELECT replay_id, status, COUNT(*) FROM herald_deliveries
WHERE replay_id IS NOT NULL AND replay_id IN ({ids}) GROUP BY replay_id, status

-- create_token --
INSERT INTO herald_session_tokens (id, tenant_id, token_hash, key_hash, created_at, expires_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6)

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

-- token_state --
-- Why a token did not open (read only after it did not)
SELECT t.traded_at, t.revoked_at, t.expires_at, k.revoked_at
FROM herald_session_tokens t LEFT JOIN herald_api_keys k ON k.hash = t.key_hash
WHERE t.token_hash = ?1

-- session_state --
SELECT t.traded_at, t.revoked_at, t.expires_at, k.revoked_at
FROM herald_session_tokens t LEFT JOIN herald_api_keys k ON k.hash = t.key_hash
WHERE t.session_hash = ?1

-- reissue_token --
-- A new tk_ value for a token not yet traded (an idempotent POST /v2/token repeated)
UPDATE herald_session_tokens SET token_hash = ?1
WHERE id = ?2 AND tenant_id = ?3 AND traded_at IS NULL AND revoked_at IS NULL
  AND expires_at > ?4
  AND EXISTS (SELECT 1 FROM herald_api_keys k WHERE k.hash = key_hash AND k.revoked_at IS NULL)
RETURNING id, tenant_id, created_at, expires_at

-- close_session --
UPDATE herald_session_tokens SET revoked_at = ?2 WHERE session_hash = ?1 AND revoked_at IS NULL

-- purge_tokens --
DELETE FROM herald_session_tokens WHERE id IN (SELECT id FROM herald_session_tokens
  WHERE expires_at < ?1 LIMIT ?2)

-- purge_replays --
-- Replays older than the retention's cut-off that no delivery carries any more
DELETE FROM herald_replays WHERE id IN (SELECT r.id FROM herald_replays r
  WHERE r.created_at < ?1 AND NOT EXISTS (SELECT 1 FROM herald_deliveries d
    WHERE d.replay_id = r.id) LIMIT ?2)

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

-- count_hour --
-- A destination's successful (?3) and failed (?4) attempts of hour ?2, added
INSERT INTO herald_destination_hours (destination_id, hour, successes, failures)
VALUES (?1, ?2, ?3, ?4)
ON CONFLICT (destination_id, hour) DO UPDATE SET
  successes = herald_destination_hours.successes + excluded.successes,
  failures = herald_destination_hours.failures + excluded.failures

-- destination_last --
SELECT destination_id, last_success_at, last_failure_at FROM herald_destination_stats
WHERE destination_id IN ({ids})

-- destination_rates --
-- The destinations' attempts since hour ?1: at most 24 rows each, by primary key
SELECT destination_id, SUM(successes), SUM(failures) FROM herald_destination_hours
WHERE hour >= ?1 AND destination_id IN ({ids}) GROUP BY destination_id

-- destination_hours --
SELECT hour, successes, failures FROM herald_destination_hours
WHERE destination_id = ?1 AND hour >= ?2 ORDER BY hour

-- purge_hours --
-- Hours (since the epoch) before ?1, up to ?2 rows
DELETE FROM herald_destination_hours WHERE (destination_id, hour) IN (
  SELECT destination_id, hour FROM herald_destination_hours WHERE hour < ?1 LIMIT ?2)

-- count_replay --
-- Replays by who asked (?1), for every instance's metrics: replays:?1 and replayed:?1
INSERT INTO herald_meta (key, value) VALUES ('replays:' || ?1, 1), ('replayed:' || ?1, ?2)
ON CONFLICT (key) DO UPDATE SET value = value + excluded.value

-- replay_counts --
SELECT key, value FROM herald_meta WHERE key LIKE 'replay%:%'

-- operator_key_revoked --
SELECT 1 FROM herald_api_keys WHERE hash = ?1 AND kind = 'operator' AND revoked_at IS NOT NULL

-- console_session_create --
INSERT INTO herald_console_sessions (id_hash, key_hash, created_at, last_seen)
VALUES (?1, ?2, ?3, ?3)

-- console_session_get --
-- A session lives only while its operator key does: revoking the key ends it
SELECT s.key_hash, s.created_at, s.last_seen FROM herald_console_sessions s
JOIN herald_api_keys k ON k.hash = s.key_hash
WHERE s.id_hash = ?1 AND k.kind = 'operator' AND k.revoked_at IS NULL

-- console_session_touch --
UPDATE herald_console_sessions SET last_seen = ?1 WHERE id_hash = ?2

-- console_session_delete --
DELETE FROM herald_console_sessions WHERE id_hash = ?1

-- console_sessions_expire --
DELETE FROM herald_console_sessions WHERE last_seen < ?1 OR created_at < ?2

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

-- console_in_flight --
-- Leased deliveries: being attempted right now (herald_deliveries_leased)
SELECT COUNT(*) FROM herald_deliveries WHERE lease_owner IS NOT NULL

-- console_rejected_count --
-- Rejected outbox rows, counted up to ?1 (their data is never read)
SELECT COUNT(*) FROM (SELECT 1 FROM herald_outbox_rejected LIMIT ?1) AS r

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
    WHERE status = 'pending' AND held = 0 AND next_attempt_at <= ?1 AND destination_id IN (SELECT id FROM herald_destinations WHERE tenant_id = ?2)),
  (SELECT COUNT(*) FROM herald_deliveries INDEXED BY herald_deliveries_pending
    WHERE status = 'pending' AND held = 0 AND next_attempt_at > ?1 AND destination_id IN (SELECT id FROM herald_destinations WHERE tenant_id = ?2)),
  (SELECT COUNT(*) FROM herald_deliveries INDEXED BY herald_deliveries_pending
    WHERE status = 'pending' AND held >= 1 AND destination_id IN (SELECT id FROM herald_destinations WHERE tenant_id = ?2))

-- tenant_next_due_at --
-- next_due_at for one tenant (?1)
SELECT MIN(next_attempt_at) FROM herald_deliveries INDEXED BY herald_deliveries_pending
WHERE status = 'pending' AND held = 0 AND destination_id IN (SELECT id FROM herald_destinations WHERE tenant_id = ?1)

-- failing_now --
-- Destinations in a failing episode, the longest failing first, ?1 one tenant's or NULL
-- (herald_destinations_failing: its predicate written out)
SELECT id, tenant_id, name, failing_since, consecutive_failures FROM herald_destinations
WHERE failing_since IS NOT NULL AND deleted_at IS NULL AND (?1 IS NULL OR tenant_id = ?1)
ORDER BY failing_since LIMIT ?2

-- last_failed_attempt --
-- The last attempt of destination ?1's newest delivery that failed it: a walk of
-- herald_deliveries_destination from the newest, one primary-key probe of
-- herald_attempts a delivery
SELECT a.started_at, a.response_status, a.error
FROM herald_deliveries d INDEXED BY herald_deliveries_destination
JOIN herald_attempts a ON a.id = d.last_attempt_id
WHERE d.destination_id = ?1 AND a.outcome <> 'success'
ORDER BY d.id DESC LIMIT 1

-- attempt_hours --
-- Every destination's attempts per hour since hour ?1 (herald_destination_hours_hour)
SELECT hour, SUM(successes), SUM(failures) FROM herald_destination_hours
WHERE hour >= ?1 GROUP BY hour

-- tenant_attempt_hours --
-- attempt_hours for one tenant (?2): its destinations, then their hours by primary key
SELECT h.hour, SUM(h.successes), SUM(h.failures)
FROM herald_destinations t JOIN herald_destination_hours h ON h.destination_id = t.id
WHERE t.tenant_id = ?2 AND h.hour >= ?1 GROUP BY h.hour

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

-- source_release --
DELETE FROM herald_source_leases WHERE source = ?1 AND owner = ?2

-- recent_events --
-- A tenant's newest events, newest first (a filter's test picks those of its types)
SELECT id, tenant_id, type, created_at, created_ts, data, traceparent, ordering_key
FROM herald_events
WHERE tenant_id = ?1 ORDER BY ingested_at DESC LIMIT ?2

-- put_event_type --
INSERT INTO herald_event_types (tenant_id, type, description, schema, created_at, updated_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?5)
ON CONFLICT (tenant_id, type) DO UPDATE SET description = excluded.description,
  schema = excluded.schema, updated_at = MAX(excluded.updated_at, updated_at + 0.000001)

-- get_event_type --
SELECT tenant_id, type, description, schema, created_at, updated_at FROM herald_event_types
WHERE tenant_id = ?1 AND type = ?2

-- list_event_types --
-- One tenant's catalog in type order, types strictly after ?2 ('' for the first page)
SELECT tenant_id, type, description, schema, created_at, updated_at FROM herald_event_types
WHERE tenant_id = ?1 AND type > ?2 ORDER BY type LIMIT ?3

-- all_event_types --
SELECT tenant_id, type, description, schema, created_at, updated_at FROM herald_event_types

-- delete_event_type --
DELETE FROM herald_event_types WHERE tenant_id = ?1 AND type = ?2

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
  AND d.id IN ({ids})

-- requeue_ordered --
-- A re-queued delivery joins its key (?1) at ?2 (order_seq), waiting behind what of
-- the key is pending (?3 = 1) or as its head
UPDATE herald_deliveries SET ordering_key = ?1, order_seq = ?2,
  held = CASE WHEN ?3 = 1 THEN 2 ELSE held END
WHERE id = ?4 AND status = 'pending'

-- set_destination_ordering --
-- Written beside the row only when ordered (as the filter: an older schema has no column)
UPDATE herald_destinations SET ordering = ?1 WHERE id = ?2

-- unorder_deliveries --
-- Destination ?1 is no longer ordered: its pending deliveries leave their keys, and
-- those that waited are claimable now (held as any when it is not active)
UPDATE herald_deliveries SET ordering_key = NULL,
  held = CASE WHEN held <> 2 THEN held
    WHEN (SELECT t.status FROM herald_destinations t WHERE t.id = ?1) = 'active' THEN 0
    ELSE 1 END
WHERE destination_id = ?1 AND status = 'pending' AND ordering_key IS NOT NULL

-- blocked_keys --
-- An ordered destination's keys whose next delivery waits, with the delivery at their
-- head (the one it waits for), up to ?2: one walk of herald_deliveries_keyed
SELECT h.ordering_key, h.id, h.status, h.attempt_count, h.next_attempt_at,
  h.lease_owner IS NOT NULL,
  (SELECT COUNT(*) FROM herald_deliveries w WHERE w.destination_id = h.destination_id
    AND w.ordering_key = h.ordering_key AND w.status = 'pending' AND w.held = 2)
FROM herald_deliveries h
WHERE h.destination_id = ?1 AND h.status = 'pending' AND h.ordering_key IS NOT NULL
  AND h.held <> 2
  AND EXISTS (SELECT 1 FROM herald_deliveries w WHERE w.destination_id = h.destination_id
    AND w.ordering_key = h.ordering_key AND w.status = 'pending' AND w.held = 2)
ORDER BY h.next_attempt_at LIMIT ?2
