// Package machine is the receipts state machine, free of I/O: given the
// stored record (or none), a request and the time, it returns the record to
// store and the outcome. A storage backend reads the record under its key
// lock, calls one of these functions, and writes what it returns.
//
// Times are Unix nanoseconds by the store's clock.
package machine

import (
	"bytes"
	"math"
	"time"

	"github.com/receiptstore/receipts/encoding"
	"github.com/receiptstore/receipts/internal/mutate"
)

// Outcome is the result of a claim.
type Outcome uint8

// Claim outcomes.
const (
	// Claimed: the caller holds a new lease; write Next.
	Claimed Outcome = iota + 1
	// Replay: a finished receipt exists; return it, write nothing.
	Replay
	// Mismatch: the key exists with another fingerprint.
	Mismatch
	// InProgress: another holder's lease is live.
	InProgress
)

// MaxRetention is the longest retention, in ns (receipts.MaxRetention):
// 100 years.
const MaxRetention = int64(100 * 365 * 24 * time.Hour)

// MaxClock is the latest time, in Unix ns, the store's clock reaches: a
// later clock stands still here (about the year 2162), so that a last
// write plus Retention never overflows.
const MaxClock = math.MaxInt64 - MaxRetention

// ClockNanos is t in Unix ns, saturated to [0, MaxClock]: a time before
// 1970 is read as 1970.
func ClockNanos(t time.Time) int64 {
	switch {
	case t.Unix() < 0:
		return 0
	case t.Unix() >= MaxClock/int64(time.Second):
		return MaxClock
	}
	return min(t.UnixNano(), MaxClock)
}

// Visible reports whether r is still within retention at now: a record is
// visible until its last write plus retention, and never after.
func Visible(r *encoding.Record, now, retention int64) bool {
	return r != nil && !Expired(r.UpdatedAt, now, retention)
}

// Expired reports whether a record last written at updatedAt is past
// retention at now. The sum saturates: a record written so late that
// updatedAt+retention overflows never expires (retention is positive).
func Expired(updatedAt, now, retention int64) bool {
	return updatedAt <= math.MaxInt64-retention && now >= updatedAt+retention
}

// LeaseLive reports whether r's lease is live at now.
func LeaseLive(r *encoding.Record, now int64) bool {
	return r.State == encoding.StatePending && now < r.LeaseExpiresAt
}

// ClaimResult is what Claim decided.
type ClaimResult struct {
	Outcome Outcome
	// Next is the record to write when Outcome is Claimed.
	Next *encoding.Record
	// Recovered: the claim takes over an abandoned one whose outcome is
	// unknown.
	Recovered bool
	// RetryAfter: for InProgress, nanoseconds until the holder's lease ends.
	RetryAfter int64
}

// Claim decides a claim of a key whose visible record is cur (nil if none)
// with fingerprint fp. token is called only when a new lease is granted and
// must return a fresh, store-wide unique token larger than any before it.
func Claim(cur *encoding.Record, fp []byte, now, ttl int64, token func() (uint64, error)) (ClaimResult, error) {
	return claimInto(nil, cur, fp, true, now, ttl, token)
}

// ClaimInto is Claim writing Next into room, which it returns as Next: no
// allocation. Next's fingerprint, for a key with no record, is fp itself,
// not a copy, so keep fp unchanged while Next is in use.
func ClaimInto(room, cur *encoding.Record, fp []byte, now, ttl int64, token func() (uint64, error)) (ClaimResult, error) {
	return claimInto(room, cur, fp, false, now, ttl, token)
}

// claimInto is Claim and ClaimInto: Next goes into room (a new record if
// nil), with a copy of fp as its fingerprint for a key with no record if
// clone.
func claimInto(room, cur *encoding.Record, fp []byte, clone bool, now, ttl int64, token func() (uint64, error)) (ClaimResult, error) {
	if cur == nil {
		t, err := token()
		if err != nil {
			return ClaimResult{}, err
		}
		if clone {
			fp = bytes.Clone(fp)
		}
		if room == nil {
			room = new(encoding.Record)
		}
		*room = encoding.Record{
			State:          encoding.StatePending,
			Fingerprint:    fp,
			Attempts:       1,
			Token:          t,
			CreatedAt:      now,
			UpdatedAt:      now,
			LeaseExpiresAt: now + ttl,
		}
		return ClaimResult{Outcome: Claimed, Next: room}, nil
	}
	if !bytes.Equal(cur.Fingerprint, fp) {
		return ClaimResult{Outcome: Mismatch}, nil
	}
	switch {
	case cur.State != encoding.StatePending:
		return ClaimResult{Outcome: Replay}, nil
	case LeaseLive(cur, now):
		return ClaimResult{Outcome: InProgress, RetryAfter: cur.LeaseExpiresAt - now}, nil
	}
	t, err := token()
	if err != nil {
		return ClaimResult{}, err
	}
	if room == nil {
		room = new(encoding.Record)
	}
	*room = *cur
	room.Token = t
	room.Attempts++
	room.UpdatedAt = now
	room.LeaseExpiresAt = now + ttl
	return ClaimResult{Outcome: Claimed, Next: room, Recovered: true}, nil
}

// holds reports whether a lease with token still holds cur.
func holds(cur *encoding.Record, token uint64) bool {
	return cur != nil && cur.State == encoding.StatePending && (cur.Token == token || mutate.Name == mutate.NoFence)
}

// Renew extends the lease of token to now+ttl. ok is false if the lease is
// lost. Fencing is by token, not time: a holder whose lease ran out but whom
// nobody took over may renew.
func Renew(cur *encoding.Record, token uint64, now, ttl int64) (next *encoding.Record, ok bool) {
	if !holds(cur, token) {
		return nil, false
	}
	n := *cur
	n.UpdatedAt = now
	n.LeaseExpiresAt = max(cur.LeaseExpiresAt, now+ttl)
	return &n, true
}

// Finish records the outcome (Succeeded or Failed) and result of token's
// attempt.
func Finish(cur *encoding.Record, token uint64, state encoding.State, result []byte, now int64) (next *encoding.Record, ok bool) {
	return FinishInto(nil, cur, token, state, result, now)
}

// FinishInto is Finish writing next into room (a new record if nil), which
// it returns: no allocation. room must not be cur.
func FinishInto(room, cur *encoding.Record, token uint64, state encoding.State, result []byte, now int64) (next *encoding.Record, ok bool) {
	if !holds(cur, token) {
		return nil, false
	}
	if room == nil {
		room = new(encoding.Record)
	}
	*room = *cur
	room.State = state
	room.Result = result
	room.UpdatedAt = now
	room.LeaseExpiresAt = 0
	return room, true
}

// Release gives up token's lease on cur, its holder saying that its own
// attempt had no effect. That settles the key only if there was no earlier
// attempt: on a first attempt (Attempts == 1) next is nil, and the caller
// deletes the record, so the next claim starts afresh. After a takeover
// (Attempts > 1: Claim adds an attempt exactly when it takes over an
// abandoned claim, whose outcome is unknown) the earlier attempt's outcome
// is still unknown, so the claim is kept, abandoned; and so it is when the
// claim has a step journal (its steps happened): next is cur with the
// lease ended at now, attempts and fingerprint kept, and the next claim
// takes it over at once, Recovered, with one more attempt. ok is false if
// the lease is lost. Only Forget, or a finished outcome, clears that.
func Release(cur *encoding.Record, token uint64, now int64) (next *encoding.Record, ok bool) {
	if !holds(cur, token) {
		return nil, false
	}
	if cur.Attempts <= 1 && len(cur.Journal) == 0 {
		return nil, true
	}
	return Abandon(cur, token, now)
}

// Journal replaces the step journal of token's claim (receipts' Lease.Step),
// the lease's expiry kept. ok is false if the lease is lost.
func Journal(cur *encoding.Record, token uint64, journal []byte, now int64) (next *encoding.Record, ok bool) {
	if !holds(cur, token) {
		return nil, false
	}
	n := *cur
	n.Journal = journal
	n.UpdatedAt = now
	return &n, true
}

// Forget checks that token holds cur; the caller then deletes the record.
// Its holder has reconciled: no attempt's effect happened, this one's or an
// earlier one's, and the next claim starts afresh (Attempts 1, not
// Recovered).
func Forget(cur *encoding.Record, token uint64) (ok bool) { return holds(cur, token) }

// Abandon ends token's lease at once, keeping the claim: the outcome is
// unknown, and the next claim takes over with Recovered set.
func Abandon(cur *encoding.Record, token uint64, now int64) (next *encoding.Record, ok bool) {
	if !holds(cur, token) {
		return nil, false
	}
	n := *cur
	n.UpdatedAt = now
	n.LeaseExpiresAt = now
	return &n, true
}

// Tombstoned reports whether a key whose record was last written at usedAt
// (and is no longer visible) is still marked as used at now: for window
// after its retention ended. A window <= 0 keeps no tombstones. Like
// Expired, the sum saturates: a tombstone that would end past MaxInt64
// never ends.
func Tombstoned(usedAt, now, retention, window int64) bool {
	return window > 0 && !Expired(usedAt, now, retention+window)
}
