package receiptsprom

import (
	"math"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/receiptstore/receipts/internal/hot"
	"github.com/receiptstore/receipts/internal/mutate"
)

// histShards is how many stripes a hist spreads its counts over, so that
// goroutines on different cores rarely add to the same cache line (a
// prometheus.Histogram has one set of counters, and at high concurrency its
// four atomic adds per observation were most of an event's cost).
const histShards = 1 << histShardBits

// hist is one series of a duration histogram: counts per bucket and the
// sum, striped over histShards, summed at scrape time into a constant
// histogram with the same buckets, name, help and labels as the
// prometheus.HistogramVec it replaces.
type hist struct {
	desc   *prometheus.Desc
	labels []string  // label values, in desc's order
	upper  []float64 // bucket upper bounds, ascending (Options.Buckets)
	stride int       // words per shard: the sum, a count per bucket and +Inf, padding
	// words holds histShards shards of stride words: word 0 the sum
	// (float64 bits), then the count of each bucket (not cumulative), the
	// last one +Inf.
	words []atomic.Uint64
}

func newHist(desc *prometheus.Desc, upper []float64, labels ...string) *hist {
	// A shard's first words (the sum and the low buckets, which fast
	// operations hit) are at least a cache line away from the next shard's.
	stride := len(upper) + 2 + 8
	return &hist{desc: desc, labels: labels, upper: upper, stride: stride, words: make([]atomic.Uint64, histShards*stride)}
}

// stripe picks the stripe an event's adds go to (hot.Stripe: by the
// calling goroutine's stack, so a goroutine keeps to one). One event's adds
// (its counter and histograms) share one pick.
func stripe() int { return hot.Stripe(histShardBits) }

// histShardBits is log2(histShards).
const histShardBits = 3

// observe adds v (seconds) in stripe sh.
func (h *hist) observe(sh int, v float64) {
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

// metric is the histogram's current value, a constant metric for a scrape.
func (h *hist) metric() prometheus.Metric {
	counts := make([]uint64, len(h.upper)+1)
	var sum float64
	shards := histShards
	if mutate.Name == mutate.HistShard {
		shards = 1
	}
	for s := range shards {
		w := h.words[s*h.stride:]
		sum += math.Float64frombits(w[0].Load())
		for i := range counts {
			counts[i] += w[1+i].Load()
		}
	}
	buckets := make(map[float64]uint64, len(h.upper))
	var n uint64
	for i, ub := range h.upper {
		n += counts[i]
		buckets[ub] = n
	}
	n += counts[len(h.upper)]
	return prometheus.MustNewConstHistogram(h.desc, n, sum, buckets, h.labels...)
}

// ctr is one series of a counter, striped like a hist (one cache line per
// stripe), summed at scrape time into a constant counter.
type ctr struct {
	desc   *prometheus.Desc
	labels []string
	words  [histShards * 8]atomic.Uint64 // stripe i is words[i*8]
}

func newCtr(desc *prometheus.Desc, labels ...string) *ctr {
	return &ctr{desc: desc, labels: labels}
}

// inc adds one in stripe sh.
func (c *ctr) inc(sh int) { c.words[sh*8].Add(1) }

// metric is the counter's current value, a constant metric for a scrape.
func (c *ctr) metric() prometheus.Metric {
	shards := histShards
	if mutate.Name == mutate.HistShard {
		shards = 1
	}
	var n uint64
	for s := range shards {
		n += c.words[s*8].Load()
	}
	return prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(n), c.labels...)
}
