// Package workload holds what every benchmarked store shares: the keys and payloads of an
// operation, a latency histogram, and a runner that drives a store at a fixed concurrency
// for a fixed time.
package workload

import (
	"math/bits"
	"time"
)

// subBits sets the histogram's precision: 2^subBits buckets per power of two, so a
// percentile is off by at most 1/2^subBits (about 1.6%) of its value.
const subBits = 6

const subCount = 1 << subBits

// Hist is a log-linear latency histogram. The zero value is empty and ready to use.
// It is not safe for concurrent use: give each goroutine its own and Merge them.
type Hist struct {
	counts [64 * subCount]uint64
	n      uint64
	sum    time.Duration
	max    time.Duration
}

func bucket(ns uint64) int {
	if ns < subCount {
		return int(ns)
	}
	exp := bits.Len64(ns) - subBits - 1 // >= 0
	sub := (ns >> uint(exp)) & (subCount - 1)
	return (exp+1)*subCount + int(sub)
}

// lowerBound is the smallest value that falls into bucket i.
func lowerBound(i int) uint64 {
	if i < subCount {
		return uint64(i)
	}
	exp := i/subCount - 1
	sub := uint64(i % subCount)
	return (subCount | sub) << uint(exp)
}

// Record adds one observation.
func (h *Hist) Record(d time.Duration) {
	if d < 0 {
		d = 0
	}
	h.counts[bucket(uint64(d))]++
	h.n++
	h.sum += d
	if d > h.max {
		h.max = d
	}
}

// Merge adds o's observations to h.
func (h *Hist) Merge(o *Hist) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.sum += o.sum
	if o.max > h.max {
		h.max = o.max
	}
}

// Count is the number of observations.
func (h *Hist) Count() uint64 { return h.n }

// Mean is the average observation.
func (h *Hist) Mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return h.sum / time.Duration(h.n)
}

// Max is the largest observation.
func (h *Hist) Max() time.Duration { return h.max }

// Quantile returns the q-quantile (0 < q <= 1), as the midpoint of its bucket.
func (h *Hist) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(q*float64(h.n) + 0.5)
	if rank < 1 {
		rank = 1
	}
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			lo, hi := lowerBound(i), lowerBound(i+1)
			v := time.Duration(lo + (hi-lo)/2)
			if v > h.max {
				v = h.max
			}
			return v
		}
	}
	return h.max
}
