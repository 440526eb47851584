package receiptsprom_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/observe"
	"github.com/receiptstore/receipts/receiptsprom"
	"github.com/receiptstore/receipts/receiptstest"
)

// eventsOnly is a Collector without ObserveReplay and BeginAt: the store reports every
// replay to it as a ClaimEvent, as to any Observer.
type eventsOnly struct{ c *receiptsprom.Collector }

func (e eventsOnly) Observe(ctx context.Context, ev observe.Event) { e.c.Observe(ctx, ev) }
func (e eventsOnly) ObservesKind(kind observe.EventKind) bool      { return e.c.ObservesKind(kind) }

// The Collector as an observe.ReplayObserver (a Do's replay answered at once is one
// ObserveReplay) exports the same series with the same counts as the same Collector given
// every replay as events, on both engines: first calls, replays (with a class and without),
// a failed receipt and its replay, a mismatch, a nested Do, a replay after a wait.
func TestReplayObserverMatchesEvents(t *testing.T) {
	engines(t, func(t *testing.T, open store) {
		want, engine := replayScenario(t, open, true)
		got, _ := replayScenario(t, open, false)
		require.Contains(t, want, `receipts_claims_total{class="refund",engine="`+engine+`",outcome="replayed"}`)
		require.Equal(t, slices.Sorted(maps.Keys(want)), slices.Sorted(maps.Keys(got)), "the same series")
		require.Equal(t, want, got)
	})
}

// replayScenario runs receiptstest.ObserverCalls (with a class) on a store open opens,
// observed by a Collector (given every replay as events if events is set), and returns
// each series' count (a counter's value, a histogram's sample count; gauges left out) and
// the engine's name.
func replayScenario(t *testing.T, open store, events bool) (map[string]string, string) {
	c := receiptsprom.New(nil)
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	var o observe.Observer = c
	if events {
		o = eventsOnly{c}
	}
	db := open(t, o, receiptstest.NewClock(time.Time{}))
	ok := func(context.Context, *receipts.Lease) ([]byte, error) { return []byte("ok"), nil }
	receiptstest.ObserverCalls(t, db, observe.WithOperationClass(bg, "refund"), "s-"+fmt.Sprint(events), ok)

	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]string{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := ""
			for _, lp := range m.GetLabel() {
				labels += fmt.Sprintf("%s=%q,", lp.GetName(), lp.GetValue())
			}
			name := mf.GetName() + "{" + labels[:max(len(labels)-1, 0)] + "}"
			switch {
			case m.Counter != nil:
				out[name] = fmt.Sprint(m.GetCounter().GetValue())
			case m.Histogram != nil:
				out[name] = fmt.Sprint(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out, db.Driver().Name()
}
