package receipts

import (
	"context"
	"errors"
	"fmt"

	"github.com/receiptstore/receipts/internal/detach"
	"github.com/receiptstore/receipts/internal/mutate"
)

// Run executes fn under l and records its outcome the way Do does: it is
// the one place where "run the work under a lease, renew it, record what
// happened" is written, and Do, the engines' own forms (pebblestore.DoBatch
// and RunBatch) and the HTTP and MCP front ends all go through it.
//
// While fn runs, the lease is renewed in the background (every third of
// its TTL: LeaseFor's length, or Options.LeaseTTL); if it is lost (another caller took the key over), fn's context
// is cancelled with ErrLeaseLost as its cause. Once fn has returned, its
// outcome is recorded on a context detached from ctx, so a caller that goes
// away right after the effect never loses its receipt. fn's error decides
// what is recorded, exactly as for Do:
//   - nil: the result is committed as a Succeeded receipt, returned with a
//     nil error.
//   - NotPerformed(err): the claim is released; Run returns an error
//     wrapping err.
//   - Permanent(err): a Failed receipt is stored (its result is what fn
//     returned, or err's text) and returned with an error wrapping ErrFailed
//     and err.
//   - any other error, or a panic: the claim is abandoned at once and the
//     next attempt gets Recovered() == true. Run returns an error wrapping
//     ErrOutcomeUnknown and fn's error (a panic is re-raised).
//
// A result larger than MaxResultSize cannot be recorded, and neither can a
// result whose commit fails: the effect may have happened, so the claim is
// abandoned and Run returns an error wrapping ErrOutcomeUnknown (not
// ErrResultTooLarge: the caller's input was not at fault).
//
// Close waits for a Run in progress, including the recording of its
// outcome, and renewal goes on meanwhile. A lease that is not in Run does
// not hold Close up: Run (or Commit, Fail, Release, Abandon) called once
// Close has begun returns ErrClosed without calling fn, and the claim stays
// Pending until its lease runs out. Call Run right after Claim.
func (l *Lease) Run(ctx context.Context, fn func(ctx context.Context, l *Lease) ([]byte, error)) (*Receipt, error) {
	if err := l.db.enter(); err != nil {
		return nil, err
	}
	defer l.db.exit()
	return l.run(ctx, fn)
}

// run is Run without the in-flight gate, which the caller holds.
func (l *Lease) run(ctx context.Context, fn func(ctx context.Context, l *Lease) ([]byte, error)) (*Receipt, error) {
	db := l.db
	detached := detach.Context(ctx)
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// Renewals bypass the gate: they go on while Close waits for this Run.
	keep := l.runKeeper(cancel)

	finished := false
	defer func() {
		if !finished { // fn or a staged effect panicked (or called runtime.Goexit)
			keep.stop()
			_ = l.abandonUnknown(detached)
		}
	}()
	result, ferr := fn(fctx, l)
	keep.stop()

	o := l.conclude(detached, result, ferr, l.release) // runs the staged effects
	finished = true
	keep.recycle()
	switch o.verdict {
	case verdictCommit:
		if o.err != nil {
			return nil, l.outcomeUnknown("recording it failed", ferr, o.err)
		}
		return o.receipt, nil
	case verdictFail:
		if o.err != nil {
			return nil, l.outcomeUnknown("recording it failed", ferr, o.err)
		}
		return o.receipt, fmt.Errorf("receipts: %s: %w: %w", db.keyName(l.key), ErrFailed, ferr)
	case verdictRelease:
		if o.err != nil {
			return nil, fmt.Errorf("receipts: %s not performed (%w), and release failed: %w", db.keyName(l.key), ferr, o.err)
		}
		return nil, fmt.Errorf("receipts: %s not performed: %w", db.keyName(l.key), ferr)
	}
	return nil, l.outcomeUnknown(o.why, ferr, o.err)
}

// verdict is what the contract makes of fn's result and error.
type verdict uint8

const (
	verdictCommit  verdict = iota + 1 // nil: a Succeeded receipt
	verdictFail                       // Permanent: a Failed receipt
	verdictRelease                    // NotPerformed: nothing happened, the key is free
	verdictUnknown                    // any other error, a panic, or an outcome that cannot be recorded: abandoned
)

// verdictOf reads fn's error by the contract's rules.
func verdictOf(ferr error) verdict {
	if ferr == nil {
		return verdictCommit
	}
	switch kind, _ := outcomeOf(ferr); kind {
	case kindPermanent:
		return verdictFail
	case kindNotPerformed:
		return verdictRelease
	}
	if mutate.Name == mutate.UnknownFree {
		return verdictRelease
	}
	return verdictUnknown
}

// outcome is what conclude recorded.
type outcome struct {
	verdict verdict
	receipt *Receipt // verdictCommit and verdictFail, once recorded
	// why says, for verdictUnknown, why a result was not recorded ("" when
	// fn's error made the outcome unknown).
	why string
	// err is the failure to record the verdict (for a commit or failure
	// that did not happen, together with abandoning the claim after it).
	err error
}

// conclude records what fn's result and error say about l's attempt, on
// ctx (detached from the caller's): the contract's outcome protocol,
// written once for Do, Run (and the engine packages' forms built on it),
// the front ends, pgstore.DoTx (whose engine records it in the claim's
// transaction) and the Reconciler.
//   - nil: result is committed as a Succeeded receipt, with the staged
//     effects (and an engine's unit of work carried by ctx: pebblestore);
//   - Permanent: a Failed receipt (result, or the error's text);
//   - NotPerformed: free (Release; the Reconciler's Forget);
//   - anything else: the claim is abandoned, and the next attempt is
//     Recovered.
//
// A result that cannot be recorded (larger than MaxResultSize, or a commit
// that fails) also abandons the claim: the effect may have happened.
func (l *Lease) conclude(ctx context.Context, result []byte, ferr error, free func(context.Context) error) outcome {
	o := outcome{verdict: verdictOf(ferr)}
	switch o.verdict {
	case verdictCommit, verdictFail:
		state := Succeeded
		if o.verdict == verdictFail {
			state = Failed
			if result == nil {
				result = []byte(ferr.Error())
			}
		}
		if len(result) > MaxResultSize {
			o.verdict, o.err = verdictUnknown, l.abandonUnknown(ctx)
			o.why = fmt.Sprintf("a result of %d bytes exceeds MaxResultSize (%d) and cannot be recorded; the claim is abandoned",
				len(result), MaxResultSize)
			return o
		}
		var err error
		if o.receipt, err = l.settle(ctx, state, result); err != nil {
			o.err = l.db.afterFinishError(ctx, l, err)
		}
	case verdictRelease:
		if o.err = free(ctx); o.err != nil {
			l.settleFailed("release", o.err)
		}
	default:
		o.err = l.abandonUnknown(ctx)
	}
	return o
}

// outcomeUnknown is the error Run returns when the effect may have happened
// but no outcome is recorded: it wraps ErrOutcomeUnknown, names the key
// (DB.keyName),
// says why, and wraps every non-nil cause.
func (l *Lease) outcomeUnknown(why string, causes ...error) error {
	format, args := "%w: %s", []any{ErrOutcomeUnknown, l.db.keyName(l.key)}
	if why != "" {
		format, args = format+": %s", append(args, why)
	}
	for _, c := range causes {
		if c != nil {
			format, args = format+": %w", append(args, c)
		}
	}
	return fmt.Errorf(format, args...)
}

// abandonUnknown abandons l after an outcome that cannot be recorded and
// returns what to add to the error: nil if the claim is abandoned, an error
// wrapping ErrLeaseLost if another caller took the key over (its holder
// reconciles), or the failure to abandon (logged).
func (l *Lease) abandonUnknown(ctx context.Context) error {
	if l.abandoned.Load() { // already, by a step whose outcome is unknown
		return nil
	}
	err := l.abandon(ctx)
	switch {
	case err == nil:
		l.abandoned.Store(true)
		return nil
	case errors.Is(err, ErrLeaseLost):
		return err
	}
	l.settleFailed("abandon", err)
	return fmt.Errorf("abandoning the claim failed: %w", err)
}

// settleFailed logs a claim that could not be settled: it stays Pending
// until its lease runs out.
func (l *Lease) settleFailed(what string, err error) {
	if err != nil && !errors.Is(err, ErrLeaseLost) {
		l.db.opts.Logger.Warn("receipts: "+what+" failed; the claim stays pending until its lease runs out", l.db.LogKey(l.key), "err", err)
	}
}

// afterFinishError handles a commit that did not happen: unless the lease is
// already lost, the claim is abandoned, since the effect may have happened.
func (db *DB) afterFinishError(ctx context.Context, l *Lease, err error) error {
	if errors.Is(err, ErrLeaseLost) {
		return err
	}
	if aerr := l.abandonUnknown(ctx); aerr != nil {
		return fmt.Errorf("%w (%w)", err, aerr)
	}
	return err
}
