package pgstore

import (
	"context"
	"errors"
	"strings"

	"github.com/receiptstore/receipts/driver"
)

var _ driver.AttemptTaker = (*engine)(nil)

// takeOverSQL takes over the record of $1/$2 if it is still the attempt with token $3, Pending,
// visible, and its lease has run out: a new token, one more attempt, a new nonce ($9), the lease
// now + $8 µs, moved to the current partition. The other parameters are the fenced writes'
// ($4 oldest, $5 retention µs, $6 width µs, $7 now). The row lock of the UPDATE serializes it
// with claims (whose FOR UPDATE SKIP LOCKED reports the key busy and retries) and with the
// holder's fenced writes, as for Renew.
const takeOverSQL = `WITH t AS MATERIALIZED (
  SELECT n AS now, floor(extract(epoch FROM n) * 1000000 / $6::bigint)::bigint AS ep
    FROM (SELECT coalesce($7::timestamptz, clock_timestamp()) AS n) s
)
UPDATE S.records r
   SET token = nextval('S.token_seq'), attempts = r.attempts + 1, nonce = $9::bytea,
       epoch = t.ep, updated_at = t.now, lease_expires_at = t.now + $8::bigint * interval '1 microsecond'
  FROM t
 WHERE r.scope = $1 AND r.id = $2 AND r.epoch >= $4 AND r.token = $3 AND r.state = 1
   AND r.updated_at + $5::bigint * interval '1 microsecond' > t.now
   AND r.lease_expires_at <= t.now
 RETURNING ` + recCols + `, t.now, pg_current_xact_id()::text`

// TakeOver implements driver.AttemptTaker with one fenced UPDATE. If it matches no row, a
// Lookup tells a live lease of that attempt (InProgress) from another record
// (driver.ErrLeaseLost). A takeover whose reply was lost reports ErrLeaseLost too (its token
// is no longer the one asked for): the claim it made is abandoned once its lease runs out.
func (e *engine) TakeOver(ctx context.Context, req driver.ClaimRequest, token uint64) (driver.ClaimResult, error) {
	if e.closing() {
		return driver.ClaimResult{}, driver.ErrClosed
	}
	k := req.Key
	sql := strings.ReplaceAll(takeOverSQL, "S.", e.q.schema+".")
	sql = strings.Replace(sql, "coalesce($7::timestamptz, clock_timestamp())", e.q.clock("$7"), 1) // the clock's high-water mark
	rec, _, err := e.write(ctx, e.pool, "take over", sql, k, e.fencedArgs(k, token, req.LeaseTTL.Microseconds(), newNonce()), nil)
	if err == nil {
		if rec.Journal, err = e.journalOf(ctx, k, rec.Token); err != nil { // the steps it resumes (steps.go)
			e.settleLater(ctx, func(sctx context.Context) { e.undoClaim(sctx, k, rec.Token, true) })
			return driver.ClaimResult{}, err
		}
		return driver.ClaimResult{Outcome: driver.TookOver, Record: rec, Now: rec.UpdatedAt}, nil
	}
	if !errors.Is(err, driver.ErrLeaseLost) {
		return driver.ClaimResult{}, err
	}
	cur, found, now, lerr := e.Lookup(ctx, k)
	if lerr != nil {
		return driver.ClaimResult{}, lerr
	}
	if found && cur.State == driver.Pending && cur.Token == token && now.Before(cur.LeaseExpiresAt) {
		return driver.ClaimResult{Outcome: driver.InProgress, Record: cur, Now: now}, nil
	}
	return driver.ClaimResult{}, errorf("pgstore: take over: the key is no longer the attempt with token %d: %w", token, driver.ErrLeaseLost)
}
