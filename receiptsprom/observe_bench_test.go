package receiptsprom_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/receiptstore/receipts/observe"
	"github.com/receiptstore/receipts/receiptsprom"
)

// BenchmarkObserveReplay: the Collector's cost for a replay's ClaimEvent
// alone (what it adds to every replay), from one goroutine and from
// GOMAXPROCS goroutines at once (-cpu).
func BenchmarkObserveReplay(b *testing.B) {
	c := receiptsprom.New(nil)
	prometheus.NewRegistry().MustRegister(c)
	e := observe.Event{Kind: observe.ClaimEvent, Outcome: observe.OutcomeReplayed, Engine: "pebble", Duration: 800 * time.Nanosecond, Attempt: 1}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			c.Observe(bg, e)
		}
	})
}
