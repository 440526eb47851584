package receiptsotel_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/observe"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/receiptstore/receipts/receiptsotel"
)

// The Observer as an sdkmetric.Producer (Options.Producer) reports the
// same metrics as through a MeterProvider's instruments, for the same
// events of a real store: every series, its attributes, counts, buckets
// and sums. The two Observers watch one store (observe.Observers), so they
// see the same durations.
func TestProducerMatchesInstruments(t *testing.T) {
	tp := sdktrace.NewTracerProvider()
	sdkReader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkReader))
	viaSDK, err := receiptsotel.New(&receiptsotel.Options{TracerProvider: tp, MeterProvider: mp})
	require.NoError(t, err)
	produced, err := receiptsotel.New(&receiptsotel.Options{TracerProvider: tp, Producer: true})
	require.NoError(t, err)
	var _ sdkmetric.Producer = produced
	prodReader := sdkmetric.NewManualReader(sdkmetric.WithProducer(produced))
	mp2 := sdkmetric.NewMeterProvider(sdkmetric.WithReader(prodReader))
	t.Cleanup(func() { _ = tp.Shutdown(bg); _ = mp.Shutdown(bg); _ = mp2.Shutdown(bg) })

	db, err := pebblestore.Open("db", &pebblestore.Options{
		Options: receipts.Options{GCInterval: -1, Observer: observe.Observers(viaSDK, produced)},
		Pebble:  &pebble.Options{FS: vfs.NewMem()},
	})
	require.NoError(t, err)
	defer db.Close()
	ok := func(context.Context, *receipts.Lease) ([]byte, error) { return []byte("ok"), nil }
	for i := range 20 {
		k := receipts.Key{Scope: "s", ID: fmt.Sprint("op-", i)}
		_, err := db.Do(bg, k, []byte("fp"), ok)
		require.NoError(t, err)
		_, err = db.Do(bg, k, []byte("fp"), ok) // a replay
		require.NoError(t, err)
		_, err = db.Do(bg, k, []byte("other"), ok)
		require.ErrorIs(t, err, receipts.ErrIntentMismatch)
	}
	_, err = db.Do(bg, receipts.Key{Scope: "s", ID: "perm"}, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
		return nil, receipts.Permanent(errors.New("declined"))
	})
	require.Error(t, err)
	l, _, err := db.Claim(bg, receipts.Key{Scope: "s", ID: "w"}, []byte("fp"))
	require.NoError(t, err)
	_, _, err = db.Claim(bg, receipts.Key{Scope: "s", ID: "w"}, []byte("fp"), receipts.WaitAtMost(20*time.Millisecond))
	require.ErrorIs(t, err, receipts.ErrInProgress)
	require.NoError(t, l.Abandon(bg))
	_, err = db.GC(bg)
	require.NoError(t, err)

	want, got := collect(t, sdkReader), collect(t, prodReader)
	require.NotEmpty(t, want)
	require.Contains(t, want, "receipts.claims{receipts.class=,receipts.engine=pebble,receipts.outcome=replayed}")
	require.Contains(t, want, "receipts.wait.duration{receipts.class=,receipts.engine=pebble,receipts.outcome=in_progress}")
	require.Contains(t, want, "receipts.gc.runs{receipts.class=,receipts.engine=pebble,receipts.outcome=ok}")
	require.Equal(t, slices.Sorted(maps.Keys(want)), slices.Sorted(maps.Keys(got)), "the same series")
	for k, w := range want {
		g := got[k]
		require.Equal(t, w.count, g.count, k)
		require.Equal(t, w.buckets, g.buckets, k)
		require.Equal(t, w.bounds, g.bounds, k)
		require.InDelta(t, w.sum, g.sum, 1e-9*math.Max(1, w.sum), k)
		require.Equal(t, w.unit, g.unit, k)
		require.Equal(t, w.desc, g.desc, k)
	}
}

// point is one series of a collected metric.
type point struct {
	count      int64
	sum        float64
	buckets    []uint64
	bounds     []float64
	unit, desc string
}

// collect returns every series that reader reports, by metric name and
// attributes.
func collect(t *testing.T, reader *sdkmetric.ManualReader) map[string]point {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(bg, &rm))
	out := map[string]point{}
	for _, sm := range rm.ScopeMetrics {
		require.Equal(t, receiptsotel.ScopeName, sm.Scope.Name)
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				require.True(t, d.IsMonotonic, m.Name)
				require.Equal(t, metricdata.CumulativeTemporality, d.Temporality, m.Name)
				for _, dp := range d.DataPoints {
					out[m.Name+attrString(dp.Attributes)] = point{count: dp.Value, unit: m.Unit, desc: m.Description}
				}
			case metricdata.Histogram[float64]:
				require.Equal(t, metricdata.CumulativeTemporality, d.Temporality, m.Name)
				for _, dp := range d.DataPoints {
					out[m.Name+attrString(dp.Attributes)] = point{count: int64(dp.Count), sum: dp.Sum, buckets: dp.BucketCounts, bounds: dp.Bounds, unit: m.Unit, desc: m.Description}
				}
			default:
				t.Fatalf("%s: unexpected data %T", m.Name, m.Data)
			}
		}
	}
	return out
}

func attrString(s attribute.Set) string {
	return "{" + string(s.Encoded(attribute.DefaultEncoder())) + "}"
}

// Buckets that do not increase are refused with ErrInvalidArgument.
func TestBucketsMustIncrease(t *testing.T) {
	for _, b := range [][]float64{{1, 1}, {2, 1}, {math.NaN()}} {
		_, err := receiptsotel.New(&receiptsotel.Options{Buckets: b})
		require.ErrorIs(t, err, receipts.ErrInvalidArgument, "%v", b)
	}
}
