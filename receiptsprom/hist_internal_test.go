package receiptsprom

import (
	"math"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
)

// A hist reports what a prometheus.Histogram with the same buckets
// reports for the same observations, made from many goroutines at once
// (so over every shard): count, sum and each cumulative bucket, bounds
// included (a bucket's upper bound is inclusive), and values past the last.
func TestHistMatchesPrometheus(t *testing.T) {
	for _, buckets := range [][]float64{DefaultBuckets, {0.5, 1, math.Inf(+1)}, nil} {
		upper := bucketBounds(buckets)
		want := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "h", Help: "h", Buckets: buckets})
		desc := prometheus.NewDesc("h", "h", []string{"l"}, nil)
		got := newHist(desc, upper, "v")
		vals := []float64{0, -1, 0.00005, 0.00004999, 0.5, 0.5000001, 1, 2.5, 299, 300, 301, 1e9}
		var wg sync.WaitGroup
		for g := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 500 {
					v := vals[(g+i)%len(vals)]
					want.Observe(v)
					got.observe(stripe(), v)
				}
			}()
		}
		wg.Wait()
		var w, g dto.Metric
		require.NoError(t, want.Write(&w))
		require.NoError(t, got.metric().Write(&g))
		wh, gh := w.GetHistogram(), g.GetHistogram()
		require.Equal(t, wh.GetSampleCount(), gh.GetSampleCount())
		require.InEpsilon(t, wh.GetSampleSum(), gh.GetSampleSum(), 1e-9)
		require.Len(t, gh.GetBucket(), len(wh.GetBucket()))
		for i, b := range wh.GetBucket() {
			require.Equal(t, b.GetUpperBound(), gh.GetBucket()[i].GetUpperBound())
			require.Equal(t, b.GetCumulativeCount(), gh.GetBucket()[i].GetCumulativeCount(), "bucket %v", b.GetUpperBound())
		}
		require.Equal(t, "v", g.GetLabel()[0].GetValue())
	}
}

func TestBucketBoundsMustIncrease(t *testing.T) {
	require.Panics(t, func() { bucketBounds([]float64{1, 1}) })
	require.Panics(t, func() { bucketBounds([]float64{2, 1}) })
}

// A ctr counts every inc, made from many goroutines at once.
func TestCtrCountsEveryInc(t *testing.T) {
	c := newCtr(prometheus.NewDesc("c", "c", []string{"l"}, nil), "v")
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 500 {
				c.inc(stripe())
			}
		}()
	}
	wg.Wait()
	var m dto.Metric
	require.NoError(t, c.metric().Write(&m))
	require.Equal(t, 8000.0, m.GetCounter().GetValue())
	require.Equal(t, "v", m.GetLabel()[0].GetValue())
}

// stripe is in range, stays the same on one goroutine, and spreads
// goroutines over the stripes.
func TestStripeSpreadsGoroutines(t *testing.T) {
	const n = 64
	got := make([]int, n)
	var wg sync.WaitGroup
	for g := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sh := stripe()
			for range 100 {
				if stripe() != sh {
					sh = -1
				}
			}
			got[g] = sh
		}()
	}
	wg.Wait()
	seen := map[int]bool{}
	for _, sh := range got {
		require.True(t, sh >= 0 && sh < 8, "stripe %d: out of range, or not the same on one goroutine", sh)
		seen[sh] = true
	}
	require.GreaterOrEqual(t, len(seen), 4, "64 goroutines over 8 stripes: %v", got)
}
