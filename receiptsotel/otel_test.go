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
	"go.uber.org/goleak"

	"github.com/receiptstore/receipts"
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
	db, err := receipts.Open("db", &receipts.Options{GCInterval: -1, LeaseTTL: 30 * time.Second, Now: clock.Now, Observer: obs,
		Pebble: &pebble.Options{FS: vfs.NewMem()}})
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
