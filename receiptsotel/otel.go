// Package receiptsotel adapts a receipts store's events to OpenTelemetry:
// spans for its operations and metrics that mirror package receiptsprom's.
// The core package does not import OpenTelemetry.
//
//	obs, err := receiptsotel.New(nil) // the global TracerProvider and MeterProvider
//	db, err := receipts.Open(dir, &receipts.Options{Observer: obs})
//
// Spans (kind internal; children of the span in the caller's context):
//
//	receipts.do      a whole Do: its claim, the work and its recording (fn's context carries it, so the work's own spans are its children)
//	receipts.claim   a claim, waiting included
//	receipts.wait    the time a claim waited for another caller's attempt (a child of receipts.claim)
//	receipts.commit  the write that records a Succeeded or Failed receipt
//	receipts.release, receipts.abandon, receipts.lease_lost   the other ends of an attempt
//	receipts.gc      a garbage collection
//
// A replay's receipts.do and receipts.claim spans link to the span that
// recorded the receipt (for a Do, its receipts.do span; for Commit or Fail,
// the span in their context): the Observer is a observe.TraceRecorder and
// stores that span's W3C traceparent (55 bytes) with the receipt, on every
// engine, for as long as the receipt is kept.
//
// Sampling is decided before the SDK is called: an operation whose parent
// span is neither recording nor sampled starts no span, and with
// Options.SampleRatio the Observer samples the operations that begin a
// trace itself (as ParentBased(TraceIDRatioBased) would): one sampled out
// starts no span and builds no attribute, and its work runs in a trace that
// is not sampled. Metrics count every operation.
//
// The Observer is a observe.ReplayObserver: a Do answered at once with a
// stored receipt is one call, made when it ends. Sampled, its receipts.do and
// receipts.claim spans are made then, with the Do's start and end times;
// sampled out, it costs its metrics' atomic adds and a draw. Any other Do's
// receipts.do and receipts.claim spans are started once its claim has
// answered, with the Do's start time, before its work runs.
//
// Attributes: receipts.engine, receipts.outcome, receipts.class (if set),
// receipts.attempt, receipts.recovered, receipts.key_hash (the key's keyed
// hash, never its scope or ID; only with Options.KeyHash), and for GC
// receipts.gc.epochs_dropped and receipts.gc.bytes_freed. Error outcomes set
// the span's status to Error.
//
// Metrics (names as in receiptsprom, with OpenTelemetry's dots; durations
// in seconds): receipts.claims, receipts.finishes, receipts.gc.runs
// (counters, with the outcome as attribute), receipts.operation.duration
// and receipts.wait.duration (histograms, buckets observe.DurationBuckets
// unless Options.Buckets). They are recorded through the MeterProvider's
// instruments, or, with Options.Producer, aggregated by the Observer itself
// (an atomic add per measurement) and read by the sdkmetric readers it is
// registered with as a Producer:
//
//	obs, err := receiptsotel.New(&receiptsotel.Options{Producer: true, SampleRatio: 0.01})
//	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(
//		sdkmetric.NewPeriodicReader(exporter, sdkmetric.WithProducer(obs))))
package receiptsotel

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/internal/hot"
	"github.com/receiptstore/receipts/internal/mutate"
	"github.com/receiptstore/receipts/observe"
)

// ScopeName is the instrumentation scope of the tracer and the meter.
const ScopeName = "github.com/receiptstore/receipts"

// Options configure an Observer. A nil *Options means all defaults.
type Options struct {
	// TracerProvider makes the spans. Default otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// MeterProvider makes the metrics. Default otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// KeyHash adds receipts.key_hash (observe.Event.KeyHash) to every
	// span: it lets one follow a key across traces without revealing it,
	// at the cost of one HMAC per span.
	KeyHash bool
	// SampleRatio, if above 0 and below 1, is the fraction of operations
	// that begin a trace (have no span in their context) that the Observer
	// records spans for. The Observer decides before the SDK is called, as
	// sdktrace.ParentBased(sdktrace.TraceIDRatioBased(SampleRatio)) would on
	// a trace ID it draws itself: an operation sampled out starts no span
	// and builds no attribute (its context carries that trace ID with the
	// sampled flag unset, so the work's own spans, and the services it
	// calls, follow the decision), and the SDK's own path for a span that
	// is not sampled (microseconds per call) is never taken. Set the
	// TracerProvider's sampler to sample what reaches it (the SDK's
	// default, ParentBased(AlwaysSample), does), or the two ratios
	// multiply. 0 (the default), or 1 and above: the TracerProvider's
	// sampler decides for operations that begin a trace. Metrics count
	// every operation whatever the ratio.
	SampleRatio float64
	// Producer, if set, has the Observer aggregate its metrics itself and
	// hand them to OpenTelemetry as an sdkmetric.Producer, in place of
	// instruments made from MeterProvider (which it then does not use):
	// register it with each reader that exports them,
	//
	//	obs, err := receiptsotel.New(&receiptsotel.Options{Producer: true})
	//	reader := sdkmetric.NewPeriodicReader(exporter, sdkmetric.WithProducer(obs))
	//
	// A measurement then costs an atomic add on a stripe of its own, where
	// the SDK's synchronous instruments cost hundreds of nanoseconds each
	// (three per replay, a replay from memory taking about a microsecond:
	// docs/performance.md). The metrics, their attributes and buckets are
	// the same; their temporality is cumulative whatever the reader's
	// selector says, and they carry no exemplars.
	Producer bool
	// Buckets are the duration histograms' bucket upper bounds, in
	// seconds, increasing. Default observe.DurationBuckets(), as
	// receiptsprom's.
	Buckets []float64
}

// Observer is a observe.Observer (and observe.Beginner, observe.ReplayObserver) that records
// spans and metrics. It is safe for concurrent use.
type Observer struct {
	tracer  trace.Tracer
	keyHash bool
	// bound: a trace ID whose last 8 bytes, shifted right by one, are
	// below it is sampled (TraceIDRatioBased's rule); 0 if SampleRatio is
	// not set.
	bound uint64

	counters       [numCounters]metric.Int64Counter // claims, finishes, GC runs (counterMetrics)
	opDur, waitDur metric.Float64Histogram

	// With Options.Producer: the metrics are aggregated in the measureOpts
	// of each attribute set, from start, and reported by Produce.
	produce bool
	start   time.Time
	upper   []float64 // the histograms' bucket upper bounds

	sets  sync.Map               // setKey -> *measureOpts
	byKey sync.Map               // seriesKey -> *series
	last  atomic.Pointer[series] // the series used last: most stores have one engine and class
}

// New returns an Observer; set it as Options.Observer, alone or with others
// through observe.Observers.
func New(opts *Options) (*Observer, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.TracerProvider == nil {
		o.TracerProvider = otel.GetTracerProvider()
	}
	if o.MeterProvider == nil {
		o.MeterProvider = otel.GetMeterProvider()
	}
	ob := &Observer{tracer: o.TracerProvider.Tracer(ScopeName), keyHash: o.KeyHash, produce: o.Producer, start: time.Now()}
	if o.SampleRatio > 0 && o.SampleRatio < 1 {
		ob.bound = max(uint64(o.SampleRatio*(1<<63)), 1)
	}
	ob.upper = o.Buckets
	if ob.upper == nil {
		ob.upper = observe.DurationBuckets()
	}
	for i, ub := range ob.upper {
		if math.IsNaN(ub) || i > 0 && !(ub > ob.upper[i-1]) {
			return nil, fmt.Errorf("%w: receiptsotel: Options.Buckets must increase: %v", receipts.ErrInvalidArgument, ob.upper)
		}
	}
	ob.upper = slices.Clone(ob.upper)
	if ob.produce {
		return ob, nil
	}
	m := o.MeterProvider.Meter(ScopeName)
	var err error
	for i, in := range counterMetrics {
		if ob.counters[i], err = m.Int64Counter(in.name, metric.WithDescription(in.desc), metric.WithUnit(in.unit)); err != nil {
			return nil, err
		}
	}
	if ob.opDur, err = m.Float64Histogram(opDurMetric.name, metric.WithDescription(opDurMetric.desc), metric.WithUnit(opDurMetric.unit), metric.WithExplicitBucketBoundaries(ob.upper...)); err != nil {
		return nil, err
	}
	if ob.waitDur, err = m.Float64Histogram(waitDurMetric.name, metric.WithDescription(waitDurMetric.desc), metric.WithUnit(waitDurMetric.unit), metric.WithExplicitBucketBoundaries(ob.upper...)); err != nil {
		return nil, err
	}
	return ob, nil
}

// instrument names a metric: the same through a MeterProvider and from
// Produce.
type instrument struct{ name, desc, unit string }

var (
	// counterMetrics are the counters, by their index (ctrClaims, …).
	counterMetrics = [numCounters]instrument{
		{"receipts.claims", "Claims by outcome.", "{claim}"},
		{"receipts.finishes", "Attempts ended, by result.", "{attempt}"},
		{"receipts.gc.runs", "Garbage collections, by result.", "{run}"},
	}
	opDurMetric   = instrument{"receipts.operation.duration", "Duration of store operations: claim, finish, attempt, gc, do.", "s"}
	waitDurMetric = instrument{"receipts.wait.duration", "Time claims waited for another caller's attempt.", "s"}
)

// Begin starts the span of a Do or a claim (observe.Beginner); Observe
// ends it. No span is started, and the SDK is not called, if the span in
// ctx is neither recording nor sampled (the SDK's default sampler,
// ParentBased, would not sample a child of it), or if ctx has no span and
// the Observer's own sampler (Options.SampleRatio) samples the operation
// out.
func (o *Observer) Begin(ctx context.Context, kind observe.EventKind) context.Context {
	return o.BeginAt(ctx, kind, time.Time{})
}

// BeginAt is Begin for an operation that began at start (observe.ReplayObserver): its span
// starts there (now if start is zero).
func (o *Observer) BeginAt(ctx context.Context, kind observe.EventKind, start time.Time) context.Context {
	parent := trace.SpanFromContext(ctx)
	if psc := parent.SpanContext(); psc.IsValid() {
		if !psc.IsSampled() && !parent.IsRecording() {
			return ctx // the parent's decision: nothing to record
		}
	} else if o.bound != 0 {
		tid := newTraceID()
		if !o.sampledID(tid) {
			if mutate.Name == mutate.OTelUnmarked {
				return ctx
			}
			// Sampled out: the operation, and the work it runs, carry a
			// trace of their own that is not sampled, as the SDK would
			// give them, and nested operations follow this decision.
			return trace.ContextWithSpanContext(ctx, trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: newSpanID()}))
		}
	}
	return o.startSpan(ctx, kind, start)
}

// startSpan starts the span of a Do or a claim, at start if not zero.
func (o *Observer) startSpan(ctx context.Context, kind observe.EventKind, start time.Time) context.Context {
	name := "receipts.claim"
	if kind == observe.DoEvent {
		name = "receipts.do"
	}
	if start.IsZero() {
		ctx, _ = o.tracer.Start(ctx, name, internalSpan...)
	} else {
		ctx, _ = o.tracer.Start(ctx, name, internalSpan[0], trace.WithTimestamp(start))
	}
	return ctx
}

// ObserveReplay records a Do's replay answered at once (observe.ReplayObserver): its
// metrics, as Observe records its ClaimEvent and DoEvent, and, if the operation is sampled
// (Begin's decision, made here), its receipts.do and receipts.claim spans from e's times. A
// replay sampled out starts nothing and puts nothing in a context: nothing runs inside it.
func (o *Observer) ObserveReplay(ctx context.Context, e observe.Event) {
	if o.records(ctx) {
		dctx := o.startSpan(ctx, observe.DoEvent, e.Start)
		o.observe(o.startSpan(dctx, observe.ClaimEvent, e.Start), &e)
		e.Kind = observe.DoEvent
		o.observe(dctx, &e)
		return
	}
	row, sh := o.row(&e), hot.Pick() // the claim's and the Do's measurements, as observe makes them
	o.count(ctx, row, &e, ctrClaims, sh)
	o.duration(ctx, row, &e, opClaim, e.Duration, sh)
	e.Kind = observe.DoEvent
	o.duration(ctx, row, &e, opDo, e.Duration, sh)
}

// records reports whether a span of its own (a wait, a finish, a GC) is to
// be started in ctx: Begin's decision, with a draw of its own for one that
// begins a trace.
func (o *Observer) records(ctx context.Context) bool {
	parent := trace.SpanFromContext(ctx)
	if psc := parent.SpanContext(); psc.IsValid() {
		return psc.IsSampled() || parent.IsRecording()
	}
	return o.bound == 0 || rand.Uint64()>>1 < o.bound
}

// sampledID is TraceIDRatioBased's decision on tid with the Observer's
// ratio.
func (o *Observer) sampledID(tid trace.TraceID) bool {
	return binary.BigEndian.Uint64(tid[8:16])>>1 < o.bound
}

// newTraceID draws a random, valid trace ID.
func newTraceID() trace.TraceID {
	var tid trace.TraceID
	binary.BigEndian.PutUint64(tid[:8], rand.Uint64())
	binary.BigEndian.PutUint64(tid[8:], rand.Uint64()|1) // never all zero
	return tid
}

// newSpanID draws a random, valid span ID.
func newSpanID() trace.SpanID {
	var sid trace.SpanID
	binary.BigEndian.PutUint64(sid[:], rand.Uint64()|1)
	return sid
}

// internalSpan is the option every span starts with, built once (an
// option made per call, and the variadic slice holding it, cost two
// allocations per span).
var internalSpan = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal)}

// Observe records e (observe.Observer): it ends the span Begin started
// for a Do or a claim, records the other events as spans of their own with
// the event's times, and counts e.
func (o *Observer) Observe(ctx context.Context, e observe.Event) { o.observe(ctx, &e) }

func (o *Observer) observe(ctx context.Context, e *observe.Event) {
	switch e.Kind {
	case observe.ClaimEvent, observe.DoEvent:
		span := trace.SpanFromContext(ctx)
		if span.IsRecording() { // a span sampled out gets nothing: build nothing for it
			if sc, ok := parseTraceparent(e.Trace); ok { // a replay: the recorded execution
				span.AddLink(trace.Link{SpanContext: sc, Attributes: recordedLinkAttrs})
			}
			span.SetAttributes(o.attrs(*e)...)
			setStatus(span, e.Outcome)
			span.End(trace.WithTimestamp(e.Start.Add(e.Duration)))
		}
	default:
		if o.records(ctx) {
			_, span := o.tracer.Start(ctx, spanName(*e), trace.WithTimestamp(e.Start), trace.WithAttributes(o.attrs(*e)...), internalSpan[0])
			setStatus(span, e.Outcome)
			span.End(trace.WithTimestamp(e.Start.Add(e.Duration)))
		}
	}

	row, sh := o.row(e), hot.Pick()
	switch e.Kind {
	case observe.ClaimEvent:
		o.count(ctx, row, e, ctrClaims, sh)
		o.duration(ctx, row, e, opClaim, e.Duration, sh)
	case observe.WaitEvent:
		o.duration(ctx, row, e, opNone, e.Duration, sh)
	case observe.FinishEvent:
		o.count(ctx, row, e, ctrFinishes, sh)
		o.duration(ctx, row, e, opFinish, e.Duration, sh)
		o.duration(ctx, row, e, opAttempt, e.Held, sh)
	case observe.GCEvent:
		o.count(ctx, row, e, ctrGCRuns, sh)
		o.duration(ctx, row, e, opGC, e.Duration, sh)
	case observe.DoEvent:
		o.duration(ctx, row, e, opDo, e.Duration, sh)
	}
}

// count adds one to counter c for e's attributes: in the Observer's own
// aggregates (Options.Producer, on stripe sh) or through the SDK's
// instrument.
func (o *Observer) count(ctx context.Context, row *[numOps]atomic.Pointer[measureOpts], e *observe.Event, c, sh int) {
	m := o.opts(row, e, opNone)
	if o.produce {
		m.counts[c].AddAt(sh, 1)
		return
	}
	o.counters[c].Add(ctx, 1, m.add...)
}

// duration records d for e's attributes with op: in receipts.wait.duration
// for opNone, receipts.operation.duration otherwise; in the Observer's own
// aggregates (Options.Producer, on stripe sh) or through the SDK's
// instrument.
func (o *Observer) duration(ctx context.Context, row *[numOps]atomic.Pointer[measureOpts], e *observe.Event, op int, d time.Duration, sh int) {
	m := o.opts(row, e, op)
	if o.produce {
		m.dur.Observe(sh, d.Seconds())
		return
	}
	h := o.opDur
	if op == opNone {
		h = o.waitDur
	}
	h.Record(ctx, d.Seconds(), m.rec...)
}

// measureOpts is one attribute set as the options of an Add and of a
// Record, in slices built once: passing them spreads (...) an existing
// slice, where a single option would be boxed into a new one per call.
type measureOpts struct {
	set attribute.Set
	add []metric.AddOption
	rec []metric.RecordOption
	// With Options.Producer, the set's aggregates: for a set with no op
	// attribute, the counts of claims, finishes and GC runs, and the
	// wait.duration histogram; for one with an op, the
	// operation.duration histogram.
	counts *[numCounters]hot.Counter
	dur    *hot.Hist
}

// The counters, as indexes of measureOpts.counts.
const (
	ctrClaims = iota
	ctrFinishes
	ctrGCRuns
	numCounters
)

// setKey names one metric attribute set: the engine, class and outcome of
// an event, and the op attribute ("" for none).
type setKey struct{ engine, class, outcome, op string }

// The op attribute's values, as indexes of series.sets.
const (
	opNone = iota
	opClaim
	opFinish
	opAttempt
	opGC
	opDo
	numOps
)

var opNames = [numOps]string{"", "claim", "finish", "attempt", "gc", "do"}

// outcomeList are the documented outcomes, as indexes of series.sets.
var outcomeList = [...]observe.Outcome{observe.OutcomeReplayed, observe.OutcomeClaimed, observe.OutcomeSucceeded, observe.OutcomeTookOver,
	observe.OutcomeInProgress, observe.OutcomeMismatch, observe.OutcomeExpired, observe.OutcomeCanceled, observe.OutcomeClosed,
	observe.OutcomeError, observe.OutcomeFailed, observe.OutcomeReleased, observe.OutcomeAbandoned, observe.OutcomeLeaseLost, observe.OutcomeOK}

// outcomeIndex is out's index in outcomeList, or -1. It ranges over the
// array's indexes: a range over a package-level array's values copies the
// array first (240 bytes), which was 58 of the instructions of each event.
func outcomeIndex(out observe.Outcome) int {
	for i := range outcomeList { // the common outcomes first
		if outcomeList[i] == out {
			return i
		}
	}
	return -1
}

// series are the measurement options of one engine and class, resolved
// once per outcome and op: an event then costs an index, not a hash of
// its attributes (sync.Map's, on four strings, was most of what the
// Observer itself spent on a replay).
type series struct {
	engine, class string
	sets          [len(outcomeList)][numOps]atomic.Pointer[measureOpts] // [outcomeIndex][op]
}

// row returns the measurement options of e's engine, class and outcome,
// one per op, or nil for an outcome this version does not list.
func (o *Observer) row(e *observe.Event) *[numOps]atomic.Pointer[measureOpts] {
	s := o.last.Load()
	if s == nil || s.engine != e.Engine || s.class != e.Class {
		s = o.series(e.Engine, e.Class)
	}
	if i := outcomeIndex(e.Outcome); i >= 0 {
		return &s.sets[i]
	}
	return nil
}

// opts returns the measurement options for e's attributes with op (opNone:
// none) from row (o.row(e)), built once per distinct set: attribute sets
// are what the SDK's aggregation is keyed by, and building one sorts and
// copies.
func (o *Observer) opts(row *[numOps]atomic.Pointer[measureOpts], e *observe.Event, op int) *measureOpts {
	if row == nil {
		return o.attrSet(e, op)
	}
	if m := row[op].Load(); m != nil {
		return m
	}
	m := o.attrSet(e, op)
	row[op].Store(m)
	return m
}

// series returns, and makes the last one used, the series of engine and
// class.
func (o *Observer) series(engine, class string) *series {
	k := seriesKey{engine, class}
	v, ok := o.byKey.Load(k)
	if !ok {
		v, _ = o.byKey.LoadOrStore(k, &series{engine: engine, class: class})
	}
	s := v.(*series)
	o.last.Store(s)
	return s
}

type seriesKey struct{ engine, class string }

// attrSet returns the measurement options for e's attributes with op,
// from the Observer's map of them (made on first use).
func (o *Observer) attrSet(e *observe.Event, op int) *measureOpts {
	k := setKey{e.Engine, e.Class, string(e.Outcome), opNames[op]}
	if v, ok := o.sets.Load(k); ok {
		return v.(*measureOpts)
	}
	attrs := o.metricAttrs(*e)
	if op != opNone {
		attrs = append(attrs, attribute.String("op", opNames[op]))
	}
	set := attribute.NewSet(attrs...)
	opt := metric.WithAttributeSet(set)
	m := &measureOpts{set: set, add: []metric.AddOption{opt}, rec: []metric.RecordOption{opt}}
	if o.produce {
		if op == opNone {
			m.counts = new([numCounters]hot.Counter)
		}
		m.dur = hot.NewHist(o.upper)
	}
	v, _ := o.sets.LoadOrStore(k, m)
	return v.(*measureOpts)
}

func spanName(e observe.Event) string {
	switch e.Kind {
	case observe.WaitEvent:
		return "receipts.wait"
	case observe.GCEvent:
		return "receipts.gc"
	}
	switch e.Outcome {
	case observe.OutcomeReleased:
		return "receipts.release"
	case observe.OutcomeAbandoned:
		return "receipts.abandon"
	case observe.OutcomeLeaseLost:
		return "receipts.lease_lost"
	}
	return "receipts.commit"
}

func (o *Observer) attrs(e observe.Event) []attribute.KeyValue {
	n := 2 // engine, outcome
	if e.Class != "" {
		n++
	}
	if e.Attempt != 0 {
		n += 2
	}
	if e.Kind == observe.GCEvent {
		n += 2
	} else if o.keyHash {
		n++
	}
	a := make([]attribute.KeyValue, 0, n) // the exact size: a KeyValue is 64 bytes
	a = append(a, attribute.String("receipts.engine", e.Engine), attribute.String("receipts.outcome", string(e.Outcome)))
	if e.Class != "" {
		a = append(a, attribute.String("receipts.class", e.Class))
	}
	if e.Attempt != 0 {
		a = append(a, attribute.Int("receipts.attempt", int(e.Attempt)), attribute.Bool("receipts.recovered", e.Recovered))
	}
	if e.Kind == observe.GCEvent {
		a = append(a, attribute.Int("receipts.gc.epochs_dropped", e.EpochsDropped), attribute.Int64("receipts.gc.bytes_freed", int64(min(e.BytesFreed, 1<<62))))
	} else if o.keyHash {
		a = append(a, attribute.String("receipts.key_hash", e.KeyHash()))
	}
	return a
}

// metricAttrs are the bounded attributes of e's metrics.
func (o *Observer) metricAttrs(e observe.Event) []attribute.KeyValue {
	return []attribute.KeyValue{
		attribute.String("receipts.engine", e.Engine),
		attribute.String("receipts.class", e.Class),
		attribute.String("receipts.outcome", string(e.Outcome)),
	}
}

// setStatus marks a span whose outcome is an error.
func setStatus(span trace.Span, out observe.Outcome) {
	switch out {
	case observe.OutcomeError, observe.OutcomeLeaseLost, observe.OutcomeAbandoned:
		span.SetStatus(codes.Error, string(out))
	}
}

// TraceContext is the W3C traceparent of the span in ctx, stored with the
// receipt that a finish with ctx records (observe.TraceRecorder), or nil
// if ctx has no valid span or its trace is not sampled (no backend holds
// that span for a replay to link to: the receipt keeps no traceparent, and
// its replays clone none).
func (o *Observer) TraceContext(ctx context.Context) []byte {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() || !sc.IsSampled() {
		return nil
	}
	tid, sid := sc.TraceID(), sc.SpanID()
	b := make([]byte, 0, traceparentLen)
	b = append(b, "00-"...)
	b = hex.AppendEncode(b, tid[:])
	b = append(b, '-')
	b = hex.AppendEncode(b, sid[:])
	b = append(b, '-')
	return hex.AppendEncode(b, []byte{byte(sc.TraceFlags())})
}

// traceparentLen is the length of a version-00 W3C traceparent.
const traceparentLen = 55

// recordedLink marks the link from a replay to the recorded execution.
var recordedLink = attribute.String("receipts.link", "recorded_execution")

// recordedLinkAttrs are the link's attributes, one slice for every link
// (the SDK copies what it changes, it does not write to them).
var recordedLinkAttrs = []attribute.KeyValue{recordedLink}

// parseTraceparent reads a version-00 traceparent that TraceContext wrote.
func parseTraceparent(b []byte) (trace.SpanContext, bool) {
	if len(b) != traceparentLen || string(b[:3]) != "00-" || b[35] != '-' || b[52] != '-' {
		return trace.SpanContext{}, false
	}
	tid, err := trace.TraceIDFromHex(string(b[3:35]))
	if err != nil {
		return trace.SpanContext{}, false
	}
	sid, err := trace.SpanIDFromHex(string(b[36:52]))
	if err != nil {
		return trace.SpanContext{}, false
	}
	var flags [1]byte
	if _, err := hex.Decode(flags[:], b[53:55]); err != nil {
		return trace.SpanContext{}, false
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.TraceFlags(flags[0]), Remote: true})
	return sc, sc.IsValid()
}

var (
	_ observe.Beginner       = (*Observer)(nil)
	_ observe.TraceRecorder  = (*Observer)(nil)
	_ observe.ReplayObserver = (*Observer)(nil)
)
