package receipts

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/receiptstore/receipts/internal/mutate"
	"github.com/receiptstore/receipts/observe"
)

// Do performs the operation k at most once and returns its receipt. It
// claims k (waiting, bounded by ctx, for an in-flight holder of the same key
// and returning that holder's receipt, or taking over if the holder releases
// or its lease runs out), runs fn while renewing the lease in the
// background, and commits fn's result. Replays of a finished operation never
// call fn.
//
// fn's error decides what is recorded:
//   - nil: the result is committed as a Succeeded receipt.
//   - NotPerformed(err): nothing happened; the claim is released and Do
//     returns an error wrapping err.
//   - Permanent(err): a definitive failure, stored as a Failed receipt.
//   - any other error, or a panic: the outcome is unknown; the claim is
//     abandoned at once and the next attempt gets Lease.Recovered() == true.
//     Do returns an error wrapping ErrOutcomeUnknown and fn's error (a panic
//     is re-raised). So does a result larger than MaxResultSize, or one
//     whose commit fails: the effect may have happened.
//
// Do is Claim with WaitForResult followed by Lease.Run, in one call that
// Close waits for. opts are Claim's: LeaseFor gives this operation its own
// lease length (renewed every third of it while fn runs), and WaitAtMost
// bounds how long Do waits for an in-flight holder (then it returns that
// holder's *InProgressError) on top of ctx; Do always waits. A Failed receipt, the first time or replayed, comes back
// with an error wrapping ErrFailed. Once fn has returned, the outcome is recorded on a
// context detached from ctx, so a caller that goes away right after the
// effect never loses its receipt. If the lease is lost while fn runs (another
// caller took the key over), fn's context is cancelled with ErrLeaseLost as
// its cause, and Do returns an error wrapping ErrLeaseLost.
func (db *DB) Do(ctx context.Context, k Key, fingerprint []byte,
	fn func(ctx context.Context, l *Lease) ([]byte, error), opts ...ClaimOption,
) (*Receipt, error) {
	if err := db.enter(); err != nil {
		return nil, err
	}
	defer db.exit()
	return db.do(ctx, k, fingerprint, opts, fn)
}

func (db *DB) do(ctx context.Context, k Key, fp []byte, opts []ClaimOption,
	fn func(ctx context.Context, l *Lease) ([]byte, error),
) (*Receipt, error) {
	if db.tally != nil && !db.opts.Logger.Enabled(ctx, slog.LevelDebug) {
		return db.doTallied(ctx, k, fp, opts, fn)
	}
	if !db.observesDo {
		r, _, err := db.doOnce(ctx, k, fp, opts, fn, nil)
		return r, err
	}
	ctx = db.begin(ctx, observe.DoEvent)
	start := monoNow()
	var trace []byte // a replay's stored trace context, for the DoEvent
	r, ran, err := db.doOnce(ctx, k, fp, opts, fn, &trace)
	db.observeDo(ctx, k, start, r, err, ran, trace)
	return r, err
}

// doOnce is do; ran reports whether an attempt ran (a claim was made).
// trace, if not nil, receives a replay's stored trace context (the one its
// ClaimEvent carries).
func (db *DB) doOnce(ctx context.Context, k Key, fp []byte, opts []ClaimOption,
	fn func(ctx context.Context, l *Lease) ([]byte, error), trace *[]byte,
) (_ *Receipt, ran bool, _ error) {
	cfg := claimOptions(opts)
	cfg.wait, cfg.traceOut = true, trace
	l, r, err := db.claim(ctx, k, fp, cfg, nil)
	return db.afterClaim(ctx, k, l, r, err, fn)
}

// doTallied is do for an observer that takes a replay answered at once as one call
// (observe.ReplayObserver): the claim runs before anything is begun; a replay that did not
// wait is one ObserveReplay, and anything else is begun from the Do's start (BeginAt) and
// reported as do and claim report it. Measured (docs/performance.md, "Session 24: a replay as
// one call"): a replay from memory with Prometheus 4,542 -> 4,273 instructions, with
// OpenTelemetry sampling 1% (Producer) 7,269 -> 4,827 (none: 3,632).
func (db *DB) doTallied(ctx context.Context, k Key, fp []byte, opts []ClaimOption,
	fn func(ctx context.Context, l *Lease) ([]byte, error),
) (*Receipt, error) {
	from := time.Since(monoBase)
	cfg := claimOptions(opts)
	cfg.wait = true
	var tr claimTrace
	l, r, err := db.claimLoop(ctx, k, fp, cfg, nil, &tr)
	start := monoBase.Add(from)
	if r != nil && !tr.waited {
		if mutate.Name != mutate.TallyDrop {
			e := observe.NewEvent(observe.ClaimEvent, db.hashKey, k.Scope, k.ID)
			e.Outcome, e.Engine, e.Class, e.Start, e.Duration = observe.OutcomeReplayed, db.engName, observe.OperationClass(ctx), start, time.Since(monoBase)-from
			e.Attempt, e.Recovered, e.Trace = r.Attempts, r.Attempts > 1, tr.trace
			db.tally.ObserveReplay(ctx, e)
		}
		r, _, err = db.afterClaim(ctx, k, nil, r, nil, fn)
		return r, err
	}
	if db.observesDo {
		ctx = db.tally.BeginAt(ctx, observe.DoEvent, start)
	}
	db.observeClaim(db.tally.BeginAt(ctx, observe.ClaimEvent, start), k, start, &tr, l, r, err)
	r, ran, err := db.afterClaim(ctx, k, l, r, err, fn)
	if db.observesDo {
		db.observeDo(ctx, k, start, r, err, ran, tr.trace)
	}
	return r, err
}

// afterClaim is the rest of a Do once its claim returned l, r, err: a replay's answer, or
// fn's attempt under l.
func (db *DB) afterClaim(ctx context.Context, k Key, l *Lease, r *Receipt, err error,
	fn func(ctx context.Context, l *Lease) ([]byte, error),
) (_ *Receipt, ran bool, _ error) {
	if err != nil {
		return nil, false, err
	}
	if r != nil {
		if r.State == Failed {
			return r, false, fmt.Errorf("receipts: %s: %w", db.keyName(k), ErrFailed)
		}
		return r, false, nil
	}
	r, err = l.run(ctx, fn)
	return r, true, err
}

// KeepAlive renews the lease in the background, every third of its TTL,
// until stop is called (stop waits for the renewer to end). Use it with
// Claim when the effect may take longer than the lease; Do and Lease.Run do
// it for you (and, unlike KeepAlive, go on renewing while Close waits).
// If the lease is lost (another caller took the key over) or the store is
// closed, KeepAlive calls cancel with that error, so the effect's context
// ends, and stops. Other renewal errors are logged and retried.
func (l *Lease) KeepAlive(cancel context.CancelCauseFunc) (stop func()) {
	return l.keepAlive(cancel, true).stop
}

// keepAlive starts l's renewals, through Renew if gated (under Close's
// in-flight gate, as KeepAlive does) or through renew (not gated: Run's,
// which Close waits for). Stop them with the keeper's stop.
func (l *Lease) keepAlive(cancel context.CancelCauseFunc, gated bool) *keeper {
	return l.keepAliveWith(cancel, gated, nil)
}

// keepAliveWith is keepAlive renewing with renew instead, if not nil (tests).
func (l *Lease) keepAliveWith(cancel context.CancelCauseFunc, gated bool, renew func(context.Context) error) *keeper {
	k := &keeper{l: l, cancel: cancel, gated: gated, renew: renew, every: max(l.ttl/3, time.Millisecond)}
	k.mu.Lock()
	k.t = time.AfterFunc(k.every, k.tick)
	k.mu.Unlock()
	return k
}

// runKeeper is keepAlive(cancel, false) for run, from keepers: a keeper
// whose timer never fired is used again, so that a Do costs no allocation
// for its renewals. Give it back with recycle once stopped, and never use it
// after.
func (l *Lease) runKeeper(cancel context.CancelCauseFunc) *keeper {
	k, _ := keepers.Get().(*keeper)
	if k == nil {
		return l.keepAlive(cancel, false)
	}
	k.mu.Lock()
	k.l, k.cancel, k.every = l, cancel, max(l.ttl/3, time.Millisecond)
	k.stopped, k.idle = false, false
	k.t.Reset(k.every)
	k.mu.Unlock()
	return k
}

// keepers holds keepers that recycle gave back: stopped before their timer
// fired, so that no tick of theirs is under way or to come.
var keepers sync.Pool

// recycle gives k back to keepers, if its timer never fired (idle): then
// nothing else refers to it. It is run's own (runKeeper), which calls stop
// once, then recycle.
func (k *keeper) recycle() {
	k.mu.Lock()
	idle := k.idle && !k.gated && k.renew == nil && !k.running && k.done == nil
	k.l, k.cancel = nil, nil
	k.mu.Unlock()
	if idle {
		keepers.Put(k)
	}
}

// keeper renews a lease from a timer, not a goroutine of its own: a Do
// whose effect ends within a third of the TTL (most) costs one timer,
// started and stopped, and no goroutine.
type keeper struct {
	l      *Lease
	cancel context.CancelCauseFunc
	gated  bool                        // renew with Renew, not renew
	renew  func(context.Context) error // if not nil, renews instead (tests)
	every  time.Duration

	mu      sync.Mutex
	t       *time.Timer
	stopped bool          // stop was called: no renewal starts after
	idle    bool          // stop stopped the timer before it fired, with no tick under way: none is to come
	running bool          // a renewal is under way
	done    chan struct{} // closed when the renewal under way ends (made by stop)
}

// tick renews the lease and sets the timer for the next renewal, unless
// the lease is lost, the store closed, or stop called meanwhile.
func (k *keeper) tick() {
	k.mu.Lock()
	if k.stopped {
		k.mu.Unlock()
		return
	}
	k.running = true
	k.mu.Unlock()

	var err error
	switch {
	case k.renew != nil:
		err = k.renew(context.Background())
	case k.gated:
		err = k.l.Renew(context.Background())
	default:
		err = k.l.renew(context.Background())
	}
	over := false
	switch {
	case errors.Is(err, ErrLeaseLost), errors.Is(err, ErrClosed):
		k.cancel(err)
		over = true
	case err != nil:
		k.l.db.opts.Logger.Warn("receipts: renew lease", k.l.db.LogKey(k.l.key), "err", err)
	}

	k.mu.Lock()
	k.running = false
	if k.done != nil {
		close(k.done)
	} else if !over && !k.stopped {
		k.t.Reset(k.every)
	}
	k.mu.Unlock()
}

// stop ends the renewals, and waits for one under way. It may be called
// more than once.
func (k *keeper) stop() {
	k.mu.Lock()
	if k.stopped {
		d := k.done
		k.mu.Unlock()
		if d != nil {
			<-d
		}
		return
	}
	k.stopped = true
	k.idle = k.t.Stop() && !k.running
	if k.running {
		k.done = make(chan struct{})
	}
	d := k.done
	k.mu.Unlock()
	if d != nil {
		<-d
	}
}
