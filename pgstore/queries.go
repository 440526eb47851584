package pgstore

import (
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/receiptstore/receipts/internal/mutate"
)

// formatVersion is the schema format this code reads and writes (meta.format).
// Format 2 adds tombstones (the markers family, meta.tombstone_window_us) and the reserved
// records.meta column; Open migrates format 1 (migrate1). Format 3 changes no table: record
// writes no longer write markers, GC writes them before it drops a records partition
// (copyMarkers), so a format-2 binary, whose GC drops partitions without them, must not
// open it; Open migrates format 2 by setting the number (its markers stay in force). Format 4
// adds the records' journal column (steps.go): a format-3 binary would neither read it nor
// keep a claim with steps on Release, so it must not open it; Open migrates formats 1 to 3 by
// adding the column and setting the number.
const formatVersion = 4

// queries holds the engine's SQL with the schema name filled in.
type queries struct {
	schema   string // quoted
	channel  string // NOTIFY channel (unquoted value)
	injected bool   // the clock parameter is the injected time (else the floor of the database's)
	tombs    bool   // tombstones are on: claims check markers and expired records

	lock, claim, lookup, renew, finish, abandon, del, fence, scan string
	byNonce                                                       string // a claim whose reply was lost, by its nonce (detach.go)
	freshFn, freshFnDDL                                           string // a first claim in one statement: the call, and the function it calls (freshFnSQL)
	freshManyFn, freshManyFnDDL                                   string // the same for a batch of first claims (freshManyFnSQL)
	finishMust                                                    string // DoTx's: fails if it matches no row
	finishIn                                                      string // template of Finish in one partition (finishInSQL)
	finishManyIn                                                  string // the same for a batch of finishes (finishInSQL)
	tombstone, scanTombstones                                     string // tombs only
	copyMarkers                                                   string // GC's, template (copyMarkersSQL)
	journal, journalOf                                            string // a claim's step journal (steps.go)
}

// clock is the SQL of a statement's time, from its clock parameter p (engine.nowArg): the
// injected time itself, or the database's clock_timestamp() but never earlier than p, the
// engine's high-water mark (NULL: none yet), so that the engine's time never runs backwards
// even when the database's clock steps back.
func (q queries) clock(p string) string {
	if q.injected {
		return p + `::timestamptz`
	}
	return `greatest(clock_timestamp(), ` + p + `::timestamptz)`
}

// param is the array parameter p of type typ (say "bytea[]") as a statement over arrays of
// keys reads it: through a sub-select, so that the planner cannot see how many elements it
// has. Seen, as in a custom plan, where p is a constant, a batch of a few keys is costed
// below the generic plan (which assumes 10), and PostgreSQL then plans the statement anew
// on every execution (plan_cache_mode auto keeps a generic plan only if it is no dearer
// than the custom ones were on average); the plan is the same nested loop of index probes
// either way. Hidden, both cost the same, and after its first five executions the
// statement runs on its generic plan, without planning. Measured on replays at 8 callers,
// batched 2 to 4 keys at a time: bench/README.md, "PostgreSQL batches planned once".
func param(p, typ string) string { return "(SELECT " + p + "::" + typ + ")" }

// The clock of a statement: one value for the whole statement (clock_timestamp() advances
// within a statement; see clock), and its epoch.
func (q queries) clockCTE(nowParam, widthParam string) string {
	return `t AS MATERIALIZED (
  SELECT n AS now, floor(extract(epoch FROM n) * 1000000 / ` + widthParam + `::bigint)::bigint AS ep
    FROM (SELECT ` + q.clock(nowParam) + ` AS n) s
)`
}

// Record columns, in the order scanRecord reads them.
// meta holds the trace context stored with a finished record (driver.Record.Trace), or NULL.
const recCols = `r.state, r.fp, r.token, r.attempts, r.created_at, r.updated_at, r.lease_expires_at, r.result, r.meta`

// buildQueries fills in the schema; injected: the engine runs on an injected clock
// (engineOptions.Now), whose time is the statements' clock parameter; tombs: tombstones are
// on (the claim statements then take two more parameters, $10 the oldest epoch whose markers
// can be in force and $11 Retention + TombstoneWindow in µs, and Release/Forget's delete $8
// that epoch); markerK records epochs make one markers partition.
func buildQueries(schema string, injected, tombs bool, markerK int64) queries {
	s := pgx.Identifier{schema}.Sanitize()
	q := queries{schema: s, channel: schema + "_receipts", injected: injected, tombs: tombs}
	x := func(sql string) string { return strings.ReplaceAll(sql, "S.", s+".") }
	us := ` * interval '1 microsecond'`

	// The key's advisory lock: it serializes claims of this key. The primary key (scope, id,
	// epoch) cannot make a key unique across partitions, so two fresh claims on either side of
	// an epoch boundary would both insert without it. The first claim's function takes it
	// (freshFnSQL) and reads the key on a snapshot taken after it; FinishWith's commit and the
	// read-back after a lost COMMIT reply take it on their own (tx.go).
	q.lock = `SELECT pg_advisory_xact_lock($1::int4, $2::int4)`

	// recBottom is the oldest records epoch whose records can be tombstones, from $10 (the
	// oldest markers partition in force): the first records epoch of that markers partition.
	// Records partitions below the live ones ($8) exist only until GC drops them, so the
	// probes below it find at most the partitions GC has yet to drop.
	recBottom := `($10::bigint * ` + strconv.FormatInt(markerK, 10) + `)`
	// Tombstones in the claim statement (tombs only): tomb is the key's tombstone in force, the
	// time of its newest write (its newest marker, or an expired record still in a partition
	// GC has not dropped: records are their own tombstones until GC drops their partition and
	// writes their markers), evaluated only when the key has no visible record (a one-time
	// filter); a tombstoned key is neither taken over nor claimed afresh, and answers
	// 'expired'. No claim writes a marker.
	tombCTE, notTomb, tombRow := "", "", ""
	if tombs {
		tombCTE = `tomb AS MATERIALIZED (
  SELECT s.u AS used_at FROM t, (SELECT greatest(
      (SELECT max(m.used_at) FROM S.markers m WHERE m.scope = $1 AND m.id = $2 AND m.epoch >= $10::bigint),
      (SELECT max(o.updated_at) FROM S.records o WHERE o.scope = $1 AND o.id = $2
          AND o.epoch >= ` + recBottom + ` AND o.epoch < $8),
      (SELECT c.updated_at FROM cur c)) AS u) s
   WHERE NOT EXISTS (SELECT 1 FROM cur c WHERE c.updated_at + $6::bigint` + us + ` > t.now)
     AND s.u + $11::bigint` + us + ` > t.now
),
`
		notTomb = `
     AND NOT EXISTS (SELECT 1 FROM tomb)`
		tombRow = `
UNION ALL
SELECT 'expired', 0::bigint, 0, 0::smallint, NULL::bytea, NULL::bytea, b.used_at, b.used_at, NULL::timestamptz, t.now, NULL::bytea
  FROM tomb b, t`
	}

	// Statement 2: one decision on one snapshot. $1 scope, $2 id, $3 fp, $4 nonce, $5 lease µs,
	// $6 retention µs, $7 epoch width µs, $8 oldest live epoch, $9 now (NULL: database clock).
	q.claim = x(`WITH ` + q.clockCTE("$9", "$7") + `,
cur AS MATERIALIZED (           -- the key's newest record (ordered Append: stops at the first hit)
  SELECT r.* FROM S.records r
   WHERE r.scope = $1 AND r.id = $2 AND r.epoch >= $8
   ORDER BY r.epoch DESC LIMIT 1
),
` + tombCTE + `lk AS (                         -- takeable: past retention (logically absent) or a run-out lease;
                                -- conditions on r are re-checked on the newest row version;
                                -- a row a writer holds is skipped (reported busy, retried)
  SELECT r.epoch, (r.updated_at + $6::bigint` + us + ` <= t.now) AS reset
    FROM S.records r, cur, t
   WHERE r.scope = $1 AND r.id = $2 AND r.epoch = cur.epoch
     AND (r.updated_at + $6::bigint` + us + ` <= t.now
          OR (r.state = 1 AND r.fp = $3 AND r.lease_expires_at <= t.now))` + notTomb + `
   FOR UPDATE OF r SKIP LOCKED
),
takeover AS (                   -- new token; a reset (expired record) starts afresh at attempt 1
  UPDATE S.records r
     SET token = nextval('S.token_seq'),
         attempts = CASE WHEN lk.reset THEN 1 ELSE r.attempts + 1 END,
         created_at = CASE WHEN lk.reset THEN t.now ELSE r.created_at END,
         state = 1, fp = $3, result = NULL, meta = NULL, nonce = $4, epoch = t.ep, updated_at = t.now,
         lease_expires_at = t.now + $5::bigint` + us + `
    FROM lk, t
   WHERE r.scope = $1 AND r.id = $2 AND r.epoch = lk.epoch
     AND (lk.reset OR (r.state = 1 AND r.fp = $3 AND r.lease_expires_at <= t.now))
  RETURNING r.token, r.attempts, r.created_at, r.updated_at, r.lease_expires_at, r.epoch
),
fresh AS (                      -- absent key; DO NOTHING takes no lock (a conflict: no row, re-send)
  INSERT INTO S.records (scope, id, epoch, state, fp, token, attempts, nonce,
                         created_at, updated_at, lease_expires_at)
  SELECT $1, $2, t.ep, 1, $3, nextval('S.token_seq'), 1, $4, t.now, t.now, t.now + $5::bigint` + us + `
    FROM t WHERE NOT EXISTS (SELECT 1 FROM cur)` + notTomb + `
  ON CONFLICT DO NOTHING
  RETURNING token, attempts, created_at, updated_at, lease_expires_at, epoch
)
SELECT 'claimed'::text, f.token, f.attempts, 1::smallint, $3::bytea, NULL::bytea,
       f.created_at, f.updated_at, f.lease_expires_at, t.now, NULL::bytea
  FROM fresh f, t
UNION ALL
SELECT CASE WHEN k.attempts = 1 THEN 'claimed' ELSE 'took_over' END, k.token, k.attempts, 1::smallint,
       $3::bytea, NULL::bytea, k.created_at, k.updated_at, k.lease_expires_at, t.now, NULL::bytea
  FROM takeover k, t
UNION ALL
SELECT CASE WHEN c.updated_at + $6::bigint` + us + ` <= t.now THEN 'busy'
            WHEN c.fp <> $3 THEN 'mismatch'
            WHEN c.state <> 1 THEN 'done'
            WHEN c.nonce = $4 THEN 'own'
            WHEN c.lease_expires_at <= t.now THEN 'busy'
            ELSE 'in_progress' END,
       c.token, c.attempts, c.state, c.fp, c.result, c.created_at, c.updated_at, c.lease_expires_at, t.now, c.meta
  FROM cur c, t
 WHERE NOT EXISTS (SELECT 1 FROM takeover)` + notTomb + tombRow)

	q.freshFn, q.freshFnDDL = freshFnSQL(s, "claim_fresh_v1")
	q.freshManyFn, q.freshManyFnDDL = freshManyFnSQL(s, "claim_fresh_many_v1")

	// Lookup / replay / waiter poll: a plain MVCC read, newest partition first.
	// $1 scope, $2 id, $3 oldest, $4 now.
	q.lookup = x(`SELECT ` + recCols + `, t.now, r.journal
  FROM (SELECT ` + q.clock("$4") + ` AS now) t
  LEFT JOIN LATERAL (SELECT * FROM S.records
                      WHERE scope = $1 AND id = $2 AND epoch >= $3
                      ORDER BY epoch DESC LIMIT 1) r ON true`)

	// A claim whose reply was lost (resolveLost): the key's Pending record with the claim's
	// nonce, if it landed. $1 scope, $2 id, $3 oldest, $4 nonce.
	q.byNonce = x(`SELECT token, attempts FROM S.records
 WHERE scope = $1 AND id = $2 AND epoch >= $3 AND state = 1 AND nonce = $4
 ORDER BY epoch DESC LIMIT 1`)

	// Fenced writes: the record must be Pending with the holder's token and visible.
	// $1 scope, $2 id, $3 token, $4 oldest, $5 retention µs, $6 width µs, $7 now.
	fenced := `r.scope = $1 AND r.id = $2 AND r.epoch >= $4 AND r.token = $3 AND r.state = 1
   AND r.updated_at + $5::bigint` + us + ` > t.now`
	ret := ` RETURNING ` + recCols + `, t.now, pg_current_xact_id()::text`
	// upd is a fenced UPDATE that returns the record (no marker: GC writes them, copyMarkers).
	upd := func(set string) string {
		return `WITH ` + q.clockCTE("$7", "$6") + `
UPDATE S.records r
   SET ` + set + `
  FROM t
 WHERE ` + fenced + ret
	}
	// mustUpd is upd that fails (division_by_zero, errNoRowFenced) instead of returning no
	// row: DoTx sends it with COMMIT in one batch, and a statement that fails makes the
	// server skip the rest of the batch, so a commit whose fence did not hold commits nothing.
	mustUpd := func(set string) string {
		chk := ` FROM (SELECT 1 AS one WHERE 1 / (SELECT count(*) FROM u)::int = 1) chk LEFT JOIN u ON true`
		return `WITH ` + q.clockCTE("$7", "$6") + `,
u AS (
UPDATE S.records r
   SET ` + set + `
  FROM t
 WHERE ` + fenced + ret + ` AS xid
)
SELECT state, fp, token, attempts, created_at, updated_at, lease_expires_at, result, meta, now, xid` + chk
	}

	// Renew: $8 ttl µs. The lease never shrinks.
	q.renew = x(upd(`lease_expires_at = greatest(r.lease_expires_at, t.now + $8::bigint` + us + `),
       updated_at = t.now, epoch = t.ep`))

	// Finish: $8 state, $9 result, $10 the trace context (NULL: none).
	finishSet := `state = $8::smallint, result = $9::bytea, meta = $10::bytea, lease_expires_at = NULL, updated_at = t.now, epoch = t.ep`
	q.finish = x(upd(finishSet))
	q.finishMust = x(mustUpd(finishSet))

	// Finish aimed at the one records partition where the lease's record was last written
	// (finishInSQL fills in @records@ and @ep@ its epoch): the record must still be there and stay
	// there (t.ep = @ep@), else no row, and Finish sends q.finish. Writing to the partition
	// itself skips the parent's ModifyTable and Append set-up over every live partition.
	q.finishIn = x(`WITH ` + q.clockCTE("$7", "$6") + `
UPDATE S.@records@ r
   SET ` + finishSet + `
  FROM t
 WHERE ` + fenced + ` AND t.ep = @ep@` + ret)

	// Finish of several leases at once (finish.go), aimed at one records partition as
	// finishIn is: $1 scopes, $2 ids, $3 tokens, $8 states, $9 results, $10 trace contexts
	// (arrays, one element per key; the keys are distinct), $4..$7 as finishIn's. Each
	// lease's row is fenced as finishIn fences it, and gets finishIn's writes (the same
	// SET). Columns: finishIn's, then the key's
	// position in the arrays (1-based); a key with no row back was not written.
	manyFK := `k AS MATERIALIZED (
  SELECT * FROM unnest(` + param("$1", "bytea[]") + `, ` + param("$2", "bytea[]") + `, ` + param("$3", "bigint[]") + `, ` + param("$8", "smallint[]") + `, ` + param("$9", "bytea[]") + `, ` + param("$10", "bytea[]") + `)
                WITH ORDINALITY AS k(scope, id, token, state, result, meta, i)
)`
	manyFenced := `r.scope = k.scope AND r.id = k.id AND r.epoch >= $4 AND r.token = k.token AND r.state = 1
   AND r.updated_at + $5::bigint` + us + ` > t.now AND t.ep = @ep@`
	manyFSet := `state = k.state, result = k.result, meta = k.meta, lease_expires_at = NULL, updated_at = t.now, epoch = t.ep`
	q.finishManyIn = x(`WITH ` + q.clockCTE("$7", "$6") + `,
` + manyFK + `
UPDATE S.@records@ r
   SET ` + manyFSet + `
  FROM k, t
 WHERE ` + manyFenced + `
 RETURNING ` + recCols + `, t.now, pg_current_xact_id()::text, k.i`)

	// A claim's step journal (steps.go): $8 the journal, the lease as it is.
	q.journal = x(upd(`journal = $8::bytea, updated_at = t.now, epoch = t.ep`))
	// The journal of the record a takeover holds: $1 scope, $2 id, $3 oldest, $4 token.
	q.journalOf = x(`SELECT journal FROM S.records
 WHERE scope = $1 AND id = $2 AND epoch >= $3 AND token = $4
 ORDER BY epoch DESC LIMIT 1`)

	// Abandon (and Release of a recovered lease): the lease ends now, the claim stays.
	q.abandon = x(upd(`lease_expires_at = t.now, updated_at = t.now, epoch = t.ep`))

	// Release (never taken over) and Forget: the record goes, and with tombstones on its
	// markers too ($8: the oldest epoch whose markers can be in force): no effect to protect.
	q.del = x(`WITH ` + q.clockCTE("$7", "$6") + `
DELETE FROM S.records r USING t
 WHERE ` + fenced + ` RETURNING t.now`)
	if tombs {
		q.del = x(`WITH ` + q.clockCTE("$7", "$6") + `,
d AS (
DELETE FROM S.records r USING t
 WHERE ` + fenced + ` RETURNING t.now
),
dm AS (
  DELETE FROM S.markers m WHERE m.scope = $1 AND m.id = $2 AND m.epoch >= $8::bigint AND EXISTS (SELECT 1 FROM d)
)
SELECT now FROM d`)
		// A key's tombstone: the time of its newest write (marker or record), if that is past
		// retention and within the window. $1 scope, $2 id, $3 markers' oldest epoch, $4
		// records' oldest epoch that can hold a tombstone (engine.recordBottom), $5 now, $6 Retention + TombstoneWindow µs, $7 Retention µs.
		q.tombstone = x(`WITH t AS MATERIALIZED (SELECT ` + q.clock("$5") + ` AS now)
SELECT s.u, t.now FROM t, (SELECT greatest(
    (SELECT max(m.used_at) FROM S.markers m WHERE m.scope = $1 AND m.id = $2 AND m.epoch >= $3),
    (SELECT r.updated_at FROM S.records r WHERE r.scope = $1 AND r.id = $2 AND r.epoch >= $4
      ORDER BY r.epoch DESC LIMIT 1)) AS u) s
 WHERE s.u + $6::bigint` + us + ` > t.now AND s.u + $7::bigint` + us + ` <= t.now`)
		// Tombstones page, oldest epoch first, keyset-paginated on (epoch, scope, id): a
		// marker in force that is its key's newest, with no newer record (a visible one is
		// always newer). $1 markers' oldest epoch, $2 scope ('' = all), $3 now, $4 Retention +
		// TombstoneWindow µs, $5 Retention µs, $6 records' oldest epoch, $7 after epoch,
		// $8 after scope, $9 after id, $10 page size.
		q.scanTombstones = x(`WITH t AS MATERIALIZED (SELECT ` + q.clock("$3") + ` AS now)
SELECT c.epoch, c.scope, c.id, c.used_at, t.now FROM t, (
  SELECT m.epoch, m.scope, m.id, m.used_at     -- markers: the key's newest, no record as new
    FROM S.markers m, t
   WHERE m.epoch >= $1 AND m.used_at + $4::bigint` + us + ` > t.now AND m.used_at + $5::bigint` + us + ` <= t.now
     AND ($2::bytea = '' OR m.scope = $2)
     AND NOT EXISTS (SELECT 1 FROM S.markers n WHERE n.scope = m.scope AND n.id = m.id AND n.epoch > m.epoch)
     AND NOT EXISTS (SELECT 1 FROM S.records r WHERE r.scope = m.scope AND r.id = m.id AND r.epoch >= $6
                        AND r.updated_at >= m.used_at)
  UNION ALL
  SELECT ` + markerEpochSQL("r.epoch", markerK) + `, r.scope, r.id, r.updated_at
    FROM S.records r, t                        -- records past retention GC has not dropped:
   WHERE r.epoch >= $6 AND r.updated_at + $4::bigint` + us + ` > t.now  -- the key's newest, no
     AND r.updated_at + $5::bigint` + us + ` <= t.now                    -- newer marker
     AND ($2::bytea = '' OR r.scope = $2)
     AND NOT EXISTS (SELECT 1 FROM S.records o WHERE o.scope = r.scope AND o.id = r.id AND o.epoch > r.epoch)
     AND NOT EXISTS (SELECT 1 FROM S.markers n WHERE n.scope = r.scope AND n.id = r.id AND n.epoch >= $1
                        AND n.used_at > r.updated_at)
) c
 WHERE (c.epoch, c.scope, c.id) > ($7::bigint, $8::bytea, $9::bytea)
 ORDER BY c.epoch, c.scope, c.id
 LIMIT $10`)
	}
	// GC's copy of the markers a records partition's records still need, before it
	// drops the partition (copyMarkersSQL fills in @records@): each record whose
	// tombstone can still be in force gets its marker (the markers partition of its
	// epoch, its updated_at; a marker already there keeps the newer time). $1 now,
	// $2 Retention + TombstoneWindow µs (GC's: the longest any node recorded).
	q.copyMarkers = x(`WITH t AS MATERIALIZED (SELECT ` + q.clock("$1") + ` AS now)
INSERT INTO S.markers AS m (scope, id, epoch, used_at)
SELECT r.scope, r.id, ` + markerEpochSQL("r.epoch", markerK) + `, r.updated_at
  FROM S.@records@ r, t
 WHERE r.updated_at + $2::bigint` + us + ` > t.now
ON CONFLICT (scope, id, epoch) DO UPDATE SET used_at = greatest(m.used_at, EXCLUDED.used_at)`)

	// Fence-first in the caller's transaction: lock the holder's row (no row: lease lost).
	q.fence = x(`WITH ` + q.clockCTE("$7", "$6") + `
SELECT t.now FROM S.records r, t
 WHERE ` + fenced + `
   FOR UPDATE OF r`)

	// Scan page: keyset pagination on (scope, id). $1 oldest, $2 retention µs, $3 now,
	// $4 scope ('' = all), $5 state (0 = any), $6 abandoned only, $7 after scope, $8 after id,
	// $9 page size.
	q.scan = x(`WITH t AS MATERIALIZED (SELECT ` + q.clock("$3") + ` AS now)
SELECT r.scope, r.id, ` + recCols + `, t.now
  FROM S.records r, t
 WHERE r.epoch >= $1 AND r.updated_at + $2::bigint` + us + ` > t.now
   AND ($4::bytea = '' OR r.scope = $4)
   AND ($5::smallint = 0 OR r.state = $5)
   AND (NOT $6::bool OR (r.state = 1 AND r.lease_expires_at <= t.now))
   AND (r.scope, r.id) > ($7::bytea, $8::bytea)
 ORDER BY r.scope, r.id
 LIMIT $9`)
	if mutate.Name == mutate.PgNoFence || mutate.Name == mutate.PgNoAtomic {
		q = mutated(q, mutate.Name) // test-only: mutations.go
	}
	return q
}

// freshFnSQL returns the call of a gated claim's first statement (claim.go) and the
// function it calls, name in schema s (created at Open, as claim_scope is): the key's
// advisory lock, the scope's lock shared and its erasures (claim_scope's check), then
// q.fresh's decision, in one statement instead of three. The function is VOLATILE PL/pgSQL,
// so each statement in it reads a snapshot taken when that statement starts: the erasures
// and the key's record are read after both locks are held, as the separate statements read
// them, and its time is taken after the locks too. Its statements' plans are cached per
// session (PL/pgSQL prepares them once), and only the branch of the tombstone setting in
// force is set up. Parameters (the call's): $1 the key's lock (lockID), $2 the scope's lock
// (scopeLock), $3 the scope's ID (ScopeID), $4 scope, $5 id, $6 fp, $7 nonce, $8 lease µs,
// $9 epoch width µs, $10 oldest live epoch, $11 the clock parameter (nowArg), $12 whether it
// is the injected time, $13 the oldest markers epoch that can be in force (NULL: tombstones
// off), $14 the oldest records epoch that can hold a tombstone ($13's first), $15 Retention +
// TombstoneWindow µs.
//
// The decision is the claim statement's "fresh" branch alone, for a key with no record in
// the live partitions (the common first call), without the claim statement's other
// branches. A key that has a record gets it back instead (cur: the lookup's read, on a
// snapshot taken after the lock), so that a retry of a finished operation is answered by the
// same round trip; the claim statement decides everything else. Columns: recCols, the
// statement's time, then whether the row is the new claim (else the key's record). No row: a
// tombstone in force (no marker, and no record in a partition below the live ones that GC
// has yet to drop, within Retention + TombstoneWindow), which the claim statement answers.
// The function returns the record as the records table's row type, so a column added to the
// table comes back without a change here (the call's columns are recCols).
//
// A plain INSERT, without ON CONFLICT DO NOTHING: under the key's lock, with cur read on a
// snapshot taken after it, no row of the key can exist in the live partitions that cur does
// not see (every writer of a new row of a key holds its lock), so a conflict is left only to
// a row the snapshot cannot see; it fails with a unique violation (23505), which the claim
// re-sends as it re-sends a claim statement that returned no row (claimDecide). ON
// CONFLICT's speculative insertion costs the server one more index descent (its pre-check)
// on every first call: bench/README.md, "Per statement".
func freshFnSQL(s, name string) (call, ddl string) {
	x := func(sql string) string { return strings.ReplaceAll(sql, "S.", s+".") }
	us := ` * interval '1 microsecond'`
	cur := `cur AS (SELECT r FROM S.records r WHERE r.scope = sc AND r.id = kid AND r.epoch >= oldest
                ORDER BY r.epoch DESC LIMIT 1)`
	ins := `ins AS (
  INSERT INTO S.records AS r (scope, id, epoch, state, fp, token, attempts, nonce,
                              created_at, updated_at, lease_expires_at)
  SELECT sc, kid, ep, 1, kfp, nextval('S.token_seq'), 1, knonce, n, n, n + lease_us` + us + `
   WHERE NOT EXISTS (SELECT 1 FROM cur)`
	out := `
  RETURNING r
)
SELECT i.r, n, true FROM ins i
UNION ALL
SELECT c.r, n, false FROM cur c`
	tomb := `
     AND NOT EXISTS (SELECT 1 FROM S.markers m WHERE m.scope = sc AND m.id = kid AND m.epoch >= mbottom
                        AND m.used_at + tomb_us` + us + ` > n)
     AND NOT EXISTS (SELECT 1 FROM S.records o WHERE o.scope = sc AND o.id = kid AND o.epoch >= rbottom
                        AND o.epoch < oldest AND o.updated_at + tomb_us` + us + ` > n)`
	ddl = x(`CREATE OR REPLACE FUNCTION S.` + name + `(klock int4, slock int4, sid bytea, sc bytea, kid bytea,
    kfp bytea, knonce bytea, lease_us bigint, width_us bigint, oldest bigint, clk timestamptz,
    injected bool, mbottom bigint, rbottom bigint, tomb_us bigint)
RETURNS TABLE (o_rec S.records, o_now timestamptz, o_claimed bool)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE n timestamptz; ep bigint;
BEGIN
  PERFORM pg_advisory_xact_lock(` + strconv.Itoa(int(lockClass)) + `, klock), pg_advisory_xact_lock_shared(` + strconv.Itoa(int(scopeLockClass)) + `, slock);
  n := CASE WHEN injected THEN clk ELSE greatest(clock_timestamp(), clk) END;
  IF EXISTS (SELECT 1 FROM S.erasures e WHERE e.scope_id = sid AND e.until > n) THEN
    RAISE EXCEPTION 'receipts: scope erased' USING ERRCODE = '` + errErasedCode + `';
  END IF;
  ep := floor(extract(epoch FROM n) * 1000000 / width_us)::bigint;
  IF mbottom IS NULL THEN
    RETURN QUERY WITH ` + cur + `,
` + ins + out + `;
  ELSE
    RETURN QUERY WITH ` + cur + `,
` + ins + tomb + out + `;
  END IF;
END $$`)
	call = x(`SELECT ` + strings.ReplaceAll(recCols, "r.", "(f.o_rec).") + `, f.o_now, f.o_claimed
  FROM S.` + name + `($1::int4, $2::int4, $3::bytea, $4::bytea, $5::bytea, $6::bytea, $7::bytea, $8::bigint,
       $9::bigint, $10::bigint, $11::timestamptz, $12::bool, $13::bigint, $14::bigint, $15::bigint) f`)
	return call, ddl
}

// freshManyFnSQL returns the call of a batch of first claims (claim.go) and the function
// it calls, name in schema s: in one statement, what [lockMany; claim_scopes; freshMany] did
// in three. For each key, in order, its advisory lock and then its scope's lock shared, each
// taken only if it is free (pg_try_advisory_xact_lock never waits, so a batch neither waits
// for a key another transaction holds nor takes part in a deadlock); then, on a snapshot
// taken after the locks, the keys whose scope is not erased are kept, and q.fresh's decision
// is made for each kept key, on a snapshot taken after its lock (freshFnSQL). Parameters:
// $1 the keys' locks, $2 their scopes' locks, $3 the scopes' IDs, $4 scopes, $5 ids, $6
// fingerprints, $7 nonces, $8 lease µs (arrays, one element per key; the keys are distinct),
// then $9.. as freshFnSQL's. Rows: first one per kept key, its position in the arrays
// (1-based) with NULL for the record and the claim flag (the key was locked and decided);
// then freshFnSQL's columns for each kept key that has a record or was claimed, with its
// position. A kept key with no record row has a tombstone in force; a key not kept was not
// decided (it claims alone). The arrays are read through sub-selects (param) so that the
// function's statements keep their generic plans.
func freshManyFnSQL(s, name string) (call, ddl string) {
	x := func(sql string) string { return strings.ReplaceAll(sql, "S.", s+".") }
	us := ` * interval '1 microsecond'`
	k := `k AS MATERIALIZED (
  SELECT * FROM unnest((SELECT scs), (SELECT kids), (SELECT kfps), (SELECT knonces), (SELECT leases))
                WITH ORDINALITY AS k(scope, id, fp, nonce, lease_us, i)
   WHERE k.i = ANY ((SELECT kept)::bigint[])
),
cur AS MATERIALIZED (SELECT k.i, c.r FROM k CROSS JOIN LATERAL (
    SELECT r FROM S.records r WHERE r.scope = k.scope AND r.id = k.id AND r.epoch >= oldest
     ORDER BY r.epoch DESC LIMIT 1) c),
ins AS (
  INSERT INTO S.records AS r (scope, id, epoch, state, fp, token, attempts, nonce,
                              created_at, updated_at, lease_expires_at)
  SELECT k.scope, k.id, ep, 1, k.fp, nextval('S.token_seq'), 1, k.nonce, n, n, n + k.lease_us` + us + `
    FROM k
   WHERE NOT EXISTS (SELECT 1 FROM cur c WHERE c.i = k.i)`
	out := `
  RETURNING r AS rec, r.scope AS rscope, r.id AS rid
)
SELECT x.rec, n, true, k.i FROM ins x JOIN k ON k.scope = x.rscope AND k.id = x.rid
UNION ALL
SELECT c.r, n, false, c.i FROM cur c`
	tomb := `
     AND NOT EXISTS (SELECT 1 FROM S.markers m WHERE m.scope = k.scope AND m.id = k.id AND m.epoch >= mbottom
                        AND m.used_at + tomb_us` + us + ` > n)
     AND NOT EXISTS (SELECT 1 FROM S.records o WHERE o.scope = k.scope AND o.id = k.id AND o.epoch >= rbottom
                        AND o.epoch < oldest AND o.updated_at + tomb_us` + us + ` > n)`
	ddl = x(`CREATE OR REPLACE FUNCTION S.` + name + `(klocks int4[], slocks int4[], sids bytea[], scs bytea[], kids bytea[],
    kfps bytea[], knonces bytea[], leases bigint[], width_us bigint, oldest bigint, clk timestamptz,
    injected bool, mbottom bigint, rbottom bigint, tomb_us bigint)
RETURNS TABLE (o_rec S.records, o_now timestamptz, o_claimed bool, o_i bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE n timestamptz; ep bigint; locked bigint[] := '{}'; kept bigint[]; j int;
BEGIN
  FOR j IN 1 .. coalesce(cardinality(klocks), 0) LOOP
    IF pg_try_advisory_xact_lock(` + strconv.Itoa(int(lockClass)) + `, klocks[j]) THEN
      IF pg_try_advisory_xact_lock_shared(` + strconv.Itoa(int(scopeLockClass)) + `, slocks[j]) THEN
        locked := locked || j::bigint;
      END IF;
    END IF;
  END LOOP;
  n := CASE WHEN injected THEN clk ELSE greatest(clock_timestamp(), clk) END;
  SELECT coalesce(array_agg(l.i), '{}') INTO kept FROM unnest((SELECT locked)) AS l(i)
   WHERE NOT EXISTS (SELECT 1 FROM S.erasures e WHERE e.scope_id = sids[l.i] AND e.until > n);
  RETURN QUERY SELECT NULL::S.records, n, NULL::bool, l.i FROM unnest((SELECT kept)) AS l(i);
  IF cardinality(kept) = 0 THEN
    RETURN;
  END IF;
  ep := floor(extract(epoch FROM n) * 1000000 / width_us)::bigint;
  IF mbottom IS NULL THEN
    RETURN QUERY WITH ` + k + out + `;
  ELSE
    RETURN QUERY WITH ` + k + tomb + out + `;
  END IF;
END $$`)
	call = x(`SELECT ` + strings.ReplaceAll(recCols, "r.", "(f.o_rec).") + `, f.o_now, f.o_claimed, f.o_i
  FROM S.` + name + `($1::int4[], $2::int4[], $3::bytea[], $4::bytea[], $5::bytea[], $6::bytea[], $7::bytea[], $8::bigint[],
       $9::bigint, $10::bigint, $11::timestamptz, $12::bool, $13::bigint, $14::bigint, $15::bigint) f`)
	return call, ddl
}

// finishInSQL is the template q.finishIn filled in for records epoch ep, whose markers
// partition is mep.
func (q queries) finishInSQL(ep, mep int64) string { return q.inPartition(q.finishIn, ep, mep) }

// copyMarkersSQL is q.copyMarkers for the records partition named name.
func (q queries) copyMarkersSQL(name string) string {
	return strings.ReplaceAll(q.copyMarkers, "@records@", pgx.Identifier{name}.Sanitize())
}

// finishManyInSQL is q.finishManyIn filled in as finishInSQL fills in q.finishIn.
func (q queries) finishManyInSQL(ep, mep int64) string { return q.inPartition(q.finishManyIn, ep, mep) }

// inPartition fills in template sql for records epoch ep, whose markers partition is mep.
func (q queries) inPartition(sql string, ep, mep int64) string {
	return strings.NewReplacer(
		"@records@", pgx.Identifier{partName(famRecords, aimed(ep))}.Sanitize(),
		"@markers@", pgx.Identifier{partName(famMarkers, mep)}.Sanitize(),
		"@ep@", strconv.FormatInt(ep, 10)+"::bigint",
		"@mep@", strconv.FormatInt(mep, 10)+"::bigint",
	).Replace(sql)
}

// lookupIn is the lookup statement reading one records partition, part (lookupIn in
// replay.go). $1 scope, $2 id, $3 now.
func (q queries) lookupIn(part string) string {
	return `SELECT ` + recCols + `, t.now
  FROM (SELECT ` + q.clock("$3") + ` AS now) t
  LEFT JOIN ` + q.schema + `.` + pgx.Identifier{part}.Sanitize() + ` r ON r.scope = $1 AND r.id = $2`
}

// lookupManyIn is lookupIn for several keys at once (replay.go): one row per key of the
// arrays, its record in part or NULLs. $1 scopes, $2 ids, $3 now. Columns: lookupIn's, then
// the key's position in the arrays (1-based).
func (q queries) lookupManyIn(part string) string {
	return `SELECT ` + recCols + `, t.now, k.i
  FROM (SELECT ` + q.clock("$3") + ` AS now) t
  CROSS JOIN unnest(` + param("$1", "bytea[]") + `, ` + param("$2", "bytea[]") + `) WITH ORDINALITY AS k(scope, id, i)
  LEFT JOIN ` + q.schema + `.` + pgx.Identifier{part}.Sanitize() + ` r ON r.scope = k.scope AND r.id = k.id`
}

// schemaSQL creates format 2 (run once, under the schema's advisory lock).
func schemaSQL(schema string) []string {
	s := pgx.Identifier{schema}.Sanitize()
	x := func(sql string) string { return strings.ReplaceAll(sql, "S.", s+".") }
	return []string{
		`CREATE SCHEMA IF NOT EXISTS ` + s,
		// tokens: one sequence, CACHE 1 so that values increase across sessions
		x(`CREATE SEQUENCE S.token_seq AS bigint CACHE 1 NO CYCLE`),
		x(`CREATE TABLE S.meta (
  singleton      boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
  format         int         NOT NULL,
  epoch_width_us bigint      NOT NULL,
  retention_us   bigint      NOT NULL,   -- the Retention in force at the last open
  lease_ttl_us   bigint      NOT NULL,   -- the LeaseTTL in force at the last open
  secret         bytea       NOT NULL,
  created_at     timestamptz NOT NULL,
  maint_owner    text,
  maint_until    timestamptz,
  clock          timestamptz,            -- the latest time the store has used (clockColumn)
  tombstone_window_us bigint,            -- the TombstoneWindow in force at the last open (-1: off)
  marker_width_us bigint     NOT NULL    -- markers partition width: a whole number of epochs
)`),
		// One row per key, in the partition of its last write (epoch = last write / width).
		// Results inline: past retention only the key's marker is kept (markers). No index on
		// state or times: renew and finish stay HOT-eligible.
		x(`CREATE TABLE S.records (
  scope            bytea       NOT NULL,
  id               bytea       NOT NULL,
  epoch            bigint      NOT NULL,
  state            smallint    NOT NULL,   -- 1 pending, 2 succeeded, 3 failed (driver.State)
  fp               bytea       NOT NULL,
  token            bigint      NOT NULL,
  attempts         int         NOT NULL,
  nonce            bytea       NOT NULL,   -- per claim attempt: a retried claim knows itself
  created_at       timestamptz NOT NULL,
  updated_at       timestamptz NOT NULL,   -- visible while now < updated_at + retention
  lease_expires_at timestamptz,            -- pending only
  result           bytea,                  -- finished only
  meta             bytea,                  -- the trace context of a finished record (driver.Record.Trace), or NULL
  journal          bytea,                  -- the claim's step journal (steps.go), or NULL
  PRIMARY KEY (scope, id, epoch)
) PARTITION BY RANGE (epoch)`),
		markersSQL(s),
	}
}

// markersSQL creates the markers family: tombstones (Options.TombstoneWindow). Every write of
// a record, while tombstones are on, also writes the key's marker in the same statement, in
// the partition of the same epoch, holding the record's updated_at; a deletion of a record
// (Release of a first attempt, Forget) deletes the key's markers. A key without a visible
// record whose newest marker is within Retention + TombstoneWindow is tombstoned: a claim
// answers Expired. GC drops a markers partition once its end plus Retention plus
// TombstoneWindow has passed, as it drops records partitions after Retention.
func markersSQL(schema string) string {
	return `CREATE TABLE ` + schema + `.markers (
  scope   bytea       NOT NULL,
  id      bytea       NOT NULL,
  epoch   bigint      NOT NULL,
  used_at timestamptz NOT NULL,   -- the record's updated_at at this write
  PRIMARY KEY (scope, id, epoch)
) PARTITION BY RANGE (epoch)`
}
