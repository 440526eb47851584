package workload

import (
	"testing"
	"time"
)

func TestHistQuantiles(t *testing.T) {
	var h Hist
	for i := 1; i <= 10000; i++ {
		h.Record(time.Duration(i) * time.Microsecond)
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 5000 * time.Microsecond}, {0.99, 9900 * time.Microsecond}, {1, 10000 * time.Microsecond}} {
		got := h.Quantile(c.q)
		if diff := float64(got-c.want) / float64(c.want); diff > 0.02 || diff < -0.02 {
			t.Errorf("Quantile(%v) = %v, want %v within 2%%", c.q, got, c.want)
		}
	}
	if h.Count() != 10000 {
		t.Errorf("Count = %d, want 10000", h.Count())
	}
}

func TestBucketBounds(t *testing.T) {
	for _, v := range []uint64{0, 1, 63, 64, 65, 127, 128, 1000, 1 << 20, 1<<40 + 12345} {
		i := bucket(v)
		if lo, hi := lowerBound(i), lowerBound(i+1); v < lo || v >= hi {
			t.Errorf("value %d in bucket %d = [%d, %d)", v, i, lo, hi)
		}
	}
}
