package receiptsprom

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/receiptstore/receipts/internal/hot"
)

// hist is one series of a duration histogram: a hot.Hist (striped, summed
// at scrape time) reported as a constant histogram with the same buckets,
// name, help and labels as the prometheus.HistogramVec it replaces.
type hist struct {
	desc   *prometheus.Desc
	labels []string // label values, in desc's order
	h      *hot.Hist
}

func newHist(desc *prometheus.Desc, upper []float64, labels ...string) *hist {
	return &hist{desc: desc, labels: labels, h: hot.NewHist(upper)}
}

// stripe picks the stripe an event's adds go to (hot.Pick: by the calling
// goroutine's stack, so a goroutine keeps to one). One event's adds (its
// counter and histograms) share one pick.
func stripe() int { return hot.Pick() }

// observe adds v (seconds) in stripe sh.
func (h *hist) observe(sh int, v float64) { h.h.Observe(sh, v) }

// metric is the histogram's current value, a constant metric for a scrape.
func (h *hist) metric() prometheus.Metric {
	counts, n, sum := h.h.Snapshot()
	buckets := make(map[float64]uint64, len(h.h.Upper()))
	var cum uint64
	for i, ub := range h.h.Upper() {
		cum += counts[i]
		buckets[ub] = cum
	}
	return prometheus.MustNewConstHistogram(h.desc, n, sum, buckets, h.labels...)
}

// ctr is one series of a counter, a hot.Counter (striped) reported as a
// constant counter.
type ctr struct {
	desc   *prometheus.Desc
	labels []string
	c      hot.Counter
}

func newCtr(desc *prometheus.Desc, labels ...string) *ctr {
	return &ctr{desc: desc, labels: labels}
}

// inc adds one in stripe sh.
func (c *ctr) inc(sh int) { c.c.AddAt(sh, 1) }

// metric is the counter's current value, a constant metric for a scrape.
func (c *ctr) metric() prometheus.Metric {
	return prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(c.c.Load()), c.labels...)
}
