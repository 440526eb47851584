package receipts

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/receiptstore/receipts/encoding"
	"github.com/receiptstore/receipts/internal/keys"
	"github.com/receiptstore/receipts/internal/machine"
)

// ClaimOption changes how Claim behaves.
type ClaimOption func(*claimConfig)

type claimConfig struct {
	wait    bool          // wait for a live holder instead of ErrInProgress
	bounded bool          // with wait: give up after maxWait (otherwise only ctx bounds it)
	maxWait time.Duration // with bounded: how long to wait (<= 0: look once)
	noSync  bool          // DoBatch: the claim guards only an effect in the same batch as the receipt
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

// Lease is the right to execute one operation, held by one caller. It is
// fenced by a token: once another caller takes the key over, every method
// returns ErrLeaseLost and writes nothing.
type Lease struct {
	db        *DB
	key       Key
	lockKey   []byte // keys.LockKey of key
	token     uint64
	attempt   uint32
	recovered bool
	claimedAt int64 // store time of the claim, for the attempt-duration estimate
}

// Key returns the operation's key.
func (l *Lease) Key() Key { return l.key }

// Token returns the lease's fencing token: unique store-wide, larger than
// every token handed out before it.
func (l *Lease) Token() uint64 { return l.token }

// Attempt returns 1 for the first claim of a key, plus one per takeover.
func (l *Lease) Attempt() uint32 { return l.attempt }

// Recovered reports that this lease took over an abandoned claim whose
// outcome is unknown (its holder crashed, failed in an unknown way, or let
// its lease run out). Reconcile first: ask the external provider, using
// ProviderKey, whether the effect happened.
func (l *Lease) Recovered() bool { return l.recovered }

// ProviderKey returns the idempotency key to forward to external providers
// for this operation. It is the same for every attempt of the key (and
// across restarts), reveals neither scope nor ID (an HMAC-SHA256 of both,
// keyed by a random secret created with the store), and is "rk_" followed by
// 43 characters of [A-Za-z0-9_-].
func (l *Lease) ProviderKey() string { return l.db.providerKey(l.lockKey) }

func (db *DB) providerKey(lockKey []byte) string {
	mac := hmac.New(sha256.New, db.secret)
	mac.Write(lockKey)
	return "rk_" + base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
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
// *InProgressError (ErrInProgress) while another caller holds a live lease,
// unless WaitForResult is given; ErrInvalidKey, ErrInvalidFingerprint,
// ErrCorrupt, ErrClosed, or the context's error.
func (db *DB) Claim(ctx context.Context, k Key, fingerprint []byte, opts ...ClaimOption) (*Lease, *Receipt, error) {
	if err := db.enter(); err != nil {
		return nil, nil, err
	}
	defer db.exit()
	var cfg claimConfig
	for _, o := range opts {
		o(&cfg)
	}
	return db.claim(ctx, k, fingerprint, cfg)
}

func (db *DB) claim(ctx context.Context, k Key, fp []byte, cfg claimConfig) (*Lease, *Receipt, error) {
	if err := k.validate(); err != nil {
		return nil, nil, err
	}
	if err := validateFingerprint(fp); err != nil {
		return nil, nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	var lk [keys.MaxLockKeyLen]byte
	lockKey := keys.AppendLockKey(lk[:0], k.Scope, k.ID)
	// A retry of a recently finished operation: answered through the replay
	// cache, with one read checked against it, without the key lock.
	if r, out, ok := db.fromCache(ctx, k, lockKey, fp, db.now()); ok {
		if out == machine.Mismatch {
			return nil, nil, db.mismatch(k)
		}
		r, err := db.replay(ctx, r)
		return nil, r, err
	}
	var deadline time.Time
	waited := false
	if cfg.bounded {
		deadline = time.Now().Add(max(cfg.maxWait, 0))
	}
	for {
		e, err := db.locks.Lock(ctx, lockKey)
		if err != nil {
			return nil, nil, err
		}
		// The gate (enter) admits a call only before Close begins, but a
		// call admitted earlier may have waited (for the key lock or for a
		// holder) past that: it must not hand out a lease now, whose Commit
		// would fail with ErrClosed and leave a synced claim the next start
		// takes over as Recovered. Checked under the key lock, so no claim
		// is written once Close has begun and this call saw it.
		if db.closed() {
			e.Unlock()
			return nil, nil, ErrClosed
		}
		now := db.now()
		var rec encoding.Record
		bp := keyBufs.Get().(*[]byte)
		found, stored, err := db.readInto(ctx, k, now, &rec, *bp)
		if err != nil {
			keyBufs.Put(bp)
			e.Unlock()
			return nil, nil, err
		}
		cur := &rec
		if !found {
			cur = nil
		}
		res, err := machine.Claim(cur, fp, now, db.ttl, db.tokenFn)
		if res.Outcome == machine.Replay { // read under the lock: durable
			epoch, _ := keys.Epoch(stored)
			db.cache.Put(lockKey, stored, epoch, cur)
		}
		if res.Outcome != machine.Claimed || err != nil {
			keyBufs.Put(bp) // stored is needed only to write
		}
		if err != nil {
			e.Unlock()
			return nil, nil, err
		}
		switch res.Outcome {
		case machine.Claimed:
			b := db.pdb.NewBatch()
			_, _, _, err := db.put(b, k, stored, res.Next, now)
			if err == nil {
				err = commitBatch(b, cfg.noSync)
			}
			_ = b.Close()
			e.Unlock()
			if stored != nil { // readInto may have grown the buffer
				*bp = stored[:0]
			}
			keyBufs.Put(bp)
			if err != nil {
				return nil, nil, fmt.Errorf("receipts: claim %s: %w", k, err)
			}
			db.hot.claims.Add(1)
			if res.Recovered {
				db.n.takeovers.Add(1)
			}
			return &Lease{db: db, key: k, lockKey: keys.AppendLockKey(nil, k.Scope, k.ID), token: res.Next.Token, attempt: res.Next.Attempts, recovered: res.Recovered, claimedAt: now}, nil, nil

		case machine.Replay:
			e.Unlock()
			r, err := db.replay(ctx, db.receipt(k, cur))
			return nil, r, err

		case machine.Mismatch:
			e.Unlock()
			return nil, nil, db.mismatch(k)
		}

		// InProgress: counted once per call, however long it waits.
		if !waited {
			db.hot.conflicts.Add(1)
			waited = true
		}
		retry := time.Duration(res.RetryAfter)
		hint := db.retryAfter(cur, now, res.RetryAfter)
		wait := min(retry, waitRecheck)
		if !deadline.IsZero() {
			wait = min(wait, time.Until(deadline))
		}
		if !cfg.wait || (!deadline.IsZero() && wait <= 0) {
			e.Unlock()
			return nil, nil, &InProgressError{Key: k, RetryAfter: hint}
		}
		w := e.Watch()
		e.Unlock()
		t := time.NewTimer(wait)
		select {
		case <-w.C:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			w.Done()
			return nil, nil, &InProgressError{Key: k, RetryAfter: hint, cause: ctx.Err()}
		case <-db.closing:
			t.Stop()
			w.Done()
			return nil, nil, ErrClosed
		}
		t.Stop()
		w.Done()
	}
}

// replay counts a replay of r and hands it out after Options.BeforeReplay.
func (db *DB) replay(ctx context.Context, r *Receipt) (*Receipt, error) {
	db.hot.replays.Add(1)
	if err := db.beforeReplay(ctx, r); err != nil {
		return nil, err
	}
	return r, nil
}

// mismatch counts a refused claim with a different intent.
func (db *DB) mismatch(k Key) error {
	db.hot.mismatches.Add(1)
	return fmt.Errorf("%w: %s", ErrIntentMismatch, k)
}

// update runs fn on l's current record under the key lock and writes what
// it returns (nil: delete the record). The batch is synced unless noSync.
// ok=false from fn means the lease is lost: nothing is written.
func (l *Lease) update(ctx context.Context, b *pebble.Batch, noSync, notify bool,
	fn func(cur *encoding.Record, now int64, b *pebble.Batch) (next *encoding.Record, ok bool, err error),
) (*encoding.Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	db := l.db
	e, err := db.locks.Lock(ctx, l.lockKey)
	if err != nil {
		return nil, err
	}
	defer e.Unlock()
	now := db.now()
	cur, stored, err := db.readCtx(ctx, l.key, now)
	if err != nil {
		return nil, err
	}
	if b == nil {
		b = db.pdb.NewBatch()
		defer b.Close()
	}
	next, ok, err := fn(cur, now, b)
	if err != nil {
		return nil, err
	}
	var key, enc []byte
	var epoch uint64
	if !ok {
		return nil, fmt.Errorf("%w: %s (token %d)", ErrLeaseLost, l.key, l.token)
	}
	if next == nil {
		if err = b.Delete(stored, nil); err == nil {
			err = db.commitWithClock(b)
		}
	} else if key, epoch, enc, err = db.put(b, l.key, stored, next, now); err == nil {
		err = commitBatch(b, noSync)
	}
	if err != nil {
		return nil, fmt.Errorf("receipts: write %s: %w", l.key, err)
	}
	if next != nil && !noSync {
		db.cache.PutEncoded(l.lockKey, key, epoch, next, enc) // synced (finished records only)
	}
	if notify { // the attempt is settled
		e.Notify()
		db.est.observe(now - l.claimedAt)
	}
	return next, nil
}

// Renew extends the lease to now + LeaseTTL. Do renews in the background;
// callers of Claim renew themselves when the effect takes longer than the
// lease. Renewals are not synced: a crash ends the lease anyway.
func (l *Lease) Renew(ctx context.Context) error {
	if err := l.db.enter(); err != nil {
		return err
	}
	defer l.db.exit()
	return l.renew(ctx)
}

func (l *Lease) renew(ctx context.Context) error {
	_, err := l.update(ctx, nil, true, false, func(cur *encoding.Record, now int64, _ *pebble.Batch) (*encoding.Record, bool, error) {
		next, ok := machine.Renew(cur, l.token, now, l.db.ttl)
		return next, ok, nil
	})
	return err
}

// Commit records the operation as Succeeded with result, synced before it
// returns. Every later Claim, Do or Lookup of the key gets this receipt.
func (l *Lease) Commit(ctx context.Context, result []byte) (*Receipt, error) {
	return l.finishPublic(ctx, Succeeded, result, nil)
}

// Fail records a definitive failure with result (for example the provider's
// error), replayed to later callers like a success. Use Release instead if
// nothing happened and the operation may be tried again.
func (l *Lease) Fail(ctx context.Context, result []byte) (*Receipt, error) {
	return l.finishPublic(ctx, Failed, result, nil)
}

// CommitWith commits the receipt together with an effect in this engine:
// effect writes into b (the application's own keys in db.Pebble()), and b
// commits with the receipt in one synced batch. If the lease is lost, effect
// is not called and nothing is written (ErrLeaseLost); if effect returns an
// error, nothing is written, the lease is still held, and that error is
// returned (wrapped).
func (l *Lease) CommitWith(ctx context.Context, result []byte, effect func(b *pebble.Batch) error) (*Receipt, error) {
	return l.finishPublic(ctx, Succeeded, result, effect)
}

func (l *Lease) finishPublic(ctx context.Context, state State, result []byte, effect func(*pebble.Batch) error) (*Receipt, error) {
	if err := l.db.enter(); err != nil {
		return nil, err
	}
	defer l.db.exit()
	return l.finish(ctx, state, result, nil, effect)
}

// finish records state and result; b, if not nil, already holds the
// effect (DoBatch) and is written with the receipt.
func (l *Lease) finish(ctx context.Context, state State, result []byte, b *pebble.Batch, effect func(*pebble.Batch) error) (*Receipt, error) {
	if err := validateResult(result); err != nil {
		return nil, err
	}
	result = bytes.Clone(result)
	if result == nil {
		result = []byte{} // a committed result is never nil, first time or replayed
	}
	next, err := l.update(ctx, b, false, true, func(cur *encoding.Record, now int64, b *pebble.Batch) (*encoding.Record, bool, error) {
		next, ok := machine.Finish(cur, l.token, encoding.State(state), result, now)
		if !ok {
			return nil, false, nil // the effect is not applied
		}
		if effect != nil {
			if err := effect(b); err != nil {
				return nil, false, fmt.Errorf("receipts: effect of %s: %w", l.key, err)
			}
		}
		return next, true, nil
	})
	if err != nil {
		return nil, err
	}
	if state == Succeeded {
		l.db.hot.commits.Add(1)
	} else {
		l.db.n.fails.Add(1)
	}
	return l.db.receipt(l.key, next), nil
}

// Release gives the key up: this attempt's effect did not happen. On a
// first attempt the record is deleted and the next Claim starts afresh
// (Attempt 1, not Recovered). On a Recovered lease the earlier attempt's
// outcome is still unknown, so the claim stays, abandoned: the next Claim
// takes it over at once with Recovered() == true and one more Attempt. To
// clear a Recovered key after checking with the provider that no attempt's
// effect happened, use Forget. Callers waiting for the key wake up and one
// of them takes it.
func (l *Lease) Release(ctx context.Context) error {
	if err := l.db.enter(); err != nil {
		return err
	}
	defer l.db.exit()
	return l.release(ctx)
}

func (l *Lease) release(ctx context.Context) error {
	_, err := l.update(ctx, nil, false, true, func(cur *encoding.Record, now int64, _ *pebble.Batch) (*encoding.Record, bool, error) {
		next, ok := machine.Release(cur, l.token, now)
		return next, ok, nil
	})
	if err == nil {
		l.db.n.releases.Add(1)
	}
	return err
}

// Forget gives the key up for good: the caller has checked with the
// provider (by ProviderKey) that no attempt's effect happened, neither this
// one's nor, on a Recovered lease, any earlier one's. The record is deleted
// and the next Claim starts afresh (Attempt 1, not Recovered). On a lease
// that is not Recovered it is Release. Fenced like Release: once another
// caller took the key over it returns ErrLeaseLost and deletes nothing.
func (l *Lease) Forget(ctx context.Context) error {
	if err := l.db.enter(); err != nil {
		return err
	}
	defer l.db.exit()
	_, err := l.update(ctx, nil, false, true, func(cur *encoding.Record, _ int64, _ *pebble.Batch) (*encoding.Record, bool, error) {
		return nil, machine.Forget(cur, l.token), nil
	})
	if err == nil {
		l.db.n.releases.Add(1)
	}
	return err
}

// Abandon gives the key up with its outcome unknown: the effect may or may
// not have happened (a timeout, a crash of the handler, a 5xx from the
// provider). The lease ends at once, the claim stays, and the next caller
// takes it over with Recovered() == true, so it reconciles first. Do
// abandons for you on any error not marked NotPerformed or Permanent, and on
// a panic.
func (l *Lease) Abandon(ctx context.Context) error {
	if err := l.db.enter(); err != nil {
		return err
	}
	defer l.db.exit()
	return l.abandon(ctx)
}

func (l *Lease) abandon(ctx context.Context) error {
	_, err := l.update(ctx, nil, false, true, func(cur *encoding.Record, now int64, _ *pebble.Batch) (*encoding.Record, bool, error) {
		next, ok := machine.Abandon(cur, l.token, now)
		return next, ok, nil
	})
	if err == nil {
		l.db.n.abandons.Add(1)
	}
	return err
}
