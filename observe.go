package receipts

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/internal/keys"
)

// Observer receives one call per transition of the store: a claim's
// outcome, a wait for another caller's attempt, the finish of an attempt,
// and each garbage collection. Set it in Options.Observer; package
// receiptsprom adapts it to Prometheus and package receiptsotel to
// OpenTelemetry. With no observer set, no event is built and the only cost
// is a nil check.
//
// Observe is called synchronously, on the goroutine that made the
// transition, after the transition happened (a write is durable by then).
// It must return quickly, must not block and must not call the DB. ctx is
// the caller's context (for a finish recorded by Do after the caller went
// away, a context detached from it: its values, such as the trace, are
// still there).
type Observer interface {
	Observe(ctx context.Context, e Event)
}

// ObserverFunc adapts a function to Observer.
type ObserverFunc func(ctx context.Context, e Event)

// Observe calls f(ctx, e).
func (f ObserverFunc) Observe(ctx context.Context, e Event) { f(ctx, e) }

// Observers returns an Observer that hands every event to each of obs in
// turn. It is a Beginner too: Begin passes the context through the Begin of
// each of obs that is one, in order. Nil entries are skipped; with none
// left it returns nil.
func Observers(obs ...Observer) Observer {
	var list multiObserver
	for _, o := range obs {
		if o != nil {
			list = append(list, o)
		}
	}
	switch len(list) {
	case 0:
		return nil
	case 1:
		return list[0]
	}
	return list
}

type multiObserver []Observer

func (m multiObserver) Observe(ctx context.Context, e Event) {
	for _, o := range m {
		o.Observe(ctx, e)
	}
}

// TraceContext is the first of m's TraceRecorders' (TraceRecorder).
func (m multiObserver) TraceContext(ctx context.Context) []byte {
	for _, o := range m {
		if tr, ok := o.(TraceRecorder); ok {
			if t := tr.TraceContext(ctx); len(t) > 0 {
				return t
			}
		}
	}
	return nil
}

func (m multiObserver) Begin(ctx context.Context, kind EventKind) context.Context {
	for _, o := range m {
		if b, ok := o.(Beginner); ok {
			ctx = b.Begin(ctx, kind)
		}
	}
	return ctx
}

// EventKind says what an Event reports.
type EventKind uint8

// The kinds of events.
const (
	// ClaimEvent: a call to Claim (or the claim that Do, DoBatch or a front
	// end makes) returned. Outcome is one of OutcomeClaimed,
	// OutcomeTookOver, OutcomeReplayed, OutcomeInProgress, OutcomeMismatch,
	// OutcomeExpired, OutcomeCanceled, OutcomeClosed or OutcomeError; Duration is the whole
	// call, waiting included. DB.TakeOver reports a ClaimEvent too:
	// OutcomeTookOver, OutcomeInProgress, or OutcomeLeaseLost when the
	// listed attempt is no longer there.
	ClaimEvent EventKind = iota + 1
	// WaitEvent: a claim waited for another caller's live lease (it is
	// reported before that claim's ClaimEvent). Duration is the time
	// waited; Outcome is how the wait ended: OutcomeReplayed (the receipt
	// arrived), OutcomeClaimed or OutcomeTookOver (the key was released,
	// or the lease ran out), OutcomeMismatch, OutcomeInProgress (the
	// WaitAtMost bound passed), OutcomeCanceled (the context ended),
	// OutcomeClosed (Close began) or OutcomeError.
	WaitEvent
	// FinishEvent: an attempt ended. Outcome is OutcomeSucceeded,
	// OutcomeFailed (a Failed receipt), OutcomeReleased (Release or
	// Forget), OutcomeAbandoned or OutcomeLeaseLost (a write or a renewal
	// found that another caller took the key over, or that the claim is
	// gone); Duration is that write's, and Held is the time since the
	// claim.
	FinishEvent
	// GCEvent: a garbage collection (DB.GC, background GC, or an engine's
	// purge) ran. Outcome is OutcomeOK or OutcomeError; EpochsDropped and
	// BytesFreed say what it reclaimed.
	GCEvent
	// DoEvent: a Do (or DoBatch) returned; it follows the events of its
	// claim and attempt. Outcome is OutcomeReplayed (a stored receipt,
	// Succeeded or Failed), OutcomeSucceeded, OutcomeFailed,
	// OutcomeReleased (not performed), OutcomeAbandoned (the outcome is
	// unknown: ErrOutcomeUnknown), or the claim's outcome when no attempt
	// ran (OutcomeMismatch, OutcomeInProgress, OutcomeCanceled,
	// OutcomeClosed, OutcomeError); Duration is the whole call.
	DoEvent
)

// KindFilter is implemented by observers that take only some kinds of
// events: the store does not build the others for them. ObservesKind is
// asked once per kind, at Open. (Package receiptsprom declines DoEvents,
// which repeat what a Do's claim and finish events say.)
type KindFilter interface {
	ObservesKind(kind EventKind) bool
}

// observes reports whether o takes events of kind.
func observes(o Observer, kind EventKind) bool {
	if o == nil {
		return false
	}
	if f, ok := o.(KindFilter); ok {
		return f.ObservesKind(kind)
	}
	return true
}

// ObservesKind is true if any of m takes events of kind.
func (m multiObserver) ObservesKind(kind EventKind) bool {
	for _, o := range m {
		if observes(o, kind) {
			return true
		}
	}
	return false
}

// Beginner is implemented by observers that want to see an operation
// begin, not only end (package receiptsotel starts a span there). Begin is
// called when a Do or a claim begins, with kind DoEvent or ClaimEvent; the
// context it returns is the one the operation runs with (Do hands it to
// fn) and the one its events are observed with. It must return quickly.
type Beginner interface {
	Begin(ctx context.Context, kind EventKind) context.Context
}

// String returns "claim", "wait", "finish", "gc" or "do".
func (k EventKind) String() string {
	switch k {
	case ClaimEvent:
		return "claim"
	case WaitEvent:
		return "wait"
	case FinishEvent:
		return "finish"
	case GCEvent:
		return "gc"
	case DoEvent:
		return "do"
	}
	return "unknown"
}

// Outcome is how a transition ended: a short, fixed, lower-case word, fit
// for a metric label.
type Outcome string

// The outcomes an Event reports (see EventKind for which kind uses which).
const (
	OutcomeClaimed    Outcome = "claimed"     // a new claim: the caller holds the lease
	OutcomeTookOver   Outcome = "took_over"   // a claim whose holder's lease had run out, or that was abandoned: Recovered
	OutcomeReplayed   Outcome = "replayed"    // the stored receipt was returned; nothing ran
	OutcomeInProgress Outcome = "in_progress" // another caller holds a live lease (ErrInProgress)
	OutcomeMismatch   Outcome = "mismatch"    // the key was used with another fingerprint (ErrIntentMismatch)
	OutcomeExpired    Outcome = "expired"     // the key was used and its receipt is past retention (ErrExpired: a tombstone, or KeyTime)
	OutcomeCanceled   Outcome = "canceled"    // the caller's context ended
	OutcomeClosed     Outcome = "closed"      // Close began (ErrClosed)
	OutcomeError      Outcome = "error"       // any other error (bad input, a failing engine, ...)

	OutcomeSucceeded Outcome = "succeeded"  // a Succeeded receipt was committed
	OutcomeFailed    Outcome = "failed"     // a Failed receipt was committed
	OutcomeReleased  Outcome = "released"   // the claim was released (not performed) or forgotten
	OutcomeAbandoned Outcome = "abandoned"  // the claim was abandoned: its outcome is unknown
	OutcomeLeaseLost Outcome = "lease_lost" // the lease was lost to another caller, or the claim is gone

	OutcomeOK Outcome = "ok" // a GC run that succeeded
)

// Event is one transition, as an Observer sees it. It exposes neither the
// key's scope or ID nor the fencing token: KeyHash identifies the key
// instead, and printing an Event (any fmt verb) shows only that.
type Event struct {
	Kind    EventKind
	Outcome Outcome
	// Engine is the engine's name: "pebble" or "postgres".
	Engine string
	// Class is the caller's operation class (WithOperationClass), or "".
	Class string
	// Start is when the transition began, and Duration how long it took
	// (by the process's monotonic clock: Start is the process's start time
	// advanced by it, so it can differ from the wall clock by the steps the
	// system clock took since then).
	Start    time.Time
	Duration time.Duration
	// Held (FinishEvent) is how long the attempt held its lease, from the
	// claim to this finish.
	Held time.Duration
	// Attempt and Recovered describe the attempt (ClaimEvent with a lease,
	// FinishEvent, and the stored attempt of a replay): see Lease.
	Attempt   uint32
	Recovered bool
	// EpochsDropped and BytesFreed (GCEvent): what GC reclaimed.
	EpochsDropped int
	BytesFreed    uint64
	// Trace (ClaimEvent and DoEvent of a replay): the trace context the
	// recorded execution stored with its receipt (TraceRecorder), or nil.
	Trace []byte

	// hashKey (nil for a GCEvent) and key compute KeyHash. Format keeps
	// them out of printed Events.
	hashKey []byte
	key     Key
}

// Format prints e's exported fields and its KeyHash, never its key, for
// every verb (fmt.Formatter).
func (e Event) Format(f fmt.State, verb rune) {
	fmt.Fprintf(f, "{Kind:%s Outcome:%s Engine:%s Class:%q Start:%s Duration:%s Held:%s Attempt:%d Recovered:%t EpochsDropped:%d BytesFreed:%d KeyHash:%s}",
		e.Kind, e.Outcome, e.Engine, e.Class, e.Start.Format(time.RFC3339Nano), e.Duration, e.Held, e.Attempt, e.Recovered, e.EpochsDropped, e.BytesFreed, e.KeyHash())
}

// KeyHash identifies the event's key without revealing it: the first 12
// bytes of HMAC-SHA256 under a key derived from the store's own secret, in
// hex (24 characters). It is the same for the same key on every node and
// after restarts of the same store, and differs between stores; "" for a
// GCEvent. It is computed when called.
func (e Event) KeyHash() string {
	if e.hashKey == nil {
		return ""
	}
	return keyHash(e.hashKey, e.key)
}

// keyHash is KeyHash for k under hk.
func keyHash(hk []byte, k Key) string {
	var lk [keys.MaxLockKeyLen]byte
	mac := hmac.New(sha256.New, hk)
	mac.Write(keys.AppendLockKey(lk[:0], k.Scope, k.ID))
	var sum [sha256.Size]byte
	return hex.EncodeToString(mac.Sum(sum[:0])[:12])
}

// deriveHashKey derives the key that KeyHash uses from the store's secret,
// so that a key's hash is never its ProviderKey.
func deriveHashKey(secret []byte) []byte {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte("receipts/observer-key-hash/v1"))
	return mac.Sum(nil)
}

type classKey struct{}

// WithOperationClass returns a copy of ctx that names the class of operation
// (for example "send_email" or "refund") that claims and attempts made with
// it belong to. Observers receive it as Event.Class, package receiptsprom
// uses it as a label, and InProgressError.RetryAfter is estimated from the
// attempts of the class (receiptmcp names the tool, receipthttp the route,
// unless the application named a class): keep the set of classes small and fixed, never a value
// derived from the key or the caller.
func WithOperationClass(ctx context.Context, class string) context.Context {
	return context.WithValue(ctx, classKey{}, class)
}

// OperationClass returns the operation class WithOperationClass put in ctx,
// or "".
func OperationClass(ctx context.Context) string {
	c, _ := ctx.Value(classKey{}).(string)
	return c
}

// tracing reports whether events are to be built for a call with ctx: an
// observer is set, or the logger takes debug records (claims and replays are
// logged at Debug).
func (db *DB) tracing(ctx context.Context) bool {
	return db.opts.Observer != nil || db.opts.Logger.Enabled(ctx, slog.LevelDebug)
}

// event starts an Event of kind on k for this store.
func (db *DB) event(kind EventKind, k Key, class string, start time.Time) Event {
	return Event{Kind: kind, Engine: db.engName, Class: class, Start: start, Duration: time.Since(start), hashKey: db.hashKey, key: k}
}

// emit hands e to the observer and logs it.
func (db *DB) emit(ctx context.Context, e Event) {
	if db.opts.Observer != nil {
		db.opts.Observer.Observe(ctx, e)
	}
	if e.Kind != DoEvent { // a Do's claim and finish are logged already
		db.logEvent(ctx, &e)
	}
}

// eventLevel is the slog level an event is logged at: Info for the
// transitions an operator wants to see (a takeover, an abandoned claim, a
// lost lease, a retry of an expired key (a tombstone hit), a GC that failed or dropped
// something), Debug for the rest.
func eventLevel(e *Event) slog.Level {
	switch e.Outcome {
	case OutcomeTookOver, OutcomeAbandoned, OutcomeLeaseLost, OutcomeExpired:
		return slog.LevelInfo
	case OutcomeError:
		if e.Kind == GCEvent {
			return slog.LevelWarn
		}
	}
	if e.Kind == GCEvent && e.EpochsDropped > 0 {
		return slog.LevelInfo
	}
	return slog.LevelDebug
}

// logEvent writes e to Options.Logger, if it takes e's level. The key is
// logged as its hash ("key_hash") unless Options.LogKeys is set.
func (db *DB) logEvent(ctx context.Context, e *Event) {
	lvl := eventLevel(e)
	lg := db.opts.Logger
	if !lg.Enabled(ctx, lvl) {
		return
	}
	attrs := make([]slog.Attr, 0, 8)
	attrs = append(attrs, slog.String("outcome", string(e.Outcome)))
	if e.Kind != GCEvent {
		if db.opts.LogKeys {
			attrs = append(attrs, slog.String("scope", e.key.Scope), slog.String("id", e.key.ID))
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
	case FinishEvent:
		attrs = append(attrs, slog.Duration("held", e.Held))
	case GCEvent:
		attrs = append(attrs, slog.Int("epochs_dropped", e.EpochsDropped), slog.Uint64("bytes_freed", e.BytesFreed))
	}
	lg.LogAttrs(ctx, lvl, "receipts: "+e.Kind.String(), attrs...)
}

// LogKey is the attribute that names k in a log record the way the store's
// own records do: "key_hash" with k's keyed hash (as Event.KeyHash), or,
// with Options.LogKeys, "key" with k.String(). Front ends such as
// receipthttp and receiptmcp log keys with it, so that a store that keeps
// raw keys out of its logs keeps them out of theirs too.
func (db *DB) LogKey(k Key) slog.Attr {
	if db.opts.LogKeys {
		return slog.String("key", k.String())
	}
	return slog.String("key_hash", keyHash(db.hashKey, k))
}

// KeyName is how the store names k in the text of its errors: "key#" and
// k's keyed hash (the same hex digits as Event.KeyHash and LogKey), or, with
// Options.LogKeys, k.String(). Errors end up in logs, so they name keys the
// way the logs do; packages that wrap the store (pgstore.DoTx, front ends)
// use it for theirs. A nil db names k itself.
func (db *DB) KeyName(k Key) string { return db.keyName(k) }

// keyName is KeyName.
func (db *DB) keyName(k Key) string {
	if db == nil || db.opts.LogKeys {
		return k.String()
	}
	return "key#" + keyHash(db.hashKey, k)
}

// claimOutcome classifies what a claim returned.
func claimOutcome(l *Lease, r *Receipt, err error) Outcome {
	switch {
	case l != nil:
		if l.recovered {
			return OutcomeTookOver
		}
		return OutcomeClaimed
	case r != nil:
		return OutcomeReplayed
	case errors.Is(err, ErrIntentMismatch):
		return OutcomeMismatch
	case errors.Is(err, ErrExpired):
		return OutcomeExpired
	case errors.Is(err, ErrInProgress):
		var ip *InProgressError
		if errors.As(err, &ip) && ip.cause != nil {
			return OutcomeCanceled
		}
		return OutcomeInProgress
	case errors.Is(err, ErrClosed):
		return OutcomeClosed
	case errors.Is(err, ErrLeaseLost): // DB.TakeOver: the listed attempt is gone
		return OutcomeLeaseLost
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return OutcomeCanceled
	}
	return OutcomeError
}

// claimTrace is what the claim loop tells the observer about waiting.
type claimTrace struct {
	waited    bool
	waitStart time.Time
	trace     []byte // a replay's: the trace context stored with the receipt (observeClaim replaces it by the event's copy)
}

// TraceRecorder is implemented by observers that store a trace context
// with each receipt, so that a replay can point at the execution it
// replays (package receiptsotel links the replay's span to it). When a
// lease is finished (Commit, Fail, CommitWith, Do's recording of its
// outcome, and the engine packages' own ways such as pgstore.CommitTx and
// DoTx), TraceContext is called with the finishing call's context; what it
// returns, if it is 1 to MaxTraceContext bytes, is stored with the receipt,
// on every engine, for as long as the receipt is kept. A replay's
// ClaimEvent and DoEvent carry it as Event.Trace. It must return quickly,
// and must not return secrets: it is stored in the clear.
type TraceRecorder interface {
	TraceContext(ctx context.Context) []byte
}

// MaxTraceContext bounds what TraceRecorder.TraceContext may store (a W3C
// traceparent is 55 bytes).
const MaxTraceContext = driver.MaxTrace

// withTrace returns ctx carrying the trace context the store's observer
// wants stored with the receipt a finish of it writes (driver.WithTrace).
func (db *DB) withTrace(ctx context.Context) context.Context {
	if tr, ok := db.opts.Observer.(TraceRecorder); ok {
		return driver.WithTrace(ctx, tr.TraceContext(ctx))
	}
	return ctx
}

// observeClaim reports a claim (and its wait, if it waited) that began at
// start.
func (db *DB) observeClaim(ctx context.Context, k Key, start time.Time, tr *claimTrace, l *Lease, r *Receipt, err error) {
	class := OperationClass(ctx)
	out := claimOutcome(l, r, err)
	if tr.waited {
		w := db.event(WaitEvent, k, class, tr.waitStart)
		w.Outcome = out
		if out == OutcomeInProgress && ctx.Err() != nil {
			w.Outcome = OutcomeCanceled
		}
		db.emit(ctx, w)
	}
	e := db.event(ClaimEvent, k, class, start)
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
	db.emit(ctx, e)
}

// observeFinish reports the end of l's attempt with out, its write having
// begun at start (zero: not timed).
func (l *Lease) observeFinish(ctx context.Context, out Outcome, start time.Time) {
	db := l.db
	if out == OutcomeLeaseLost && !l.lostOnce.CompareAndSwap(false, true) {
		return // reported once per lease
	}
	if !db.tracing(ctx) && !(out == OutcomeAbandoned || out == OutcomeLeaseLost) {
		return
	}
	if start.IsZero() {
		start = monoNow()
	}
	e := db.event(FinishEvent, l.key, l.class, start)
	e.Outcome = out
	e.Attempt, e.Recovered = l.attempt, l.recovered
	e.Held = db.clock().Sub(l.claimedAt)
	db.emit(ctx, e)
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
func (l *Lease) observeWrite(ctx context.Context, out Outcome, start time.Time, err error) {
	switch {
	case err == nil:
		l.observeFinish(ctx, out, start)
	case errors.Is(err, ErrLeaseLost):
		l.observeFinish(ctx, OutcomeLeaseLost, start)
	}
}

// observeGC reports a GC run.
func (db *DB) observeGC(ctx context.Context, st *GCStats, err error) {
	if db.opts.Observer == nil && !db.opts.Logger.Enabled(ctx, slog.LevelDebug) && err == nil && st.EpochsDropped == 0 {
		return
	}
	e := Event{Kind: GCEvent, Outcome: OutcomeOK, Engine: db.eng.Name(), Start: time.Now().Add(-st.Duration), Duration: st.Duration,
		EpochsDropped: st.EpochsDropped, BytesFreed: st.BytesFreed}
	if err != nil {
		e.Outcome = OutcomeError
	}
	db.emit(ctx, e)
}

// logTakeover logs, at Info, a takeover made while nothing was traced.
func (db *DB) logTakeover(ctx context.Context, l *Lease) {
	if !db.opts.Logger.Enabled(ctx, slog.LevelInfo) {
		return
	}
	e := Event{Kind: ClaimEvent, Outcome: OutcomeTookOver, Engine: db.eng.Name(), Class: OperationClass(ctx),
		Attempt: l.attempt, Recovered: l.recovered, hashKey: db.hashKey, key: l.key}
	db.logEvent(ctx, &e)
}

// EngineMetric is one of the engine's own health figures: see
// DB.EngineMetrics.
type EngineMetric = driver.Metric

// EngineMetrics returns the engine's own health figures, for monitoring:
// on Pebble its compaction debt, read amplification, WAL and disk size; on
// PostgreSQL its listener, notifications and connection pool. Names are
// stable, in base units, without the "receipts_" prefix (package
// receiptsprom exports them). It does no I/O. After Close, or on an engine
// that reports none, it returns nil.
func (db *DB) EngineMetrics() []EngineMetric {
	if err := db.enter(); err != nil {
		return nil
	}
	defer db.exit()
	if mr, ok := db.eng.(driver.MetricsReporter); ok {
		return mr.Metrics()
	}
	return nil
}

// EngineName is the name of the engine the store runs on, as events carry
// it: "pebble" or "postgres".
func (db *DB) EngineName() string { return db.eng.Name() }

// begin lets the observer, if it is a Beginner, see an operation of kind
// begin, and returns the context the operation runs with.
func (db *DB) begin(ctx context.Context, kind EventKind) context.Context {
	if db.beginner != nil {
		return db.beginner.Begin(ctx, kind)
	}
	return ctx
}

// observeDo reports a Do that began at start and returned r, err.
// ran says whether an attempt ran.
func (db *DB) observeDo(ctx context.Context, k Key, start time.Time, r *Receipt, err error, ran bool, trace []byte) {
	e := db.event(DoEvent, k, OperationClass(ctx), start)
	switch {
	case !ran && r != nil:
		e.Outcome = OutcomeReplayed
	case !ran:
		e.Outcome = claimOutcome(nil, nil, err)
	case err == nil:
		e.Outcome = OutcomeSucceeded
	case errors.Is(err, ErrOutcomeUnknown):
		e.Outcome = OutcomeAbandoned
	case errors.Is(err, ErrFailed):
		e.Outcome = OutcomeFailed
	default: // not performed: released (or the release failed, and it stays pending)
		e.Outcome = OutcomeReleased
	}
	if r != nil {
		e.Attempt, e.Recovered = r.Attempts, r.Attempts > 1
		if !ran {
			e.Trace = trace
		}
	}
	db.emit(ctx, e)
}
