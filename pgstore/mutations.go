package pgstore

import (
	"strconv"
	"strings"

	"github.com/receiptstore/receipts/internal/mutate"
)

// mutated breaks q on purpose for the mutation checks (internal/mutate: only in binaries built
// with the receipts_mutate tag, chosen by RECEIPTS_MUTATION), so that the harnesses can show
// they catch a broken engine:
//   - pgnofence: Finish no longer checks the holder's token (the record need only be Pending
//     and visible), so a holder whose key was taken over still commits;
//   - pgnoatomic: a claim is a plain read-then-write: no per-key advisory lock, no row lock
//     on the record a takeover rewrites, and a fresh claim that meets a concurrent one
//     overwrites it instead of losing, so concurrent claims of one key can all win.
func mutated(q queries, name string) queries {
	switch name {
	case mutate.PgNoFence:
		q.finish = mustReplace(q.finish, "AND r.token = $3 AND", "AND $3::bigint > 0 AND")
		q.finishMust = mustReplace(q.finishMust, "AND r.token = $3 AND", "AND $3::bigint > 0 AND")
		q.finishIn = mustReplace(q.finishIn, "AND r.token = $3 AND", "AND $3::bigint > 0 AND")
		q.finishManyIn = mustReplace(q.finishManyIn, "AND r.token = k.token AND", "AND k.token > 0 AND")
	case mutate.PgNoAtomic:
		q.lock = `SELECT $1::int4, $2::int4`
		q.claim = mustReplace(q.claim, "FOR UPDATE OF r SKIP LOCKED", "")
		// The first claims' functions, under names of their own (a function is the schema's:
		// a mutated binary must not replace an unmutated one's): no key lock (the batch's
		// takes every key), and an insert that meets a concurrent one overwrites it.
		for _, f := range []*string{&q.freshFnDDL, &q.freshFn} {
			*f = mustReplace(*f, "claim_fresh_v1(", "claim_fresh_v1_pgnoatomic(")
		}
		for _, f := range []*string{&q.freshManyFnDDL, &q.freshManyFn} {
			*f = mustReplace(*f, "claim_fresh_many_v1(", "claim_fresh_many_v1_pgnoatomic(")
		}
		q.freshFnDDL = mustReplace(q.freshFnDDL, "PERFORM pg_advisory_xact_lock("+strconv.Itoa(int(lockClass))+", klock), ", "PERFORM ")
		q.freshManyFnDDL = mustReplace(q.freshManyFnDDL, "IF pg_try_advisory_xact_lock("+strconv.Itoa(int(lockClass))+", klocks[j]) THEN", "IF klocks[j] IS NOT NULL THEN")
		for _, f := range []*string{&q.freshFnDDL, &q.freshManyFnDDL} {
			const ret = "\n  RETURNING r"
			if strings.Count(*f, ret) != 2 { // both branches (tombstones off, on)
				panic("pgstore: mutation: a first claim's function no longer has two inserts")
			}
			*f = strings.ReplaceAll(*f, ret, `
  ON CONFLICT (scope, id, epoch) DO UPDATE SET state = 1,
      fp = EXCLUDED.fp, token = EXCLUDED.token, attempts = 1, nonce = EXCLUDED.nonce, result = NULL,
      created_at = EXCLUDED.created_at, updated_at = EXCLUDED.updated_at, lease_expires_at = EXCLUDED.lease_expires_at`+ret)
		}
		q.claim = mustReplace(q.claim, "ON CONFLICT DO NOTHING",
			`ON CONFLICT (scope, id, epoch) DO UPDATE SET state = 1, fp = EXCLUDED.fp, token = EXCLUDED.token,
    attempts = 1, nonce = EXCLUDED.nonce, result = NULL, created_at = EXCLUDED.created_at,
    updated_at = EXCLUDED.updated_at, lease_expires_at = EXCLUDED.lease_expires_at`)
	}
	return q
}

// mustReplace replaces old (which must occur) in s: a query that changed shape must not
// silently leave a mutation unapplied.
func mustReplace(s, old, new string) string {
	if !strings.Contains(s, old) {
		panic("pgstore: mutation: query no longer contains " + old)
	}
	return strings.Replace(s, old, new, 1)
}

// member is the batch member (1 to n) that the row a batched statement returned for member i
// answers: i itself, or, under the mutation pgbatchswap, the next member (a batch member
// answered with another member's outcome).
func member(i int64, n int) int64 {
	if mutate.Name == mutate.PgBatchSwap && n > 1 && i >= 1 && i <= int64(n) {
		return i%int64(n) + 1
	}
	return i
}

// aimed is the records partition a statement aimed at epoch's partition names: epoch's,
// or under the pgwrongpart mutation the one before it.
func aimed(epoch int64) int64 {
	if mutate.Name == mutate.PgWrongPart {
		return epoch - 1
	}
	return epoch
}
