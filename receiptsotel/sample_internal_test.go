package receiptsotel

import (
	"testing"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
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
