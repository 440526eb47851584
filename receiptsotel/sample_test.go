package receiptsotel_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/receiptstore/receipts/receiptsotel"
)

// countingProvider counts the calls to its tracers' Start: the SDK's
// path for a span, sampled or not, begins there.
type countingProvider struct {
	embedded.TracerProvider
	tp     trace.TracerProvider
	starts *atomic.Int64
}

func (p countingProvider) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	return countingTracer{t: p.tp.Tracer(name, opts...), starts: p.starts}
}

type countingTracer struct {
	embedded.Tracer
	t      trace.Tracer
	starts *atomic.Int64
}

func (t countingTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	t.starts.Add(1)
	return t.t.Start(ctx, name, opts...)
}

// sampleRig is a store observed by receiptsotel with ratio, on an SDK
// that samples what reaches it, recording spans and counting the calls
// into it.
type sampleRig struct {
	db     *receipts.DB
	tp     *sdktrace.TracerProvider
	spans  *tracetest.SpanRecorder
	reader *sdkmetric.ManualReader
	starts *atomic.Int64
}

func newSampleRig(t *testing.T, ratio float64) *sampleRig {
	r := &sampleRig{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader(), starts: new(atomic.Int64)}
	r.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(r.spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r.reader))
	t.Cleanup(func() { _ = r.tp.Shutdown(bg); _ = mp.Shutdown(bg) })
	obs, err := receiptsotel.New(&receiptsotel.Options{
		TracerProvider: countingProvider{tp: r.tp, starts: r.starts},
		MeterProvider:  mp,
		SampleRatio:    ratio,
	})
	require.NoError(t, err)
	r.db, err = pebblestore.Open("db", &pebblestore.Options{Options: receipts.Options{GCInterval: -1, Observer: obs}, Pebble: &pebble.Options{FS: vfs.NewMem()}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, r.db.Close()) })
	return r
}

// do runs a Do of key id in ctx, then its replay; fn starts a span of its
// own with the test's tracer, and reports fn's span context.
func (r *sampleRig) do(t *testing.T, ctx context.Context, id string) (fnSC trace.SpanContext) {
	t.Helper()
	k := receipts.Key{Scope: "s", ID: id}
	_, err := r.db.Do(ctx, k, []byte("fp"), func(ctx context.Context, _ *receipts.Lease) ([]byte, error) {
		fnSC = trace.SpanContextFromContext(ctx)
		_, s := r.tp.Tracer("test").Start(ctx, "send")
		s.End()
		return []byte("ok"), nil
	})
	require.NoError(t, err)
	_, err = r.db.Do(ctx, k, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
		return nil, errors.New("must not run")
	})
	require.NoError(t, err)
	return fnSC
}

// claims sums receipts.claims by outcome.
func (r *sampleRig) claims(t *testing.T) map[string]int64 {
	var rm metricdata.ResourceMetrics
	require.NoError(t, r.reader.Collect(bg, &rm))
	counts := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "receipts.claims" {
				for _, dp := range sum.DataPoints {
					out, _ := dp.Attributes.Value(attribute.Key("receipts.outcome"))
					counts[out.AsString()] += dp.Value
				}
			}
		}
	}
	return counts
}

// An operation the Observer's sampler samples out calls the SDK for no
// span (none is started, none ended); its work runs in a trace that is
// valid and not sampled, so the work's own spans are not recorded either;
// the metrics still count every operation.
func TestSampledOutStartsNoSpan(t *testing.T) {
	r := newSampleRig(t, 1e-15) // a root is sampled about once in 10^15
	for i := range 50 {
		fn := r.do(t, bg, fmt.Sprint("k", i))
		require.True(t, fn.IsValid(), "the work runs in a trace")
		require.False(t, fn.IsSampled(), "that is not sampled")
	}
	// Claim, Commit and a wait outside Do: the same.
	l, _, err := r.db.Claim(bg, receipts.Key{Scope: "s", ID: "c"}, []byte("fp"))
	require.NoError(t, err)
	_, err = l.Commit(bg, []byte("ok"))
	require.NoError(t, err)

	require.Zero(t, r.starts.Load(), "the SDK is never asked for a span")
	require.Empty(t, r.spans.Started())
	require.Empty(t, r.spans.Ended())
	require.Equal(t, map[string]int64{"claimed": 51, "replayed": 50}, r.claims(t))
}

// A parent span that is neither recording nor sampled (here: one the
// SDK sampled out) gets no child span, whatever the ratio; the SDK is
// asked only for the parent.
func TestUnsampledParentStartsNoSpan(t *testing.T) {
	r := newSampleRig(t, 0) // no ratio of the Observer's own
	never := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))
	t.Cleanup(func() { _ = never.Shutdown(bg) })
	ctx, parent := never.Tracer("test").Start(bg, "handler")
	defer parent.End()
	require.False(t, parent.IsRecording())
	r.do(t, ctx, "k")
	require.Zero(t, r.starts.Load())
	require.Empty(t, r.spans.Ended())

	// The same for a parent from another service that was not sampled.
	remote := trace.ContextWithRemoteSpanContext(bg, trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, Remote: true}))
	r.do(t, remote, "k2")
	require.Zero(t, r.starts.Load())
	require.Empty(t, r.spans.Ended())
	require.Equal(t, map[string]int64{"claimed": 2, "replayed": 2}, r.claims(t))
}

// A child of a recording parent, or of a remote parent that was sampled,
// records its spans, with the replay's link, whatever the Observer's
// ratio: the parent decided.
func TestSampledParentStillRecords(t *testing.T) {
	r := newSampleRig(t, 1e-15)
	ctx, parent := r.tp.Tracer("test").Start(bg, "handler")
	fn := r.do(t, ctx, "k")
	parent.End()
	require.True(t, fn.IsSampled())
	byName := map[string][]sdktrace.ReadOnlySpan{}
	for _, s := range r.spans.Ended() {
		byName[s.Name()] = append(byName[s.Name()], s)
	}
	require.Len(t, byName["receipts.do"], 2)
	require.Len(t, byName["receipts.claim"], 2)
	require.Len(t, byName["receipts.commit"], 1)
	require.Len(t, byName["send"], 1)
	do1, do2 := byName["receipts.do"][0], byName["receipts.do"][1]
	require.Equal(t, parent.SpanContext().SpanID(), do1.Parent().SpanID())
	require.Equal(t, do1.SpanContext().SpanID(), byName["receipts.claim"][0].Parent().SpanID())
	require.Equal(t, do1.SpanContext().SpanID(), byName["receipts.commit"][0].Parent().SpanID())
	require.Equal(t, "replayed", attr(do2, "receipts.outcome"))
	require.Len(t, do2.Links(), 1, "the replay links to the recorded execution")
	require.Equal(t, do1.SpanContext().SpanID(), do2.Links()[0].SpanContext.SpanID())
	require.Equal(t, len(r.spans.Started()), len(r.spans.Ended()), "every span started ended")

	remoteSC := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{3}, SpanID: trace.SpanID{4}, TraceFlags: trace.FlagsSampled, Remote: true})
	n := len(r.spans.Ended())
	r.do(t, trace.ContextWithRemoteSpanContext(bg, remoteSC), "k2")
	var got []string
	for _, s := range r.spans.Ended()[n:] {
		require.Equal(t, remoteSC.TraceID(), s.SpanContext().TraceID(), "%s joins the caller's trace", s.Name())
		got = append(got, s.Name())
	}
	require.ElementsMatch(t, []string{"receipts.do", "receipts.claim", "receipts.commit", "send", "receipts.do", "receipts.claim"}, got)
}

// With a ratio that samples some operations and not others, each
// operation is sampled whole or not at all: a sampled Do's claim and
// commit are its children, a Do sampled out leaves no span, every span
// started ends, and the SDK is asked only for spans it records.
func TestSampledOperationsComplete(t *testing.T) {
	r := newSampleRig(t, 0.5)
	const n = 200
	for i := range n {
		r.do(t, bg, fmt.Sprint("k", i))
	}
	ended := r.spans.Ended()
	require.Equal(t, len(r.spans.Started()), len(ended), "every span started ended")
	dos := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	ours := 0 // spans of the Observer's (fn's "send" spans are the test's)
	for _, s := range ended {
		if s.Name() != "send" {
			ours++
		}
		if s.Name() == "receipts.do" {
			require.False(t, s.Parent().IsValid(), "a receipts.do begins its trace")
			dos[s.SpanContext().SpanID()] = s
		}
	}
	require.Equal(t, int64(ours), r.starts.Load(), "the SDK was asked only for the spans it recorded")
	children := map[trace.SpanID][]string{}
	for _, s := range ended {
		if s.Name() == "receipts.do" {
			continue
		}
		do, ok := dos[s.Parent().SpanID()]
		require.True(t, ok, "%s is the child of a recorded receipts.do", s.Name())
		require.Equal(t, do.SpanContext().TraceID(), s.SpanContext().TraceID())
		children[do.SpanContext().SpanID()] = append(children[do.SpanContext().SpanID()], s.Name())
	}
	var first, replay int
	for id, do := range dos {
		switch attr(do, "receipts.outcome") {
		case "succeeded":
			first++
			require.ElementsMatch(t, []string{"receipts.claim", "receipts.commit", "send"}, children[id])
		case "replayed":
			replay++
			require.Equal(t, []string{"receipts.claim"}, children[id])
		default:
			t.Fatalf("outcome %q", attr(do, "receipts.outcome"))
		}
	}
	// 400 operations at 1/2: the chance of fewer than 100 or more than 300 sampled is below 10^-23.
	require.Greater(t, first+replay, 100)
	require.Less(t, first+replay, 300)
	require.Equal(t, map[string]int64{"claimed": n, "replayed": n}, r.claims(t))
}
