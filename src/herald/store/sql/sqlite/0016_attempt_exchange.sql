-- What an HTTP attempt sent and what came back (issue 30): the method, the URL, the
-- request's headers (credentials masked) and the response's headers, as one JSON text
-- of a few KiB at most (herald.adapters.base bounds it before it is noted). The body
-- is not kept: it is the stored event's envelope, byte for byte. NULL for the types
-- that send no HTTP request and for every attempt recorded before this migration.
-- Retention purges it with its attempt.
ALTER TABLE herald_attempts ADD COLUMN exchange TEXT;
