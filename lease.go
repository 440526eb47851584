package receipts

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/internal/keys"
	"github.com/receiptstore/receipts/observe"
)

// Lease is the right to execute one operation, held by one caller. It is
// fenced by a token: once another caller takes the key over, every method
// returns ErrLeaseLost and writes nothing. A Lease is safe for concurrent
// use (KeepAlive renews while the caller commits): the engine serializes its
// writes by key.
type Lease struct {
	db        *DB
	key       Key
	skey      driver.Key // key as the engine stores it (Options.HashKeys: privacy.go)
	token     uint64
	attempt   uint32
	recovered bool
	ttl       time.Duration // the lease length: LeaseFor's, or Options.LeaseTTL
	claimedAt time.Time     // DB.clock at the claim, for the attempt-duration estimate
	class     string        // the claim's operation class (WithOperationClass), for the observer and the RetryAfter estimates
	lostOnce  atomic.Bool
	// effectEnded: a staged effect ended the engine's unit of work itself (driver.ErrEffectEnded):
	// its writes may be durable, so the claim is abandoned and never released (release).
	effectEnded atomic.Bool

	mu     sync.Mutex // protects staged
	staged []Effect   // Stage's effects, committed with a Succeeded receipt

	steps leaseSteps // the key's step journal (steps.go)
	// stepUnknown: a step's outcome is unknown (steps.go): the claim is abandoned and never
	// released, as for effectEnded.
	stepUnknown atomic.Bool
	// abandoned: abandonUnknown abandoned the claim, so a second outcome that cannot be
	// recorded (a step's, then the action's) does not abandon, count and report it again.
	abandoned atomic.Bool
}

// Key returns the operation's key.
func (l *Lease) Key() Key { return l.key }

// Token returns the lease's fencing token: unique store-wide, larger than
// every token handed out before it.
func (l *Lease) Token() uint64 { return l.token }

// Attempt returns 1 for the first claim of a key, plus one per takeover.
func (l *Lease) Attempt() uint32 { return l.attempt }

// TTL returns the lease's length: what LeaseFor gave the claim, or
// Options.LeaseTTL. Renew extends the lease to now + TTL.
func (l *Lease) TTL() time.Duration { return l.ttl }

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
func (l *Lease) ProviderKey() string { return l.db.providerKey(l.key) }

// ProviderKey returns the key Lease.ProviderKey returns for k's attempts:
// what an operator or a reconciler asks the external provider about when
// it settles an abandoned claim (Scan with Filter{Abandoned: true}) without
// holding its lease. It does no I/O. After Close it still answers.
func (db *DB) ProviderKey(k Key) string { return db.providerKey(k) }

func (db *DB) providerKey(k Key) string {
	if sk, err := db.storedKey(k); err == nil { // Options.HashKeys: the same for a listed key
		k = Key(sk)
	}
	var sum [sha256.Size]byte
	return "rk_" + base64.RawURLEncoding.EncodeToString(keys.MAC(sum[:0], db.secret, k.Scope, k.ID))
}

// info is what identifies l to its engine.
func (l *Lease) info() driver.LeaseInfo {
	li := driver.LeaseInfo{Key: l.skey, Token: l.token, Attempts: l.attempt, Recovered: l.recovered}
	if l.db.seal.Enabled() {
		li.Seal = l.sealResult
	}
	return li
}

// Renew extends the lease to now + TTL (LeaseFor's length, or
// Options.LeaseTTL); it never shortens it. Do renews in the background;
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
	if err := ctx.Err(); err != nil {
		return err
	}
	_, err := l.db.eng.Renew(ctx, l.skey, l.token, l.ttl)
	if errors.Is(err, ErrLeaseLost) {
		l.observeFinish(ctx, observe.OutcomeLeaseLost, time.Time{})
	}
	return err
}

// Commit records the operation as Succeeded with result, synced before it
// returns. Every later Claim, Do or Lookup of the key gets this receipt.
func (l *Lease) Commit(ctx context.Context, result []byte) (*Receipt, error) {
	return l.finish(ctx, Succeeded, result)
}

// Fail records a definitive failure with result (for example the provider's
// error), replayed to later callers like a success. Use Release instead if
// nothing happened and the operation may be tried again.
func (l *Lease) Fail(ctx context.Context, result []byte) (*Receipt, error) {
	return l.finish(ctx, Failed, result)
}

// finish is Commit and Fail: one gated call.
func (l *Lease) finish(ctx context.Context, state State, result []byte) (*Receipt, error) {
	if err := l.db.enter(); err != nil {
		return nil, err
	}
	defer l.db.exit()
	r, err := l.settle(ctx, state, result)
	if errors.Is(err, driver.ErrEffectEnded) { // the effect may have written without the receipt
		if aerr := l.abandonUnknown(ctx); aerr != nil {
			return nil, fmt.Errorf("%w: %w (%w)", ErrOutcomeUnknown, err, aerr)
		}
		return nil, fmt.Errorf("%w: %w; the claim is abandoned", ErrOutcomeUnknown, err)
	}
	return r, err
}

// settle records state and result. A Succeeded receipt commits with the
// staged effects (Stage) in the engine's unit of atomic work
// (driver.Effects); an engine package's own unit of work for the lease
// travels in ctx, which the engine reads (pebblestore's batch).
func (l *Lease) settle(ctx context.Context, state State, result []byte) (*Receipt, error) {
	if l.stepUnknown.Load() { // a step's effect may have happened: the next attempt runs it, Recovered
		return nil, fmt.Errorf("%w: %s: a step's outcome is unknown, so the action cannot be recorded; the claim is abandoned", ErrOutcomeUnknown, l.db.keyName(l.key))
	}
	if err := validateResult(result); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// The receipt to return, with the result's copy beside it (one
	// allocation): the copy is what the engine records, and it is never
	// nil, so neither is a committed result, first time or replayed.
	rc, room := newReceiptRoom(len(result))
	copy(room, result)
	result = room
	var effect Effect
	if state == Succeeded { // a Failed receipt is written without the effects
		effect = l.stagedEffect()
	}
	stored, err := l.sealResult(ctx, driver.State(state), result)
	if err != nil {
		return nil, err
	}
	var rec driver.Record
	start := l.db.traceStart(ctx)
	ctx = l.db.withTrace(ctx)
	k := l.skey
	switch fx, ok := l.db.eng.(driver.Effects); {
	case effect == nil:
		rec, err = l.db.eng.Finish(ctx, k, l.token, driver.State(state), stored)
	case ok:
		rec, err = fx.FinishWith(ctx, k, l.token, driver.State(state), stored, effect)
	default:
		err = fmt.Errorf("%w: effects that commit with the receipt on the %s engine", ErrUnsupported, l.db.eng.Name())
	}
	rec.Result = result // the plaintext (stored may be its envelope)
	if errors.Is(err, driver.ErrEffectEnded) {
		l.effectEnded.Store(true)
	}
	if err != nil {
		if errors.Is(err, ErrLeaseLost) {
			l.observeFinish(ctx, observe.OutcomeLeaseLost, start)
		}
		return nil, err
	}
	l.clearStaged()
	r := l.db.finishedInto(l, &rec, rc)
	out := observe.OutcomeSucceeded
	if rec.State == driver.Failed {
		out = observe.OutcomeFailed
	}
	l.observeFinish(ctx, out, start)
	return r, nil
}

// finished counts l's finished record and returns its receipt.
func (db *DB) finished(l *Lease, rec *driver.Record) *Receipt {
	return db.finishedInto(l, rec, new(Receipt))
}

// finishedInto is finished, the receipt written into rc.
func (db *DB) finishedInto(l *Lease, rec *driver.Record, rc *Receipt) *Receipt {
	db.settled(l)
	if rec.State == driver.Succeeded {
		db.hot.Commits.Add(1)
	} else {
		db.n.fails.Add(1)
	}
	r := fillReceipt(rc, rec)
	r.Key = l.key // the caller's (the record's is the stored key: Options.HashKeys)
	return r
}

// Raw runs fn, an engine package's own way of finishing l (pgstore.CommitTx
// records the receipt in the caller's pgx.Tx), with the store's engine and
// what identifies l to it, under the store's in-flight gate (Close waits
// for it). If fn returns a record, it is the finished record as written:
// Raw counts the commit or failure and returns its receipt. If fn returns
// none (a fence check), Raw returns nil. Like database/sql's Conn.Raw, it
// is for engine packages; applications call Commit or Fail.
func (l *Lease) Raw(ctx context.Context, fn func(ctx context.Context, e driver.Engine, li driver.LeaseInfo) (*driver.Record, error)) (*Receipt, error) {
	if err := l.db.enter(); err != nil {
		return nil, err
	}
	defer l.db.exit()
	start := l.db.traceStart(ctx)
	rec, err := fn(l.db.withTrace(ctx), l.db.eng, l.info())
	if errors.Is(err, ErrLeaseLost) {
		l.observeFinish(ctx, observe.OutcomeLeaseLost, start)
	}
	if err != nil || rec == nil {
		return nil, err
	}
	if err := l.db.seal.Open(ctx, rec); err != nil { // the result as recorded, in the clear
		return nil, err
	}
	r := l.db.finished(l, rec)
	out := observe.OutcomeSucceeded
	if rec.State == driver.Failed {
		out = observe.OutcomeFailed
	}
	l.observeFinish(ctx, out, start)
	return r, nil
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
	if err := l.unreleasable(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	start := l.db.traceStart(ctx)
	// A claim with a step journal is kept too: its recorded steps happened.
	n, _ := l.journalSteps()
	err := l.db.eng.Release(ctx, l.skey, l.token, l.recovered || n > 0)
	if err == nil {
		l.db.settled(l)
		l.db.n.releases.Add(1)
	}
	l.observeWrite(ctx, observe.OutcomeReleased, start, err)
	return err
}

// unreleasable refuses Release and Forget of a lease whose staged effect ended the unit of
// work itself: what it wrote may be durable, so freeing the key could run it twice.
func (l *Lease) unreleasable() error {
	if l.stepUnknown.Load() {
		return fmt.Errorf("%w: %s: a step's outcome is unknown, so the claim stays abandoned (the next attempt runs it again, Recovered)",
			ErrOutcomeUnknown, l.db.keyName(l.key))
	}
	if !l.effectEnded.Load() {
		return nil
	}
	return fmt.Errorf("%w: %s: a staged effect ended the unit of work itself, so the claim stays abandoned (the next attempt is Recovered and reconciles): %w",
		ErrOutcomeUnknown, l.db.keyName(l.key), driver.ErrEffectEnded)
}

// Forget gives the key up for good: the caller has checked with the
// provider (by ProviderKey) that no attempt's effect happened, neither this
// one's nor, on a Recovered lease, any earlier one's. The record is deleted
// and the next Claim starts afresh (Attempt 1, not Recovered). On a lease
// that is not Recovered it is Release. Fenced like Release: once another
// caller took the key over it returns ErrLeaseLost and deletes nothing. A
// claim whose action recorded a finished step (Lease.Step) happened in part:
// Forget refuses it with ErrInvalidArgument and changes nothing.
func (l *Lease) Forget(ctx context.Context) error {
	if err := l.db.enter(); err != nil {
		return err
	}
	defer l.db.exit()
	return l.forget(ctx)
}

func (l *Lease) forget(ctx context.Context) error {
	if err := l.unreleasable(); err != nil {
		return err
	}
	if _, n := l.journalSteps(); n > 0 { // they happened: forgetting them would run them again
		return fmt.Errorf("%w: %s: %d steps of this action are recorded, so it happened in part and cannot be forgotten: settle its uncertain step (SettleStep), release the claim to resume it, or record the action's outcome",
			ErrInvalidArgument, l.db.keyName(l.key), n)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	start := l.db.traceStart(ctx)
	err := l.db.eng.Forget(ctx, l.skey, l.token)
	if err == nil {
		l.db.settled(l)
		l.db.n.releases.Add(1)
	}
	l.observeWrite(ctx, observe.OutcomeReleased, start, err)
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
	if err := ctx.Err(); err != nil {
		return err
	}
	start := l.db.traceStart(ctx)
	err := l.db.eng.Abandon(ctx, l.skey, l.token)
	if err == nil {
		l.db.settled(l)
		l.db.n.abandons.Add(1)
	}
	l.observeWrite(ctx, observe.OutcomeAbandoned, start, err)
	return err
}
