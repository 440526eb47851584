package receipts

// The claim path, top-down:
//
//  1. Claim (or Do) enters the gate and validates the key and fingerprint;
//  2. claim asks the engine for one atomic decision (driver.Engine.Claim).
//     The Pebble engine probes its replay cache first (a retry of a
//     finished operation: one read, no key lock), then, under the key lock,
//     reads the newest live epoch, lets internal/machine decide, writes a
//     new or taken-over claim to the current epoch and syncs it;
//  3. the outcome becomes a Lease (Claimed, TookOver), a replayed Receipt
//     after Options.BeforeReplay (Replay), ErrIntentMismatch, or, while
//     another holder's lease is live, *InProgressError or a wait;
//  4. waiting (WaitForResult, WaitAtMost, Do) registers a watch on the key
//     (driver.Engine.Watch), claims once more (a change between the first
//     read and the registration is not missed), then sleeps until the watch
//     fires, the holder's lease ends, a re-check period, the deadline, ctx
//     or Close, and claims again.
//
// The holder then calls the Lease's methods (lease.go), or Do runs fn and
// records its outcome (run.go).

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/internal/mutate"
	"github.com/receiptstore/receipts/internal/seal"
	"github.com/receiptstore/receipts/observe"
)

// ClaimOption changes how Claim behaves.
type ClaimOption func(*claimConfig)

type claimConfig struct {
	wait    bool          // wait for a live holder instead of ErrInProgress
	bounded bool          // with wait: give up after maxWait (otherwise only ctx bounds it)
	maxWait time.Duration // with bounded: how long to wait (<= 0: look once)
	ttlSet  bool          // LeaseFor was given
	ttl     time.Duration // with ttlSet: this claim's lease length
	// traceOut (Do, when it is observed) receives a replay's stored trace
	// context, for the Do's event: a pointer into the Do's frame instead of
	// a value in its context, which would cost two allocations per Do.
	traceOut *[]byte
}

// WaitForResult makes Claim block, bounded by its context, while another
// caller holds a live lease on the key: until the holder commits (Claim then
// returns the receipt), releases or lets its lease run out (Claim then
// returns a lease). Holders in this process wake waiters through a channel;
// a holder from before a restart is waited out until its lease expires.
func WaitForResult() ClaimOption { return func(c *claimConfig) { c.wait = true } }

// WaitAtMost is WaitForResult bounded by d as well as by the context: once d
// has passed, Claim looks at the key once more and returns what it finds
// (the receipt, a lease, or *InProgressError with a fresh RetryAfter, not
// wrapping any context error). HTTP and MCP front ends use it to wait a
// little for a duplicate's first call before answering "in progress". A d
// of zero or less does not wait: Claim looks once and answers.
func WaitAtMost(d time.Duration) ClaimOption {
	return func(c *claimConfig) { c.wait, c.bounded, c.maxWait = true, true, d }
}

// LeaseFor gives this claim a lease of d instead of Options.LeaseTTL: for an
// operation whose effect takes much longer (or much less) than the store's
// usual lease, so that it neither renews all the time nor expires early. d
// must be positive and less than Options.Retention; Claim and Do refuse
// anything else with ErrInvalidOptions and change nothing.
//
// The length is the claim's own: the engine writes LeaseExpiresAt = now + d
// on the claim (or takeover), Lease.Renew and the background renewal of Do
// and Lease.Run extend it by d (every d/3), and a takeover by another
// caller happens only once it has run out. A caller that takes an abandoned
// claim over gets the lease length it asks for, not the earlier holder's.
// The RetryAfter of an *InProgressError answered while the claim is held
// is bounded by its lease's end and counts the attempt's time from its last
// claim or renewal, so it follows d too.
func LeaseFor(d time.Duration) ClaimOption {
	return func(c *claimConfig) { c.ttlSet, c.ttl = true, d }
}

// leaseTTL is the lease length of a claim made with cfg: LeaseFor's, checked
// against Retention, or Options.LeaseTTL.
func (db *DB) leaseTTL(cfg *claimConfig) (time.Duration, error) {
	if !cfg.ttlSet {
		return db.ttl, nil
	}
	if cfg.ttl <= 0 || cfg.ttl >= db.opts.Retention {
		return 0, fmt.Errorf("%w: LeaseFor %s must be positive and less than Retention %s", ErrInvalidOptions, cfg.ttl, db.opts.Retention)
	}
	return cfg.ttl, nil
}

// Claim claims k for the caller with the intent's fingerprint. Exactly one
// of lease and receipt is non-nil when err is nil:
//   - a lease: the caller must run the effect, then Commit, Fail or Release
//     (the claim is synced before Claim returns, so an external effect may
//     start at once);
//   - a receipt: the operation already finished (Succeeded or Failed); its
//     stored result is returned after Options.BeforeReplay, and nothing runs.
//
// Errors: ErrIntentMismatch if k was used with another fingerprint;
// *ExpiredError (ErrExpired) if k was used but its receipt is past
// retention, within Options.TombstoneWindow (or too old by KeyTime);
// *InProgressError (ErrInProgress) while another caller holds a live lease,
// unless WaitForResult is given; ErrInvalidKey, ErrInvalidFingerprint,
// ErrInvalidOptions (a LeaseFor out of bounds), ErrCorrupt, ErrClosed, or
// the context's error.
func (db *DB) Claim(ctx context.Context, k Key, fingerprint []byte, opts ...ClaimOption) (*Lease, *Receipt, error) {
	if err := db.enter(); err != nil {
		return nil, nil, err
	}
	defer db.exit()
	return db.claim(ctx, k, fingerprint, claimOptions(opts), nil)
}

// ClaimWith is Claim with the engine's decision made by claim instead of the
// engine's Claim: an engine package's own way of claiming (pgstore.DoTx
// claims inside the caller's transaction). claim gets the request Claim
// would send (validated) and must decide as driver.Engine.Claim does. Like
// database/sql's Conn.Raw, it is for engine packages; applications call
// Claim.
func (db *DB) ClaimWith(ctx context.Context, k Key, fingerprint []byte,
	claim func(ctx context.Context, e driver.Engine, req driver.ClaimRequest) (driver.ClaimResult, error),
	opts ...ClaimOption,
) (*Lease, *Receipt, error) {
	if err := db.enter(); err != nil {
		return nil, nil, err
	}
	defer db.exit()
	return db.claim(ctx, k, fingerprint, claimOptions(opts), func(ctx context.Context, req driver.ClaimRequest) (driver.ClaimResult, error) {
		return claim(ctx, db.eng, req)
	})
}

// claimOptions applies opts. The options see a heap copy only when there
// are any: a claim without options allocates nothing for them.
func claimOptions(opts []ClaimOption) claimConfig {
	if len(opts) == 0 {
		return claimConfig{}
	}
	cfg := new(claimConfig)
	for _, o := range opts {
		o(cfg)
	}
	return *cfg
}

// claimFunc makes one claim decision for ClaimWith; nil means the engine's
// Claim (a method value of an interface would allocate on every call).
type claimFunc func(ctx context.Context, req driver.ClaimRequest) (driver.ClaimResult, error)

func (db *DB) claim(ctx context.Context, k Key, fp []byte, cfg claimConfig, decide claimFunc) (*Lease, *Receipt, error) {
	if !db.tracing(ctx) {
		l, r, err := db.claimLoop(ctx, k, fp, cfg, decide, nil)
		if l != nil && l.recovered {
			db.logTakeover(ctx, l) // logged at Info even when nothing is traced
		}
		return l, r, err
	}
	var tr claimTrace
	ctx = db.begin(ctx, observe.ClaimEvent)
	start := monoNow()
	l, r, err := db.claimLoop(ctx, k, fp, cfg, decide, &tr)
	db.observeClaim(ctx, k, start, &tr, l, r, err)
	if cfg.traceOut != nil {
		*cfg.traceOut = tr.trace
	}
	return l, r, err
}

// claimLoop is claim; tr, if not nil, learns whether and since when it
// waited.
func (db *DB) claimLoop(ctx context.Context, k Key, fp []byte, cfg claimConfig, decide claimFunc, tr *claimTrace) (*Lease, *Receipt, error) {
	if err := k.validate(); err != nil {
		return nil, nil, err
	}
	if err := validateFingerprint(fp); err != nil {
		return nil, nil, err
	}
	ttl, err := db.leaseTTL(&cfg)
	if err != nil {
		return nil, nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	if db.opts.KeyTime != nil {
		if err := db.keyTooOld(ctx, k); err != nil {
			return nil, nil, err
		}
	}
	sk, err := db.storedKey(k) // Options.HashKeys (privacy.go)
	if err != nil {
		return nil, nil, err
	}
	req := driver.ClaimRequest{Key: sk, Fingerprint: fp, LeaseTTL: ttl}
	var deadline time.Time
	if cfg.bounded {
		deadline = time.Now().Add(max(cfg.maxWait, 0))
	}
	var w watch
	defer w.end()
	conflict := false
	var hint time.Duration // the last RetryAfter estimate
	for {
		var res driver.ClaimResult
		var err error
		if decide == nil {
			res, err = db.eng.Claim(ctx, req)
		} else {
			res, err = decide(ctx, req)
		}
		if err != nil {
			if cerr := ctx.Err(); conflict && cerr != nil && errors.Is(err, cerr) {
				// The context ended while this call waited for a holder.
				return nil, nil, &InProgressError{Key: k, RetryAfter: hint, cause: cerr, db: db}
			}
			return nil, nil, err
		}
		if res.Outcome != driver.InProgress {
			if tr != nil && res.Outcome == driver.Replay {
				tr.trace = res.Record.Trace // the recorded execution's, for the replay's event
			}
			res.Record.Key = req.Key // the stored key (what a lease and an envelope name)
			return db.claimed(ctx, k, ttl, &res)
		}
		// InProgress: counted once per call, however long it waits.
		if !conflict {
			db.hot.Conflicts.Add(1)
			conflict = true
		}
		retry := max(res.Record.LeaseExpiresAt.Sub(res.Now), 0)
		hint = db.retryAfter(&res.Record, res.Now, observe.OperationClass(ctx))
		wait := min(retry, waitRecheck)
		if !deadline.IsZero() {
			wait = min(wait, time.Until(deadline))
		}
		if !cfg.wait || (!deadline.IsZero() && wait <= 0) {
			return nil, nil, &InProgressError{Key: k, RetryAfter: hint, db: db}
		}
		if w.c == nil { // registered after this read: read once more before waiting
			if w.waiters == nil { // this call starts waiting
				w.waiters = &db.n.waiters
				w.waiters.Add(1)
				if tr != nil {
					tr.waited, tr.waitStart = true, monoNow()
				}
			}
			w.start(db.eng, req.Key)
			continue
		}
		if err := w.wait(ctx, wait, db.closing); err != nil {
			if errors.Is(err, ErrClosed) {
				return nil, nil, err
			}
			return nil, nil, &InProgressError{Key: k, RetryAfter: hint, cause: err, db: db}
		}
	}
}

// claimed turns a claim decision other than InProgress into Claim's answer.
func (db *DB) claimed(ctx context.Context, k Key, ttl time.Duration, res *driver.ClaimResult) (*Lease, *Receipt, error) {
	switch res.Outcome {
	case driver.Claimed, driver.TookOver:
		db.hot.Claims.Add(1)
		recovered := res.Outcome == driver.TookOver
		if recovered {
			db.n.takeovers.Add(1)
		}
		l := &Lease{db: db, key: k, skey: res.Record.Key, token: res.Record.Token, attempt: res.Record.Attempts, recovered: recovered, ttl: ttl, claimedAt: db.clock(), class: observe.OperationClass(ctx)}
		if len(res.Record.Journal) > 0 { // a takeover resumes the steps recorded
			l.steps.raw = bytes.Clone(res.Record.Journal)
		}
		return l, nil, nil
	case driver.Replay:
		if seal.IsSealed(res.Record.Result) { // decrypted once BeforeReplay allows it (seal.go)
			r, err := db.replaySealed(ctx, k, &res.Record)
			return nil, r, err
		}
		var r *Receipt
		if res.Shared && mutate.Name != mutate.NoCopy {
			r = newReceiptCopy(&res.Record)
		} else {
			r = newReceipt(&res.Record)
		}
		r.Key = k // the caller's (the record's is the stored key: Options.HashKeys)
		r, err := db.replay(ctx, r)
		return nil, r, err
	case driver.Mismatch:
		return nil, nil, db.mismatch(k)
	case driver.Expired:
		return nil, nil, db.expired(k, res.Record.ExpiresAt)
	case driver.Erased:
		return nil, nil, db.erased(k, &res.Record)
	}
	return nil, nil, fmt.Errorf("receipts: claim %s: the %s engine answered outcome %d", db.keyName(k), db.eng.Name(), res.Outcome)
}

// watch is a waiter's registration with the engine (driver.Engine.Watch).
type watch struct {
	e    driver.Engine
	k    driver.Key
	c    <-chan struct{}
	done func()

	waiters *atomic.Int64 // the DB's count of waiters, once this one counts in it
}

// end stops the watch for good and takes the waiter out of the count.
func (w *watch) end() {
	w.stop()
	if w.waiters != nil {
		w.waiters.Add(-1)
	}
}

func (w *watch) start(e driver.Engine, k driver.Key) {
	w.e, w.k = e, k
	w.c, w.done = e.Watch(k)
}

func (w *watch) stop() {
	if w.done != nil {
		w.done()
		w.c, w.done = nil, nil
	}
}

// wait sleeps until the watch fires, d passes, ctx ends (its error) or
// closing is closed (ErrClosed). A watch that fired is registered afresh
// before wait returns, so the read that follows misses no later change.
func (w *watch) wait(ctx context.Context, d time.Duration, closing <-chan struct{}) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-w.c:
		w.stop()
		w.start(w.e, w.k)
	case <-t.C:
	case <-ctx.Done():
		return ctx.Err()
	case <-closing:
		return ErrClosed
	}
	return nil
}

// replay counts a replay of r and hands it out after Options.BeforeReplay.
func (db *DB) replay(ctx context.Context, r *Receipt) (*Receipt, error) {
	db.hot.Replays.Add(1)
	if err := db.beforeReplay(ctx, r); err != nil {
		return nil, err
	}
	return r, nil
}

// mismatch counts a refused claim with a different intent.
func (db *DB) mismatch(k Key) error {
	db.hot.Mismatches.Add(1)
	return fmt.Errorf("%w: %s", ErrIntentMismatch, db.keyName(k))
}

// The verdicts on a claim that the engine answered with a record (claimed
// above gives the others: a lease, a replay, a mismatch, in progress), and
// the one given before the engine is asked (keyTooOld), kept together so a
// reader following a key from DB.Do finds every answer in this file.

// expired is the error of a claim of k answered Expired (the receipt's
// retention ended at expiredAt).
func (db *DB) expired(k Key, expiredAt time.Time) error {
	db.n.expired.Add(1)
	return &ExpiredError{Key: k, ExpiredAt: expiredAt, Until: expiredAt.Add(max(db.opts.TombstoneWindow, 0)), db: db}
}

// keyTooOld returns ErrExpired if Options.KeyTime says k was minted more
// than Retention + TombstoneWindow ago by the store's clock.
func (db *DB) keyTooOld(ctx context.Context, k Key) error {
	minted, ok := db.opts.KeyTime(k.ID)
	if !ok {
		return nil
	}
	now, err := db.keyClock(ctx)
	if err != nil {
		return err
	}
	if now.Sub(minted) >= db.opts.Retention+max(db.opts.TombstoneWindow, 0) {
		db.n.expired.Add(1)
		return &ExpiredError{Key: k, db: db}
	}
	return nil
}

// keyClock is the time KeyTime's answers are compared with: the engine's
// clock where it is read without I/O (driver.LocalClock: Pebble's), Options.Now, or the process's clock for an
// engine whose clock is remote (a key's mint time comes from some
// client's clock anyway).
func (db *DB) keyClock(ctx context.Context) (time.Time, error) {
	if c, ok := db.eng.(driver.LocalClock); ok {
		return c.LocalNow(), nil
	}
	return db.clock(), nil
}

// erased counts a claim refused in an erased scope.
func (db *DB) erased(k Key, rec *driver.Record) error {
	db.n.expired.Add(1)
	return &ErasedError{Key: k, At: rec.UpdatedAt, Until: rec.ExpiresAt, db: db}
}

// replaySealed is replay for a record whose result is sealed: Options.BeforeReplay sees the
// receipt without its result (nil), which is decrypted only once it has allowed the replay.
// The receipt, its fingerprint and the plaintext are one allocation (newReceiptCopy, given
// room for the plaintext), which the plaintext is decrypted into.
func (db *DB) replaySealed(ctx context.Context, k Key, rec *driver.Record) (*Receipt, error) {
	room := *rec
	room.Result = rec.Result[:len(rec.Result)-seal.Overhead] // its length only: overwritten below
	r := newReceiptCopy(&room)
	plain := r.Result[:0]
	r.Key, r.Result = k, nil
	r, err := db.replay(ctx, r)
	if err != nil {
		return nil, err
	}
	if r.Result, err = db.seal.OpenInto(ctx, rec, plain); err != nil {
		return nil, err
	}
	return r, nil
}
