package receipts

import (
	"sync"
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

// maxEstimateClasses bounds how many operation classes get an estimate of
// their own (WithOperationClass names a small fixed set; past the bound, a
// class shares the store's).
const maxEstimateClasses = 256

// durationEstimates is the store's attempt-duration estimate and one per
// operation class (the claim's WithOperationClass: receiptmcp's tool,
// receipthttp's route or the class the application names), so that a slow
// operation's retries are not told the time of the fast ones that dominate
// the store's average.
type durationEstimates struct {
	all     durationEstimate
	classes sync.Map // class -> *durationEstimate
	n       atomic.Int32
}

// observe folds an attempt of class (may be "") that took d into the store's
// estimate and its class's.
func (e *durationEstimates) observe(class string, d int64) {
	e.all.observe(d)
	if class == "" {
		return
	}
	c, ok := e.classes.Load(class)
	if !ok {
		if e.n.Load() >= maxEstimateClasses {
			return
		}
		var loaded bool
		if c, loaded = e.classes.LoadOrStore(class, new(durationEstimate)); !loaded {
			e.n.Add(1)
		}
	}
	c.(*durationEstimate).observe(d)
}

// typical is the estimate for an attempt of class: its class's once one of
// them was measured, else the store's; zero when nothing was measured.
func (e *durationEstimates) typical(class string) int64 {
	if class != "" {
		if c, ok := e.classes.Load(class); ok {
			if v := c.(*durationEstimate).avg.Load(); v > 0 {
				return v
			}
		}
	}
	return e.all.avg.Load()
}

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
// record is cur will be there, for a caller of operation class: the typical
// attempt duration of the class (the store's before one of the class was
// measured) minus how long
// this attempt has run (from the record's times: since CreatedAt for a first
// attempt, and at least since the last takeover or renewal, UpdatedAt, for a
// later one: LeaseExpiresAt less the holder's own lease length, LeaseFor's
// or Options.LeaseTTL, which the record carries that way). An attempt
// already past the typical duration gets one more typical duration. The
// estimate is at least minRetryAfter and never past the lease's end; with
// nothing measured yet it is the lease's remaining time.
func (db *DB) retryAfter(cur *driver.Record, now time.Time, class string) time.Duration {
	leaseLeft := max(int64(cur.LeaseExpiresAt.Sub(now)), 0)
	est := db.est.typical(class)
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
// released, abandoned or forgotten) in the attempt-duration estimates, the
// store's and its class's.
func (db *DB) settled(l *Lease) { db.est.observe(l.class, int64(db.clock().Sub(l.claimedAt))) }
