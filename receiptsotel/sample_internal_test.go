package receiptsotel

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/receiptstore/receipts/observe"
)

// The Observer's decision on a trace ID is TraceIDRatioBased's, so that
// it agrees with the services that sample with the SDK's ratio sampler.
func TestSampledIDIsTraceIDRatioBased(t *testing.T) {
	for _, ratio := range []float64{0.01, 0.3, 0.5, 0.99} {
		o, err := New(&Options{SampleRatio: ratio})
		require.NoError(t, err)
		sdk := sdktrace.TraceIDRatioBased(ratio)
		n := 0
		for range 20000 {
			tid := newTraceID()
			want := sdk.ShouldSample(sdktrace.SamplingParameters{TraceID: tid}).Decision == sdktrace.RecordAndSample
			require.Equal(t, want, o.sampledID(tid), "ratio %v, trace %s", ratio, tid)
			if want {
				n++
			}
		}
		require.InDelta(t, ratio, float64(n)/20000, 0.05, "ratio %v", ratio)
	}
	var zero trace.TraceID
	require.NotEqual(t, zero, newTraceID())
}

// The measurement options resolved once per engine, class, outcome and op
// carry that engine, class and outcome, as the per-call attribute sets
// did: events alternating between classes and engines, and an outcome
// this version does not list, are counted under their own attributes.
func TestResolvedAttributeSets(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	o, err := New(&Options{MeterProvider: mp})
	require.NoError(t, err)
	want := map[string]int64{}
	for i := range 30 {
		e := observe.Event{Kind: observe.ClaimEvent, Engine: []string{"pebble", "postgres"}[i%2], Class: []string{"", "a", "b"}[i%3],
			Outcome: []observe.Outcome{observe.OutcomeReplayed, observe.OutcomeClaimed, "new_outcome"}[i%5%3]}
		o.Observe(context.Background(), e)
		want[e.Engine+"/"+e.Class+"/"+string(e.Outcome)]++
	}
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	got, ops := map[string]int64{}, map[string]uint64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range d.DataPoints {
					eng, _ := dp.Attributes.Value("receipts.engine")
					class, _ := dp.Attributes.Value("receipts.class")
					out, _ := dp.Attributes.Value("receipts.outcome")
					require.Equal(t, 3, dp.Attributes.Len())
					got[eng.AsString()+"/"+class.AsString()+"/"+out.AsString()] += dp.Value
				}
			case metricdata.Histogram[float64]:
				for _, dp := range d.DataPoints {
					op, _ := dp.Attributes.Value("op")
					require.Equal(t, 4, dp.Attributes.Len())
					ops[op.AsString()] += dp.Count
				}
			}
		}
	}
	require.Equal(t, want, got)
	require.Equal(t, map[string]uint64{"claim": 30}, ops)
}
