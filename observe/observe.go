// Package observe is the vocabulary of receipts' observers, below the root
// as net/http/httptrace is below net/http: the events a store emits on every
// transition (Event, with its EventKind and Outcome), the interfaces an
// observer implements (Observer, and optionally KindFilter, Beginner,
// ReplayObserver and TraceRecorder), and the operation class a caller names in its context
// (WithOperationClass). Set an Observer in receipts.Options.Observer;
// packages receiptsprom and receiptsotel adapt the events to Prometheus and
// OpenTelemetry.
package observe

import (
	"context"
	"fmt"
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
// each of obs that is one, in order. If every one of obs is a ReplayObserver,
// so is the Observer it returns (ObserveReplay and BeginAt go to each in
// turn, as Observe and Begin do). Nil entries are skipped; with none left it
// returns nil.
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
	rs := make([]ReplayObserver, len(list))
	for i, o := range list {
		r, ok := o.(ReplayObserver)
		if !ok {
			return list
		}
		rs[i] = r
	}
	return multiReplay{list, rs}
}

// multiReplay is a multiObserver of ReplayObservers; rs holds the same observers.
type multiReplay struct {
	multiObserver
	rs []ReplayObserver
}

func (m multiReplay) ObserveReplay(ctx context.Context, e Event) {
	for _, r := range m.rs {
		r.ObserveReplay(ctx, e)
	}
}

func (m multiReplay) BeginAt(ctx context.Context, kind EventKind, start time.Time) context.Context {
	for _, r := range m.rs {
		ctx = r.BeginAt(ctx, kind, start)
	}
	return ctx
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

// Observes reports whether o takes events of kind: it is not nil, and not
// a KindFilter that declines them.
func Observes(o Observer, kind EventKind) bool {
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
		if Observes(o, kind) {
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

// ReplayObserver is implemented by observers that take a Do answered at once with a stored
// receipt (a replay that did not wait) as one call, ObserveReplay, instead of a Begin, a
// ClaimEvent and a DoEvent: what such a replay costs is then that call, not two events and
// their operations. For a ReplayObserver the store calls nothing before a Do's claim, and
// begins the Do's and the claim's operations with BeginAt, from the Do's start, only once
// the claim is known not to be such a replay; every other event is as for any Observer (a
// Claim's replay, or a replay after a wait, among them). Packages receiptsprom and
// receiptsotel implement it; a store whose Options.Logger takes debug records (replays are
// logged at Debug) uses the events instead.
type ReplayObserver interface {
	// ObserveReplay takes a replay: e is its ClaimEvent (OutcomeReplayed, with the stored
	// attempt and Trace), whose Start and Duration are the whole Do's. e.Trace is valid only
	// during the call. (e is passed by value, as to Observe: a pointer given to an interface
	// method makes the store allocate each Event.)
	ObserveReplay(ctx context.Context, e Event)
	// BeginAt is Beginner.Begin for an operation that began at start (a Beginner's spans
	// start there). Observers that are not Beginners return ctx.
	BeginAt(ctx context.Context, kind EventKind, start time.Time) context.Context
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
	key     driver.Key
}

// NewEvent returns an Event of kind about the key (scope, id), whose KeyHash
// names it under hashKey (a key derived from the store's secret). Stores
// build their events with it, and an observer's tests may too. The key
// itself stays hidden: nothing exported reads it, and printing the Event
// shows only KeyHash. It returns a value (no allocation): an observer that
// keeps an Event keeps a copy.
func NewEvent(kind EventKind, hashKey []byte, scope, id string) Event {
	return Event{Kind: kind, hashKey: hashKey, key: driver.Key{Scope: scope, ID: id}}
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
	return keys.Hash(e.hashKey, e.key.Scope, e.key.ID)
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

// DurationBuckets returns the observers' duration histograms' bucket upper
// bounds, in seconds (a new slice each call): from a replay from memory
// (50µs) to an export that holds its lease for minutes. receiptsprom
// (DefaultBuckets) and receiptsotel use them.
func DurationBuckets() []float64 {
	return []float64{0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300}
}
