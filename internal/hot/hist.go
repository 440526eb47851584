package hot

import (
	"math"
	"sync/atomic"

	"github.com/receiptstore/receipts/internal/mutate"
)

// Pick returns the calling goroutine's stripe for a Counter's AddAt and a
// Hist's Observe, so that one event's adds (a counter and its histograms)
// share one pick.
func Pick() int { return Stripe(counterBits) }

// AddAt adds n in stripe sh (Pick).
func (c *Counter) AddAt(sh int, n uint64) { c.s[sh].n.Add(n) }

// Hist is a histogram that many goroutines observe at once and few read
// (the observers' duration histograms): a count per bucket and the sum,
// striped like a Counter, summed by Snapshot. (A single set of counters, as
// prometheus.Histogram has, made its atomic adds most of an event's cost
// at high concurrency.)
type Hist struct {
	upper  []float64 // bucket upper bounds, ascending, +Inf implicit
	stride int       // words per stripe: the sum, a count per bucket and +Inf, padding
	// words holds the stripes, stride words each: word 0 the sum (float64
	// bits), then the count of each bucket (not cumulative), the last one
	// +Inf.
	words []atomic.Uint64
}

// NewHist returns a Hist with buckets whose upper bounds (inclusive, as
// Prometheus's le and OpenTelemetry's explicit buckets) are upper, which
// must increase; values above the last fall in +Inf.
func NewHist(upper []float64) *Hist {
	// A stripe's first words (the sum and the low buckets, which fast
	// operations hit) are at least a cache line away from the next one's.
	stride := len(upper) + 2 + 8
	return &Hist{upper: upper, stride: stride, words: make([]atomic.Uint64, (1<<counterBits)*stride)}
}

// Upper returns the buckets' upper bounds (not to be modified).
func (h *Hist) Upper() []float64 { return h.upper }

// Observe adds v in stripe sh (Pick).
func (h *Hist) Observe(sh int, v float64) {
	i := 0
	for i < len(h.upper) && v > h.upper[i] {
		i++
	}
	w := h.words[sh*h.stride:]
	w[1+i].Add(1)
	for {
		old := w[0].Load()
		if w[0].CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+v)) {
			return
		}
	}
}

// Snapshot returns the count of each bucket (not cumulative; the last is
// +Inf's), their total and the sum of the values: observations racing
// with it may or may not be in it.
func (h *Hist) Snapshot() (counts []uint64, count uint64, sum float64) {
	counts = make([]uint64, len(h.upper)+1)
	stripes := 1 << counterBits
	if mutate.Name == mutate.HistShard {
		stripes = 1
	}
	for s := range stripes {
		w := h.words[s*h.stride:]
		sum += math.Float64frombits(w[0].Load())
		for i := range counts {
			counts[i] += w[1+i].Load()
		}
	}
	for _, n := range counts {
		count += n
	}
	return counts, count, sum
}
