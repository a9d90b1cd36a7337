-- Only what this dialect writes its own way is here (herald.store.queries):
-- the statements SQLite writes differently, then those only PostgreSQL has (its
-- concurrent writers: one-statement claim and reap, lock ordering, the signal state's
-- too, the migration lock, and a two-step purge of events planned for index probes).
-- Every other statement is in ../queries.sql.

-- Herald's statements on PostgreSQL, by name (herald.store.queries). A list argument
-- is one array parameter; the arguments are the same, in the same order, as SQLite's.

-- What PostgreSQL's file said of shared statements, where ../queries.sql says it otherwise:
--   delivery_counts: Three range counts on the pending index rather than a GROUP BY on an expression over
--     every pending row

-- ---- Also in SQLite's file, written otherwise there ----

-- migrations_table --
CREATE TABLE IF NOT EXISTS herald_schema_migrations
  (version integer PRIMARY KEY, name text NOT NULL, applied_at double precision NOT NULL)

-- _outbox_row --
-- An outbox row as the relay parses it (herald.ingest.parse_row), its text as bytes.
-- Timestamps rendered the way SQLite stores them. Instants RFC 3339 cannot express keep
-- a form the relay rejects: 'infinity' as such (to_char gives NULL), a BC date with its
-- era (to_char gives the bare year)
seq, convert_to(id, 'UTF8'), convert_to(tenant_id, 'UTF8'), convert_to(type, 'UTF8'),
  convert_to(data::text, 'UTF8'),
  convert_to(CASE WHEN NOT isfinite(created_at) THEN created_at::text
    ELSE to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
    || CASE WHEN created_at < '0001-01-01T00:00:00Z' THEN ' BC' ELSE '' END END, 'UTF8'),
  about_destination, convert_to(traceparent, 'UTF8'), convert_to(ordering_key, 'UTF8')

-- relay_claim --
SELECT {_outbox_row} FROM herald_outbox ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED

-- relay_existing --
-- (tenant, id) of the batch's ids already stored: an id is unique per tenant only. One
-- probe of the key per id: id alone is no longer unique, so before the table's first
-- ANALYZE the planner takes each id to match 0.5 % of it, and 50 ids to need a scan
-- of the whole table (45 ms a batch at 30,000 events)
SELECT e.tenant_id, e.id FROM unnest($1::text[]) AS k(id)
CROSS JOIN LATERAL (SELECT tenant_id, id FROM herald_events WHERE id = k.id OFFSET 0) e

-- relay_reject --
INSERT INTO herald_outbox_rejected
  (seq, id, tenant_id, type, data, created_at, reason, rejected_at, source)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (source, seq) DO UPDATE
SET reason = EXCLUDED.reason, rejected_at = EXCLUDED.rejected_at

-- relay_delete --
-- The rows claimed: another relay may hold locked rows in between
DELETE FROM herald_outbox WHERE seq = ANY($1)

-- insert_events --
-- One statement for the batch: a row-by-row executemany costs a round of parse, bind
-- and execute messages per row
INSERT INTO herald_events (id, tenant_id, type, data, created_at, created_ts, ingested_at,
  traceparent, ordering_key)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[],
  $6::float8[], $7::float8[], $8::text[], $9::text[])

-- destination_statuses --
-- FOR SHARE: an activation or a delete waits for this transaction (and then sees its
-- deliveries), or went first and is what this reads
-- (and whether it is under flow control: its event deliveries go in the flow lane)
SELECT id, status, ordering,
  EXISTS (SELECT 1 FROM herald_flow f WHERE f.destination_id = herald_destinations.id)
FROM herald_destinations WHERE id = ANY($1) AND deleted_at IS NULL ORDER BY id FOR SHARE

-- insert_deliveries --
INSERT INTO herald_deliveries (id, tenant_id, event_id, event_type, destination_id, kind,
  max_attempts, next_attempt_at, held, created_at, lease_owner, ordering_key, order_seq, flow,
  status, attempt_count, updated_at)
SELECT *, 'pending', 0, t.created_at FROM unnest($1::text[], $2::text[], $3::text[],
  $4::text[], $5::text[], $6::text[], $7::int[], $8::float8[], $9::int[], $10::float8[],
  $11::text[], $12::text[], $13::int8[], $14::int[])
AS t(id, tenant_id, event_id, event_type, destination_id, kind, max_attempts,
  next_attempt_at, held, created_at, lease_owner, ordering_key, order_seq, flow)

-- outbox_stats --
-- '-infinity' is a timestamptz a producer can write: no epoch, no age
SELECT COUNT(*), EXTRACT(EPOCH FROM MIN(created_at) FILTER (WHERE isfinite(created_at)))::float8
FROM herald_outbox

-- flow_lock --
-- The flow rows (herald.flow) of these destinations, locked last: after the deliveries
-- a claim or a recording holds (lock order: destination, deliveries, flow)
SELECT {_flow_row}
FROM herald_flow WHERE destination_id = ANY($1::text[]) ORDER BY destination_id FOR UPDATE

-- breaker_lock --
-- The same, of the destinations whose breaker is on
SELECT {_flow_row}
FROM herald_flow WHERE destination_id = ANY($1::text[]) AND breaker = 1
ORDER BY destination_id FOR UPDATE

-- events_by_id --
-- Every tenant's event of each id: the caller picks its delivery's tenant's. One probe
-- of the key per id, as in relay_existing
SELECT e.id, e.tenant_id, e.type, e.created_at, e.created_ts, e.data, e.traceparent,
  e.ordering_key
FROM unnest($1::text[]) AS k(id)
CROSS JOIN LATERAL (SELECT id, tenant_id, type, created_at, created_ts, data, traceparent,
  ordering_key FROM herald_events WHERE id = k.id OFFSET 0) e

-- renew_leases --
-- A row another transaction holds is skipped, not waited for: the recorder finishing it
-- (its lease ends there) or a peer that took it over. Waiting held every other lease up
-- behind that transaction, and deadlocked with the recorder, which locks its batch in
-- the order the attempts ended. A row skipped is renewed next time, a third of a lease on
UPDATE herald_deliveries d SET next_attempt_at = $1
FROM (SELECT id FROM herald_deliveries
  WHERE id = ANY($3) AND lease_owner = $2 AND status = 'pending'
  FOR NO KEY UPDATE SKIP LOCKED) s
WHERE d.id = s.id

-- insert_attempts --
INSERT INTO herald_attempts (id, delivery_id, number, started_at, duration_ms, outcome,
  response_status, error, response_excerpt, exchange)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT (id) DO NOTHING

-- order_lock --
-- Taken first by a relay pass that may plan ordered deliveries, and by a re-queue of
-- ordered ones: one at a time (until commit), so that the relay's order (order_seq) is
-- the order it took the outbox rows in, even with several instances relaying
SELECT count(pg_advisory_xact_lock(7319))

-- keys_lock --
-- The (destination, key) pairs of $1 (a JSON array of [destination, key]) are this
-- transaction's to change: transaction advisory locks, in one order (no deadlock
-- between two takers), taken after the destination rows (the lock order: destination,
-- keys, deliveries). The relay deciding that a new delivery waits and the recorder
-- releasing the next of an ended head take it: neither misses the other's commit
SELECT count(pg_advisory_xact_lock(h)) FROM (SELECT DISTINCT
  hashtextextended(k ->> 0 || chr(31) || (k ->> 1), 7319) AS h
  FROM jsonb_array_elements($1::text::jsonb) k ORDER BY 1) s

-- keys_busy --
-- Which of the pairs have a pending delivery (herald_deliveries_keyed: a probe each).
-- $1 a JSON array of [destination, key]
SELECT k ->> 0, k ->> 1 FROM jsonb_array_elements($1::text::jsonb) k
WHERE EXISTS (SELECT 1 FROM herald_deliveries d
  WHERE d.status = 'pending' AND d.ordering_key IS NOT NULL
    AND d.destination_id = k ->> 0 AND d.ordering_key = k ->> 1)

-- release_next --
-- A delivery of ordered key ended: the next of its key (the lowest order_seq pending)
-- becomes claimable now, unless its destination is not active (then held as any).
-- $1 the ended delivery, $2 now
UPDATE herald_deliveries d SET next_attempt_at = $2,
  held = CASE WHEN t.status = 'active' THEN 0 ELSE 1 END
FROM herald_destinations t
WHERE t.id = d.destination_id AND d.held = 2 AND d.id = (SELECT n.id FROM herald_deliveries f
  JOIN herald_deliveries n
    ON n.destination_id = f.destination_id AND n.ordering_key = f.ordering_key
  WHERE f.id = $1 AND f.ordering_key IS NOT NULL AND f.status <> 'pending'
    AND n.status = 'pending' AND n.ordering_key IS NOT NULL
  ORDER BY n.order_seq LIMIT 1)

-- activate_destination --
-- Only the current verification counts: it succeeded, and no later ping was sent
-- (ids are time-ordered), so an attempt in flight when the target changed cannot verify
UPDATE herald_destinations SET status = 'active',
  updated_at = GREATEST($1, updated_at + 0.000001), verification_failed_at = NULL,
  verification_error = NULL
WHERE id = $2 AND status = 'pending_verification' AND deleted_at IS NULL
  AND EXISTS (SELECT 1 FROM herald_deliveries WHERE id = $3 AND status = 'success'
    AND kind = 'verification')
  AND NOT EXISTS (SELECT 1 FROM herald_deliveries WHERE destination_id = $2
    AND kind = 'verification' AND id > $3)

-- insert_signal --
-- An operational event, into the outbox like a producer's: the relay fans it out. Its
-- id is derived from its cause, so a repeated recording writes it once
INSERT INTO herald_outbox (id, tenant_id, type, data, created_at, about_destination)
SELECT $1, $2, $3, $4::text::jsonb, $5::text::timestamptz, $6
WHERE NOT EXISTS (SELECT 1 FROM herald_events WHERE id = $1 AND tenant_id = $2)
ON CONFLICT (id, tenant_id) DO NOTHING

-- finished_failed --
-- Of the deliveries given, those that ended as failure, with their last attempt and
-- their destination's type: the recording that did it is the one whose attempt it is
SELECT d.id, d.last_attempt_id, t.type FROM herald_deliveries d
JOIN herald_destinations t ON t.id = d.destination_id
WHERE d.id = ANY($1) AND d.status = 'failure'

-- event_deliveries --
-- One event's deliveries, newest first: $1 tenant, $2 event id, $3 limit. Found by the
-- event id's index (a few rows, of every tenant that used the id), then its tenant's
-- kept: a limit applied before the tenant would let another tenant's reuse of the id
-- crowd this tenant's deliveries out.
SELECT {_delivery_listing}
FROM herald_deliveries d LEFT JOIN herald_attempts a ON a.id = d.last_attempt_id
WHERE d.event_id = $2 AND d.tenant_id = $1 ORDER BY d.id DESC LIMIT $3

-- requeue --
-- A pending one keeps its place in its key (herald.ordering); a finished one leaves
-- its key, which requeue_ordered gives it again, at the end. Finished deliveries get $1 more attempts; deleted destinations and pings are left alone.
-- Each goes in its destination's lane (herald.flow: it may have come under flow control
-- since it finished).
-- $3: the replay re-queuing them takes them over (NULL: a retry, which keeps theirs)
UPDATE herald_deliveries d SET
  max_attempts = CASE WHEN d.status = 'pending' THEN d.max_attempts
    ELSE d.attempt_count + $1 END,
  status = 'pending', next_attempt_at = $2, lease_owner = NULL, updated_at = $2,
  held = CASE WHEN d.status = 'pending' AND d.held = 2 THEN 2
    WHEN t.status = 'active' THEN 0 ELSE 1 END,
  replay_id = COALESCE($3::text, d.replay_id),
  ordering_key = CASE WHEN d.status = 'pending' THEN d.ordering_key END,
  flow = CASE WHEN EXISTS (SELECT 1 FROM herald_flow f WHERE f.destination_id = d.destination_id)
    THEN 1 ELSE 0 END
FROM herald_destinations t
WHERE t.id = d.destination_id AND t.deleted_at IS NULL
  AND d.id = ANY($4) AND d.kind = 'event' AND d.lease_owner IS NULL

-- count_request --
INSERT INTO herald_rate_limits (tenant_id, window_no, count) VALUES ($1, $2, 1)
ON CONFLICT (tenant_id, window_no)
DO UPDATE SET count = herald_rate_limits.count + 1 RETURNING count

-- purge_select --
SELECT id FROM herald_deliveries WHERE status <> 'pending' AND updated_at < $1
ORDER BY updated_at LIMIT $2 FOR UPDATE SKIP LOCKED

-- purge_deliveries --
DELETE FROM herald_deliveries WHERE id = ANY($1) RETURNING event_id, tenant_id

-- revoke_api_keys --
UPDATE herald_api_keys SET revoked_at = $1
WHERE tenant_id = $2 AND left(hash, $3) = $4 AND revoked_at IS NULL
  AND kind = $5

-- reencrypt_select --
-- FOR UPDATE: a concurrent update of one of these rows waits for this batch
SELECT id, secrets FROM herald_destinations WHERE id > $1 ORDER BY id LIMIT $2 FOR UPDATE

-- open_token --
-- One statement: the checks and the extension ($2 now + $3 idle, never past created_at
-- + $4, never shorter than it was) are one atomic step
UPDATE herald_session_tokens SET last_used_at = $2,
  expires_at = GREATEST(expires_at, LEAST($2::float8 + $3::float8, created_at + $4::float8))
WHERE token_hash = $1 AND traded_at IS NULL AND revoked_at IS NULL AND expires_at > $2::float8
  AND EXISTS (SELECT 1 FROM herald_api_keys k WHERE k.hash = key_hash AND k.revoked_at IS NULL)
RETURNING id, tenant_id, created_at, expires_at

-- trade_token --
-- The tk_ value is spent: from now on only the session secret ($5) opens the token
UPDATE herald_session_tokens SET last_used_at = $2, traded_at = $2, session_hash = $5,
  expires_at = GREATEST(expires_at, LEAST($2::float8 + $3::float8, created_at + $4::float8))
WHERE token_hash = $1 AND traded_at IS NULL AND revoked_at IS NULL AND expires_at > $2::float8
  AND EXISTS (SELECT 1 FROM herald_api_keys k WHERE k.hash = key_hash AND k.revoked_at IS NULL)
RETURNING id, tenant_id, created_at, expires_at

-- open_session --
UPDATE herald_session_tokens SET last_used_at = $2,
  expires_at = GREATEST(expires_at, LEAST($2::float8 + $3::float8, created_at + $4::float8))
WHERE session_hash = $1 AND revoked_at IS NULL AND expires_at > $2::float8
  AND EXISTS (SELECT 1 FROM herald_api_keys k WHERE k.hash = key_hash AND k.revoked_at IS NULL)
RETURNING id, tenant_id, created_at, expires_at

-- count_last --
-- When a destination last answered well ($2) and badly ($3), the later of the stored
-- and the given (a NULL leaves it); rows come in destination order (the lock order)
INSERT INTO herald_destination_stats (destination_id, last_success_at, last_failure_at)
VALUES ($1, $2, $3)
ON CONFLICT (destination_id) DO UPDATE SET
  last_success_at = GREATEST(herald_destination_stats.last_success_at, excluded.last_success_at),
  last_failure_at = GREATEST(herald_destination_stats.last_failure_at, excluded.last_failure_at)

-- count_replay --
-- Replays by who asked ($1), for every instance's metrics: replays:$1 and replayed:$1
INSERT INTO herald_meta (key, value)
VALUES ('replays:' || $1::text, 1), ('replayed:' || $1::text, $2::bigint)
ON CONFLICT (key) DO UPDATE SET value = herald_meta.value + excluded.value

-- console_outcomes --
-- Finished deliveries by outcome and time bucket since $1, $2 seconds a bucket,
-- read from herald_deliveries_outcomes alone
SELECT status, floor(updated_at / $2)::bigint, COUNT(*) FROM herald_deliveries
WHERE status <> 'pending' AND updated_at >= $1 GROUP BY 1, 2

-- console_failing --
-- The destinations with the most failed deliveries since $1, from herald_deliveries_outcomes
-- (its predicate is written out: SQLite does not infer it from status = 'failure')
SELECT destination_id, COUNT(*) FROM herald_deliveries
WHERE status <> 'pending' AND status = 'failure' AND updated_at >= $1
GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT $2

-- tenant_outcomes --
-- console_outcomes for one tenant ($3), the portal's overview: its destinations'
-- deliveries, still from herald_deliveries_outcomes (which holds destination_id)
SELECT status, floor(updated_at / $2)::bigint, COUNT(*) FROM herald_deliveries
WHERE status <> 'pending' AND updated_at >= $1 AND destination_id IN (SELECT id FROM herald_destinations WHERE tenant_id = $3)
GROUP BY 1, 2

-- tenant_failing --
-- console_failing for one tenant ($3)
SELECT destination_id, COUNT(*) FROM herald_deliveries
WHERE status <> 'pending' AND status = 'failure' AND updated_at >= $1 AND destination_id IN (SELECT id FROM herald_destinations WHERE tenant_id = $3)
GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT $2

-- tenant_in_flight --
-- console_in_flight for one tenant ($1): the leased rows are few, so from their index
SELECT COUNT(*) FROM herald_deliveries WHERE lease_owner IS NOT NULL AND tenant_id = $1

-- tenant_delivery_counts --
-- delivery_counts for one tenant ($2), on the pending index. Its destinations are an
-- array (an InitPlan): a join's plan hangs on herald_destinations' statistics (240 ms
-- at 1,000,000 deliveries before the table's first ANALYZE, 25 ms after)
SELECT (SELECT COUNT(*) FROM herald_deliveries
    WHERE status = 'pending' AND held = 0 AND flow IN (0, 1) AND next_attempt_at <= $1
      AND destination_id = ANY(ARRAY(SELECT id FROM herald_destinations WHERE tenant_id = $2))),
  (SELECT COUNT(*) FROM herald_deliveries
    WHERE status = 'pending' AND held = 0 AND flow IN (0, 1) AND next_attempt_at > $1
      AND destination_id = ANY(ARRAY(SELECT id FROM herald_destinations WHERE tenant_id = $2))),
  (SELECT COUNT(*) FROM herald_deliveries WHERE status = 'pending' AND held >= 1
      AND destination_id = ANY(ARRAY(SELECT id FROM herald_destinations WHERE tenant_id = $2)))

-- tenant_next_due_at --
-- next_due_at for one tenant ($1): the pending index in due order, to the first row of
-- one of its destinations (an array, as above)
SELECT MIN(due) FROM (
  SELECT MIN(next_attempt_at) AS due FROM herald_deliveries
  WHERE status = 'pending' AND held = 0 AND flow = 0
    AND destination_id = ANY(ARRAY(SELECT id FROM herald_destinations WHERE tenant_id = $1))
  UNION ALL
  SELECT MIN(next_attempt_at) FROM herald_deliveries
  WHERE status = 'pending' AND held = 0 AND flow = 1
    AND destination_id = ANY(ARRAY(SELECT id FROM herald_destinations WHERE tenant_id = $1))
) lanes

-- last_failed_attempt --
-- The last attempt of destination $1's newest delivery that failed it: a walk of
-- herald_deliveries_destination from the newest, one primary-key probe of
-- herald_attempts a delivery
SELECT a.started_at, a.response_status, a.error
FROM herald_deliveries d JOIN herald_attempts a ON a.id = d.last_attempt_id
WHERE d.destination_id = $1 AND a.outcome <> 'success'
ORDER BY d.id DESC LIMIT 1

-- list_events --
-- Events newest first, walking herald_events_ingested backwards: $1 one tenant's or NULL,
-- $2 one type or NULL, stored within [$3, $4]; with a cursor ($5 its id, $6 its tenant,
-- $4 its ingested_at), only those after it in this order; $7 the limit
SELECT id, tenant_id, type, created_at, ingested_at FROM herald_events
WHERE ingested_at >= $3 AND ingested_at <= $4 AND ($1::text IS NULL OR tenant_id = $1)
  AND ($2::text IS NULL OR type = $2)
  AND ($5::text IS NULL OR ingested_at < $4 OR id < $5 OR (id = $5 AND tenant_id < $6))
ORDER BY ingested_at DESC, id DESC, tenant_id DESC LIMIT $7

-- source_existing --
-- An outbox source's batch: the events already stored under its ids, with what they
-- hold, so that a row relayed before a crash (its source delete lost) is known again
SELECT e.tenant_id, e.id, e.type, e.data FROM unnest($1::text[]) AS k(id)
CROSS JOIN LATERAL (SELECT tenant_id, id, type, data FROM herald_events WHERE id = k.id OFFSET 0) e

-- source_lease --
-- Take or renew the lease on one outbox source ($1) for $2 until $3: it is this
-- instance's already, or its holder's ran out before $4. A row back: the lease is ours
INSERT INTO herald_source_leases (source, owner, lease_until) VALUES ($1, $2, $3)
ON CONFLICT (source) DO UPDATE SET owner = EXCLUDED.owner, lease_until = EXCLUDED.lease_until
WHERE herald_source_leases.owner = EXCLUDED.owner OR herald_source_leases.lease_until < $4
RETURNING owner

-- put_event_type --
INSERT INTO herald_event_types (tenant_id, type, description, schema, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $5)
ON CONFLICT (tenant_id, type) DO UPDATE SET description = excluded.description,
  schema = excluded.schema,
  updated_at = GREATEST(excluded.updated_at, herald_event_types.updated_at + 0.000001)

-- ---- Only PostgreSQL has these ----

-- migration_lock --
-- One migrator at a time when several instances start together
SELECT pg_advisory_xact_lock(7236520173)

-- event_exists --
-- insert_outbox's NOT EXISTS read the snapshot before a relay's concurrent commit
SELECT 1 FROM herald_events WHERE id = $1 AND tenant_id = $2

-- claim --
-- The common lane (flow = 0). The subquery's next_attempt_at is the old one: when each
-- was due. $4 and $6: the destinations and the tenants skipped (saturated); {since}:
-- the due_since bound ($7), when given. Then whether the destination is under flow
-- control (it came under it since: herald.flow admits it), and the delivery's
-- ordering key (of an ordered destination's: herald.ordering; only a key's head has
-- held = 0, so the claim never reads a delivery waiting behind it)
UPDATE herald_deliveries d SET lease_owner = $1, next_attempt_at = $2
FROM (SELECT id, next_attempt_at FROM herald_deliveries
  WHERE status = 'pending' AND held = 0 AND flow = 0 AND next_attempt_at <= $3{since}
  AND NOT (destination_id = ANY($4::text[])) AND NOT (tenant_id = ANY($6::text[]))
  ORDER BY next_attempt_at LIMIT $5 FOR UPDATE SKIP LOCKED) s
WHERE d.id = s.id
RETURNING d.id, d.destination_id, d.kind, d.attempt_count, d.max_attempts, d.tenant_id,
  d.event_id, s.next_attempt_at,
  EXISTS (SELECT 1 FROM herald_flow f WHERE f.destination_id = d.destination_id),
  d.ordering_key

-- claim_flow --
-- The flow lanes: of each destination in $3, its oldest due (by $4) as many as its
-- gate lets ($5, the same order), none of the tenants skipped ($6)
UPDATE herald_deliveries d SET lease_owner = $1, next_attempt_at = $2
FROM (SELECT x.id, x.next_attempt_at FROM unnest($3::text[], $5::int[]) AS w(dest, n)
  CROSS JOIN LATERAL (SELECT id, next_attempt_at FROM herald_deliveries
    WHERE status = 'pending' AND held = 0 AND flow = 1 AND destination_id = w.dest
    AND next_attempt_at <= $4 AND NOT (tenant_id = ANY($6::text[]))
    ORDER BY next_attempt_at LIMIT w.n FOR UPDATE SKIP LOCKED) x) s
WHERE d.id = s.id
RETURNING d.id, d.destination_id, d.kind, d.attempt_count, d.max_attempts, d.tenant_id,
  d.event_id, s.next_attempt_at, TRUE, d.ordering_key

-- lock_for_record --
-- The destinations whose signal state recording may change, with that state, locked in
-- id order before any delivery (lock order: destination, then its deliveries): of the
-- batch's ($1), those with a failure or an activation ($2) or not clean now. A batch of
-- successes to healthy destinations locks nothing
SELECT id, type, consecutive_failures, failing_since FROM herald_destinations
WHERE id = ANY($1::text[]) AND deleted_at IS NULL
  AND (id = ANY($2::text[]) OR consecutive_failures > 0 OR failing_since IS NOT NULL)
ORDER BY id FOR NO KEY UPDATE

-- heartbeat --
-- xmax is set when the row was updated, not inserted
INSERT INTO herald_instances AS i VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (id) DO UPDATE SET heartbeat_at = EXCLUDED.heartbeat_at
RETURNING (xmax <> 0)

-- reap_delete --
-- Peers reaping at the same time wait on these row locks; one of them wins
DELETE FROM herald_instances WHERE heartbeat_at < $1 RETURNING id

-- reap_release --
WITH leased AS (SELECT id, lease_owner FROM herald_deliveries
  WHERE status = 'pending' AND lease_owner = ANY($2::text[]) FOR UPDATE)
UPDATE herald_deliveries d SET next_attempt_at = $1, lease_owner = NULL
FROM leased WHERE d.id = leased.id RETURNING leased.lease_owner

-- purge_events_of --
-- The events of the deliveries just deleted, unless another still uses them: index
-- probes. (A NOT EXISTS over all old events was planned as a hash anti-join of both
-- whole tables: 1.3 s a batch at 1 M rows.) $1, $3: their ids and tenants, the key.
DELETE FROM herald_events e USING unnest($1::text[], $3::text[]) AS k(id, tenant_id)
WHERE e.id = k.id AND e.tenant_id = k.tenant_id AND e.ingested_at < $2
  AND NOT EXISTS (SELECT 1 FROM herald_deliveries d
    WHERE d.event_id = e.id AND d.tenant_id = e.tenant_id)

-- jit_off --
-- The row estimate of purge_unused_events is poor, and JIT only costs
SET LOCAL jit = off

-- purge_unused_events --
-- Events that never had a delivery (no subscriber), oldest first, each probed on its own;
-- by the whole key: another tenant's event of the same id may still have deliveries
DELETE FROM herald_events WHERE (id, tenant_id) IN (SELECT e.id, e.tenant_id
  FROM herald_events e WHERE e.ingested_at < $1 AND (SELECT 1 FROM herald_deliveries d
    WHERE d.event_id = e.id AND d.tenant_id = e.tenant_id LIMIT 1) IS NULL
  ORDER BY e.ingested_at LIMIT $2)
