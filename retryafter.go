package receipts

import (
	"sync/atomic"
	"time"

	"github.com/receiptstore/receipts/driver"
)

// minRetryAfter is the smallest RetryAfter an InProgressError reports
// (unless the holder's lease ends sooner).
const minRetryAfter = time.Millisecond

// durationEstimate is a moving average of how long an attempt takes, from
// its claim to its settled outcome (commit, fail, release or abandon), in
// nanoseconds (DB.clock). It is updated with one compare-and-swap per outcome and
// read with one load; zero means nothing was measured yet.
type durationEstimate struct{ avg atomic.Int64 }

// observe folds one attempt's duration d into the average (weight 1/8).
func (e *durationEstimate) observe(d int64) {
	d = max(d, 0)
	for {
		old := e.avg.Load()
		next := d
		if old > 0 {
			next = old + (d-old)/8
		}
		if e.avg.CompareAndSwap(old, max(next, 1)) {
			return
		}
	}
}

// retryAfter estimates, at now, when the answer for the key whose live
// record is cur will be there: the typical attempt duration minus how long
// this attempt has run (from the record's times: since CreatedAt for a first
// attempt, and at least since the last takeover or renewal, UpdatedAt, for a
// later one: LeaseExpiresAt less the holder's own lease length, LeaseFor's
// or Options.LeaseTTL, which the record carries that way). An attempt
// already past the typical duration gets one more typical duration. The
// estimate is at least minRetryAfter and never past the lease's end; with
// nothing measured yet it is the lease's remaining time.
func (db *DB) retryAfter(cur *driver.Record, now time.Time) time.Duration {
	leaseLeft := max(int64(cur.LeaseExpiresAt.Sub(now)), 0)
	est := db.est.avg.Load()
	if est == 0 {
		return time.Duration(leaseLeft)
	}
	start := cur.CreatedAt
	if cur.Attempts != 1 {
		start = cur.UpdatedAt
	}
	left := est - max(int64(now.Sub(start)), 0)
	if left <= 0 {
		left = est
	}
	return time.Duration(max(min(left, leaseLeft), min(int64(minRetryAfter), leaseLeft)))
}

// clock is the time attempts are measured by (durationEstimate):
// Options.Now, or the process's clock when an engine keeps its own.
func (db *DB) clock() time.Time {
	if db.opts.Now != nil {
		return db.opts.Now()
	}
	return time.Now()
}

// settled records that l's attempt is settled (committed, failed,
// released, abandoned or forgotten) in the attempt-duration estimate.
func (db *DB) settled(l *Lease) { db.est.observe(int64(db.clock().Sub(l.claimedAt))) }
