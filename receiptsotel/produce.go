package receiptsotel

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// Produce returns the metrics the Observer has aggregated since New
// (sdkmetric.Producer), cumulative, when it was made with
// Options.Producer; otherwise nothing (its metrics go through the
// MeterProvider). Series that never counted anything are left out. It is
// safe to call concurrently with the store's operations and with itself.
func (o *Observer) Produce(context.Context) ([]metricdata.ScopeMetrics, error) {
	if !o.produce {
		return nil, nil
	}
	now := time.Now()
	var counts [numCounters][]metricdata.DataPoint[int64]
	var opDur, waitDur []metricdata.HistogramDataPoint[float64]
	o.sets.Range(func(k, v any) bool {
		op, m := k.(setKey).op, v.(*measureOpts)
		if op == "" {
			for i := range m.counts {
				if n := m.counts[i].Load(); n > 0 {
					counts[i] = append(counts[i], metricdata.DataPoint[int64]{Attributes: m.set, StartTime: o.start, Time: now, Value: int64(n)})
				}
			}
		}
		bucketCounts, n, sum := m.dur.Snapshot()
		if n == 0 {
			return true
		}
		dp := metricdata.HistogramDataPoint[float64]{Attributes: m.set, StartTime: o.start, Time: now,
			Count: n, Bounds: o.upper, BucketCounts: bucketCounts, Sum: sum}
		if op == "" {
			waitDur = append(waitDur, dp)
		} else {
			opDur = append(opDur, dp)
		}
		return true
	})
	var ms []metricdata.Metrics
	for i, in := range counterMetrics {
		if len(counts[i]) > 0 {
			ms = append(ms, metricdata.Metrics{Name: in.name, Description: in.desc, Unit: in.unit,
				Data: metricdata.Sum[int64]{DataPoints: counts[i], Temporality: metricdata.CumulativeTemporality, IsMonotonic: true}})
		}
	}
	for _, h := range []struct {
		in  instrument
		dps []metricdata.HistogramDataPoint[float64]
	}{{opDurMetric, opDur}, {waitDurMetric, waitDur}} {
		if len(h.dps) > 0 {
			ms = append(ms, metricdata.Metrics{Name: h.in.name, Description: h.in.desc, Unit: h.in.unit,
				Data: metricdata.Histogram[float64]{DataPoints: h.dps, Temporality: metricdata.CumulativeTemporality}})
		}
	}
	if len(ms) == 0 {
		return nil, nil
	}
	return []metricdata.ScopeMetrics{{Scope: instrumentation.Scope{Name: ScopeName}, Metrics: ms}}, nil
}
