package receiptsotel_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/observe"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/receiptstore/receipts/receiptsotel"
	"github.com/receiptstore/receipts/receiptstest"
)

// eventsOnly is an Observer without ObserveReplay and BeginAt: the store reports every
// replay to it as a Begin, a ClaimEvent and a DoEvent, as to any Observer.
type eventsOnly struct{ o *receiptsotel.Observer }

func (e eventsOnly) Observe(ctx context.Context, ev observe.Event) { e.o.Observe(ctx, ev) }
func (e eventsOnly) Begin(ctx context.Context, kind observe.EventKind) context.Context {
	return e.o.Begin(ctx, kind)
}
func (e eventsOnly) TraceContext(ctx context.Context) []byte { return e.o.TraceContext(ctx) }

// The Observer as an observe.ReplayObserver (a replay answered at once is one ObserveReplay;
// other Do's are begun with BeginAt once their claim is known) records the same spans
// (names, nesting, attributes, status, links) and the same metrics (series and counts) as
// the same Observer given every replay as events: through a sampled parent and at the
// root, with every operation traced and with (almost) none sampled, for first calls,
// replays, a failed receipt and its replay, a mismatch, a nested Do and a wait.
func TestReplayObserverMatchesEvents(t *testing.T) {
	for _, ratio := range []float64{0, 1e-12} {
		t.Run(fmt.Sprint("ratio=", ratio), func(t *testing.T) {
			wantSpans, wantMetrics := replayScenario(t, ratio, true)
			gotSpans, gotMetrics := replayScenario(t, ratio, false)
			require.NotEmpty(t, wantSpans)
			require.Equal(t, wantSpans, gotSpans)
			require.Equal(t, slices.Sorted(maps.Keys(wantMetrics)), slices.Sorted(maps.Keys(gotMetrics)), "the same series")
			require.Contains(t, wantMetrics, "receipts.claims{receipts.class=refund,receipts.engine=pebble,receipts.outcome=replayed}")
			for k, w := range wantMetrics {
				require.Equal(t, w.count, gotMetrics[k].count, k)
			}
		})
	}
}

// replayScenario runs receiptstest.ObserverCalls, under a parent span and with a class, on
// a new store observed by an Observer sampling ratio (0: the SDK decides, every operation),
// given every replay as events if events is set, and returns the spans' shapes and the
// metrics' series.
func replayScenario(t *testing.T, ratio float64, events bool) ([]string, map[string]point) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = tp.Shutdown(bg); _ = mp.Shutdown(bg) })
	obs, err := receiptsotel.New(&receiptsotel.Options{TracerProvider: tp, MeterProvider: mp, SampleRatio: ratio, KeyHash: true})
	require.NoError(t, err)
	var o observe.Observer = obs
	if events {
		o = eventsOnly{obs}
	}
	clock := receiptstest.NewClock(time.Time{})
	db, err := pebblestore.Open("db", &pebblestore.Options{
		Options: receipts.Options{GCInterval: -1, LeaseTTL: 30 * time.Second, Now: clock.Now, Observer: o},
		Pebble:  &pebble.Options{FS: vfs.NewMem()},
	})
	require.NoError(t, err)
	defer db.Close()

	tr := tp.Tracer("test")
	ok := func(ctx context.Context, _ *receipts.Lease) ([]byte, error) {
		_, s := tr.Start(ctx, "send")
		s.End()
		return []byte("ok"), nil
	}
	ctx, parent := tr.Start(observe.WithOperationClass(bg, "refund"), "handler")
	k := func(id string) receipts.Key { return receipts.Key{Scope: "s", ID: id} }
	ids := map[string]string{} // each store has a secret of its own: keys named by their IDs
	for _, id := range receiptstest.ObserverCalls(t, db, ctx, "s", ok) {
		ids[db.LogKey(k(id)).Value.String()] = id
	}
	parent.End()

	byID := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range spans.Ended() {
		byID[s.SpanContext().SpanID().String()] = s
	}
	var shapes []string
	for _, s := range spans.Ended() {
		require.False(t, s.EndTime().Before(s.StartTime()), s.Name())
		up := "-"
		if p, ok := byID[s.Parent().SpanID().String()]; ok {
			up = p.Name()
			require.False(t, s.StartTime().Before(p.StartTime()), "%s starts before its parent %s", s.Name(), up)
		}
		var attrs []string
		for _, a := range s.Attributes() {
			v := a.Value.String()
			if a.Key == "receipts.key_hash" {
				require.Contains(t, ids, v)
				v = ids[v]
			}
			attrs = append(attrs, string(a.Key)+"="+v)
		}
		sort.Strings(attrs)
		shapes = append(shapes, fmt.Sprintf("%s<-%s %v links=%d [%s]", s.Name(), up, s.Status().Code, len(s.Links()), strings.Join(attrs, " ")))
	}
	sort.Strings(shapes)
	return shapes, collect(t, reader)
}
