package receiptsotel_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/receiptstore/receipts/receiptsotel"
	"github.com/receiptstore/receipts/receiptstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var bg = context.Background()

// Spans nest as documented and carry the outcome; metrics count the same
// events; no attribute carries the scope or the ID.
func TestSpansAndMetrics(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = tp.Shutdown(bg); _ = mp.Shutdown(bg) })
	obs, err := receiptsotel.New(&receiptsotel.Options{TracerProvider: tp, MeterProvider: mp, KeyHash: true})
	require.NoError(t, err)
	clock := receiptstest.NewClock(time.Time{})
	db, err := pebblestore.Open("db", &pebblestore.Options{
		Options: receipts.Options{
			GCInterval: -1,
			LeaseTTL:   30 * time.Second,
			Now:        clock.Now,
			Observer:   obs,
		},
		Pebble: &pebble.Options{FS: vfs.NewMem()},
	})
	require.NoError(t, err)
	defer db.Close()

	k := receipts.Key{Scope: "tenant-4411", ID: "invoice-9921"}
	ctx, parent := tp.Tracer("test").Start(bg, "handler")
	var fnSpan string
	_, err = db.Do(ctx, k, []byte("fp"), func(ctx context.Context, _ *receipts.Lease) ([]byte, error) {
		_, s := tp.Tracer("test").Start(ctx, "send")
		fnSpan = s.SpanContext().SpanID().String()
		s.End()
		return []byte("ok"), nil
	})
	require.NoError(t, err)
	_, err = db.Do(ctx, k, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
		return nil, errors.New("must not run")
	})
	require.NoError(t, err)
	parent.End()

	byName := map[string][]sdktrace.ReadOnlySpan{}
	for _, s := range spans.Ended() {
		byName[s.Name()] = append(byName[s.Name()], s)
		for _, a := range s.Attributes() {
			require.NotContains(t, a.Value.String(), "tenant-4411")
			require.NotContains(t, a.Value.String(), "invoice-9921")
		}
	}
	require.Len(t, byName["receipts.do"], 2)
	require.Len(t, byName["receipts.claim"], 2)
	require.Len(t, byName["receipts.commit"], 1)
	do1, claim1, commit := byName["receipts.do"][0], byName["receipts.claim"][0], byName["receipts.commit"][0]
	require.Equal(t, parent.SpanContext().SpanID(), do1.Parent().SpanID(), "receipts.do is a child of the caller's span")
	require.Equal(t, do1.SpanContext().SpanID(), claim1.Parent().SpanID(), "the claim is a child of the do")
	require.Equal(t, do1.SpanContext().SpanID(), commit.Parent().SpanID(), "the commit is a child of the do")
	require.Equal(t, do1.SpanContext().SpanID().String(), byName["send"][0].Parent().SpanID().String(), "fn's spans are children of the do")
	require.Equal(t, fnSpan, byName["send"][0].SpanContext().SpanID().String())
	require.Equal(t, "succeeded", attr(do1, "receipts.outcome"))
	require.Equal(t, "claimed", attr(claim1, "receipts.outcome"))
	require.Equal(t, "replayed", attr(byName["receipts.do"][1], "receipts.outcome"))
	require.Equal(t, "pebble", attr(do1, "receipts.engine"))
	require.Len(t, attr(do1, "receipts.key_hash"), 24)
	require.Equal(t, attr(do1, "receipts.key_hash"), attr(byName["receipts.do"][1], "receipts.key_hash"))

	// A wait and a takeover with an abandon: the wait is a child of its
	// claim, the abandon has status Error.
	l, _, err := db.Claim(bg, receipts.Key{Scope: "s", ID: "w"}, []byte("fp"))
	require.NoError(t, err)
	_, _, err = db.Claim(bg, receipts.Key{Scope: "s", ID: "w"}, []byte("fp"), receipts.WaitAtMost(100*time.Millisecond))
	require.ErrorIs(t, err, receipts.ErrInProgress)
	require.NoError(t, l.Abandon(bg))
	byName = map[string][]sdktrace.ReadOnlySpan{}
	for _, s := range spans.Ended() {
		byName[s.Name()] = append(byName[s.Name()], s)
	}
	require.Len(t, byName["receipts.wait"], 1)
	w, c := byName["receipts.wait"][0], byName["receipts.claim"][3]
	require.Equal(t, c.SpanContext().SpanID(), w.Parent().SpanID())
	require.Equal(t, "in_progress", attr(w, "receipts.outcome"))
	require.Positive(t, w.EndTime().Sub(w.StartTime()))
	require.GreaterOrEqual(t, c.EndTime().Sub(c.StartTime()), 100*time.Millisecond)
	require.Equal(t, codes.Error, byName["receipts.abandon"][0].Status().Code)

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(bg, &rm))
	counts := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok {
				for _, dp := range sum.DataPoints {
					out, _ := dp.Attributes.Value(attribute.Key("receipts.outcome"))
					counts[m.Name+"/"+out.AsString()] += dp.Value
				}
			}
		}
	}
	require.Equal(t, map[string]int64{
		"receipts.claims/claimed":     2,
		"receipts.claims/replayed":    1,
		"receipts.claims/in_progress": 1,
		"receipts.finishes/succeeded": 1,
		"receipts.finishes/abandoned": 1,
	}, counts)
}

func attr(s sdktrace.ReadOnlySpan, key string) string {
	for _, a := range s.Attributes() {
		if string(a.Key) == key {
			return a.Value.String()
		}
	}
	return ""
}

// traced is an Observer that traces every operation (no metrics) into the recorder it
// returns, with its TracerProvider (shut down when t ends).
func traced(t *testing.T) (*tracetest.SpanRecorder, *sdktrace.TracerProvider, *receiptsotel.Observer) {
	t.Helper()
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() { _ = tp.Shutdown(bg) })
	obs, err := receiptsotel.New(&receiptsotel.Options{TracerProvider: tp})
	require.NoError(t, err)
	return spans, tp, obs
}

// A replay's receipts.do and receipts.claim spans link to the receipts.do
// span that recorded the receipt, also from another trace and after a
// restart (the traceparent is stored with the receipt); a first call's
// spans have no link.
func TestReplayLinksToRecordedExecution(t *testing.T) {
	spans, tp, obs := traced(t)
	fs := vfs.NewMem()
	open := func() *receipts.DB {
		db, err := pebblestore.Open("db", &pebblestore.Options{Options: receipts.Options{GCInterval: -1, Observer: obs}, Pebble: &pebble.Options{FS: fs}})
		require.NoError(t, err)
		return db
	}
	db := open()
	k := receipts.Key{Scope: "tenant", ID: "op-1"}
	do := func(db *receipts.DB, root string) {
		ctx, s := tp.Tracer("test").Start(bg, root)
		defer s.End()
		_, err := db.Do(ctx, k, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) { return []byte("ok"), nil })
		require.NoError(t, err)
	}
	// the spans named name that ended since the last call
	seen := 0
	ended := func(name string) []sdktrace.ReadOnlySpan {
		all := spans.Ended()
		var out []sdktrace.ReadOnlySpan
		for _, s := range all[seen:] {
			if s.Name() == name {
				out = append(out, s)
			}
		}
		seen = len(all)
		return out
	}
	do(db, "first")
	first := ended("receipts.do")
	require.Len(t, first, 1)
	require.Empty(t, first[0].Links(), "a first call links nowhere")
	exec := first[0].SpanContext()

	check := func(what string) {
		t.Helper()
		all := spans.Ended()[seen:]
		seen = len(spans.Ended())
		var n int
		for _, s := range all {
			if s.Name() != "receipts.do" && s.Name() != "receipts.claim" {
				continue
			}
			n++
			require.Len(t, s.Links(), 1, "%s: %s", what, s.Name())
			l := s.Links()[0]
			require.Equal(t, exec.TraceID(), l.SpanContext.TraceID(), "%s: %s", what, s.Name())
			require.Equal(t, exec.SpanID(), l.SpanContext.SpanID(), "%s: %s", what, s.Name())
			require.NotEqual(t, exec.TraceID(), s.SpanContext().TraceID(), "%s: the replay runs in its own trace", what)
		}
		require.Equal(t, 2, n, "%s: a receipts.do and a receipts.claim span", what)
	}
	do(db, "retry")
	check("replay")
	require.NoError(t, db.Close())
	db = open()
	defer db.Close()
	do(db, "retry after restart")
	check("replay after a restart")
}

// A receipt recorded in a trace that is not sampled keeps no traceparent
// (no backend holds that span), so its replay, in a sampled trace, links
// nowhere; TraceContext gives nil for such a context and the traceparent
// for a sampled one.
func TestUnsampledExecutionStoresNoTrace(t *testing.T) {
	spans, tp, obs := traced(t)
	db, err := pebblestore.Open("db", &pebblestore.Options{Options: receipts.Options{GCInterval: -1, Observer: obs}, Pebble: &pebble.Options{FS: vfs.NewMem()}})
	require.NoError(t, err)
	defer db.Close()

	unsampled := trace.ContextWithSpanContext(bg, trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5, 6}}))
	require.Nil(t, obs.TraceContext(unsampled))
	sampledCtx, s := tp.Tracer("test").Start(bg, "sampled")
	require.Len(t, obs.TraceContext(sampledCtx), 55)
	s.End()

	k := receipts.Key{Scope: "tenant", ID: "op-1"}
	ok := func(context.Context, *receipts.Lease) ([]byte, error) { return []byte("ok"), nil }
	_, err = db.Do(unsampled, k, []byte("fp"), ok)
	require.NoError(t, err)
	require.Empty(t, spans.Ended()[1:], "the unsampled execution recorded no span")

	ctx, root := tp.Tracer("test").Start(bg, "retry")
	_, err = db.Do(ctx, k, []byte("fp"), ok)
	require.NoError(t, err)
	root.End()
	var n int
	for _, s := range spans.Ended() {
		if s.Name() == "receipts.do" || s.Name() == "receipts.claim" {
			n++
			require.Empty(t, s.Links(), "%s: no link to a span that was never recorded", s.Name())
		}
	}
	require.Equal(t, 2, n)
}
