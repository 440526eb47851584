package receipts

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/observe"
)

// tracing reports whether events are to be built for a call with ctx: an
// observer is set, or the logger takes debug records (claims and replays are
// logged at Debug).
func (db *DB) tracing(ctx context.Context) bool {
	return db.opts.Observer != nil || db.opts.Logger.Enabled(ctx, slog.LevelDebug)
}

// event makes *e an Event of kind on k for this store. Events are built in
// place and handed on by pointer up to the observer's call: an Event is
// about 200 bytes, and copying it on each of the four calls it went through
// was 71 of the 1,030 instructions a Prometheus observer added to a replay
// from memory (docs/performance.md, "Observers that sample nothing").
func (db *DB) event(e *observe.Event, kind observe.EventKind, k Key, class string, start time.Time) {
	*e = observe.NewEvent(kind, db.hashKey, k.Scope, k.ID)
	e.Engine, e.Class, e.Start, e.Duration = db.engName, class, start, time.Since(start)
}

// emit hands e to the observer and logs it.
func (db *DB) emit(ctx context.Context, e *observe.Event, k Key) {
	if db.opts.Observer != nil {
		db.opts.Observer.Observe(ctx, *e)
	}
	if e.Kind != observe.DoEvent { // a Do's claim and finish are logged already
		db.logEvent(ctx, e, k)
	}
}

// eventLevel is the slog level an event is logged at: Info for the
// transitions an operator wants to see (a takeover, an abandoned claim, a
// lost lease, a retry of an expired key (a tombstone hit), a GC that failed or dropped
// something), Debug for the rest.
func eventLevel(e *observe.Event) slog.Level {
	switch e.Outcome {
	case observe.OutcomeTookOver, observe.OutcomeAbandoned, observe.OutcomeLeaseLost, observe.OutcomeExpired:
		return slog.LevelInfo
	case observe.OutcomeError:
		if e.Kind == observe.GCEvent {
			return slog.LevelWarn
		}
	}
	if e.Kind == observe.GCEvent && e.EpochsDropped > 0 {
		return slog.LevelInfo
	}
	return slog.LevelDebug
}

// logEvent writes e to Options.Logger, if it takes e's level. The key is
// logged as its hash ("key_hash") unless Options.LogKeys is set.
func (db *DB) logEvent(ctx context.Context, e *observe.Event, k Key) {
	lvl := eventLevel(e)
	lg := db.opts.Logger
	if !lg.Enabled(ctx, lvl) {
		return
	}
	attrs := make([]slog.Attr, 0, 8)
	attrs = append(attrs, slog.String("outcome", string(e.Outcome)))
	if e.Kind != observe.GCEvent {
		if db.opts.LogKeys {
			attrs = append(attrs, slog.String("scope", k.Scope), slog.String("id", k.ID))
		} else {
			attrs = append(attrs, slog.String("key_hash", e.KeyHash()))
		}
	}
	if e.Class != "" {
		attrs = append(attrs, slog.String("class", e.Class))
	}
	if e.Attempt != 0 {
		attrs = append(attrs, slog.Int("attempt", int(e.Attempt)), slog.Bool("recovered", e.Recovered))
	}
	attrs = append(attrs, slog.Duration("duration", e.Duration))
	switch e.Kind {
	case observe.FinishEvent:
		attrs = append(attrs, slog.Duration("held", e.Held))
	case observe.GCEvent:
		attrs = append(attrs, slog.Int("epochs_dropped", e.EpochsDropped), slog.Uint64("bytes_freed", e.BytesFreed))
	}
	lg.LogAttrs(ctx, lvl, "receipts: "+e.Kind.String(), attrs...)
}

// claimOutcome classifies what a claim returned.
func claimOutcome(l *Lease, r *Receipt, err error) observe.Outcome {
	switch {
	case l != nil:
		if l.recovered {
			return observe.OutcomeTookOver
		}
		return observe.OutcomeClaimed
	case r != nil:
		return observe.OutcomeReplayed
	case errors.Is(err, ErrIntentMismatch):
		return observe.OutcomeMismatch
	case errors.Is(err, ErrExpired):
		return observe.OutcomeExpired
	case errors.Is(err, ErrInProgress):
		var ip *InProgressError
		if errors.As(err, &ip) && ip.cause != nil {
			return observe.OutcomeCanceled
		}
		return observe.OutcomeInProgress
	case errors.Is(err, ErrClosed):
		return observe.OutcomeClosed
	case errors.Is(err, ErrLeaseLost): // DB.TakeOver: the listed attempt is gone
		return observe.OutcomeLeaseLost
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return observe.OutcomeCanceled
	}
	return observe.OutcomeError
}

// claimTrace is what the claim loop tells the observer about waiting.
type claimTrace struct {
	waited    bool
	waitStart time.Time
	trace     []byte // a replay's: the trace context stored with the receipt (observeClaim replaces it by the event's copy)
}

// withTrace returns ctx carrying the trace context the store's observer
// wants stored with the receipt a finish of it writes (driver.WithTrace).
func (db *DB) withTrace(ctx context.Context) context.Context {
	if tr, ok := db.opts.Observer.(observe.TraceRecorder); ok {
		return driver.WithTrace(ctx, tr.TraceContext(ctx))
	}
	return ctx
}

// observeClaim reports a claim (and its wait, if it waited) that began at
// start.
func (db *DB) observeClaim(ctx context.Context, k Key, start time.Time, tr *claimTrace, l *Lease, r *Receipt, err error) {
	class := observe.OperationClass(ctx)
	out := claimOutcome(l, r, err)
	if tr.waited {
		var w observe.Event
		db.event(&w, observe.WaitEvent, k, class, tr.waitStart)
		w.Outcome = out
		if out == observe.OutcomeInProgress && ctx.Err() != nil {
			w.Outcome = observe.OutcomeCanceled
		}
		db.emit(ctx, &w, k)
	}
	var e observe.Event
	db.event(&e, observe.ClaimEvent, k, class, start)
	e.Outcome = out
	switch {
	case l != nil:
		l.class = class
		e.Attempt, e.Recovered = l.attempt, l.recovered
	case r != nil:
		e.Attempt, e.Recovered = r.Attempts, r.Attempts > 1
		if tr.trace != nil {
			e.Trace = bytes.Clone(tr.trace)
			tr.trace = e.Trace // for the Do's event (claimConfig.traceOut)
		}
	}
	db.emit(ctx, &e, k)
}

// observeFinish reports the end of l's attempt with out, its write having
// begun at start (zero: not timed).
func (l *Lease) observeFinish(ctx context.Context, out observe.Outcome, start time.Time) {
	db := l.db
	if out == observe.OutcomeLeaseLost && !l.lostOnce.CompareAndSwap(false, true) {
		return // reported once per lease
	}
	if !db.tracing(ctx) && !(out == observe.OutcomeAbandoned || out == observe.OutcomeLeaseLost) {
		return
	}
	if start.IsZero() {
		start = monoNow()
	}
	var e observe.Event
	db.event(&e, observe.FinishEvent, l.key, l.class, start)
	e.Outcome = out
	e.Attempt, e.Recovered = l.attempt, l.recovered
	e.Held = db.clock().Sub(l.claimedAt)
	db.emit(ctx, &e, l.key)
}

// monoBase anchors monoNow.
var monoBase = time.Now()

// monoNow is the start time of an observed transition: monoBase advanced by
// the monotonic clock. It reads only the monotonic clock, which costs a
// fraction of time.Now's two clock reads (on virtual machines without a
// fast wall-clock source, time.Now alone was about 90 ns, 5% of a replay
// from memory). Its wall time can differ from time.Now's by the steps the
// system clock took since the process started; durations are exact.
func monoNow() time.Time { return monoBase.Add(time.Since(monoBase)) }

// traceStart is the start time of a write to be observed: now when tracing,
// zero otherwise.
func (db *DB) traceStart(ctx context.Context) time.Time {
	if db.tracing(ctx) {
		return monoNow()
	}
	return time.Time{}
}

// observeWrite reports a release, forget or abandon of l that began at
// start and returned err: out if it was written, OutcomeLeaseLost if the
// lease was lost; a write that failed otherwise is no transition.
func (l *Lease) observeWrite(ctx context.Context, out observe.Outcome, start time.Time, err error) {
	switch {
	case err == nil:
		l.observeFinish(ctx, out, start)
	case errors.Is(err, ErrLeaseLost):
		l.observeFinish(ctx, observe.OutcomeLeaseLost, start)
	}
}

// observeGC reports a GC run.
func (db *DB) observeGC(ctx context.Context, st *GCStats, err error) {
	if db.opts.Observer == nil && !db.opts.Logger.Enabled(ctx, slog.LevelDebug) && err == nil && st.EpochsDropped == 0 {
		return
	}
	e := observe.Event{Kind: observe.GCEvent, Outcome: observe.OutcomeOK, Engine: db.eng.Name(), Start: time.Now().Add(-st.Duration), Duration: st.Duration,
		EpochsDropped: st.EpochsDropped, BytesFreed: st.BytesFreed}
	if err != nil {
		e.Outcome = observe.OutcomeError
	}
	db.emit(ctx, &e, Key{})
}

// logTakeover logs, at Info, a takeover made while nothing was traced.
func (db *DB) logTakeover(ctx context.Context, l *Lease) {
	if !db.opts.Logger.Enabled(ctx, slog.LevelInfo) {
		return
	}
	e := observe.NewEvent(observe.ClaimEvent, db.hashKey, l.key.Scope, l.key.ID)
	e.Outcome, e.Engine, e.Class, e.Attempt, e.Recovered = observe.OutcomeTookOver, db.eng.Name(), observe.OperationClass(ctx), l.attempt, l.recovered
	db.logEvent(ctx, &e, l.key)
}

// begin lets the observer, if it is a Beginner, see an operation of kind
// begin, and returns the context the operation runs with.
func (db *DB) begin(ctx context.Context, kind observe.EventKind) context.Context {
	if db.beginner != nil {
		return db.beginner.Begin(ctx, kind)
	}
	return ctx
}

// observeDo reports a Do that began at start and returned r, err.
// ran says whether an attempt ran.
func (db *DB) observeDo(ctx context.Context, k Key, start time.Time, r *Receipt, err error, ran bool, trace []byte) {
	var e observe.Event
	db.event(&e, observe.DoEvent, k, observe.OperationClass(ctx), start)
	switch {
	case !ran && r != nil:
		e.Outcome = observe.OutcomeReplayed
	case !ran:
		e.Outcome = claimOutcome(nil, nil, err)
	case err == nil:
		e.Outcome = observe.OutcomeSucceeded
	case errors.Is(err, ErrOutcomeUnknown):
		e.Outcome = observe.OutcomeAbandoned
	case errors.Is(err, ErrFailed):
		e.Outcome = observe.OutcomeFailed
	default: // not performed: released (or the release failed, and it stays pending)
		e.Outcome = observe.OutcomeReleased
	}
	if r != nil {
		e.Attempt, e.Recovered = r.Attempts, r.Attempts > 1
		if !ran {
			e.Trace = trace
		}
	}
	db.emit(ctx, &e, k)
}
