package main

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/receiptstore/receipts/observe"
	"github.com/receiptstore/receipts/receiptsotel"
	"github.com/receiptstore/receipts/receiptsprom"
)

// observerStores are receipts (Pebble) with an observer set, the cost of an observer being
// receipts next to it in the same run (issue 44 §3):
//
//	receipts-prom      receiptsprom's Collector, registered
//	receipts-otel      receiptsotel sampling 1% of the traces itself (SampleRatio), its
//	                   metrics aggregated by the observer (Producer) for a ManualReader
//	receipts-otel-sdk  the same with the metrics through the SDK's synchronous instruments
//
// The spans go to a batcher whose exporter drops them.
var observerStores = []string{"receipts-prom", "receipts-otel", "receipts-otel-sdk"}

// benchObserver is the observer of one of observerStores, and what shuts it down.
func benchObserver(name string) (observe.Observer, func(), error) {
	if name == "receipts-prom" {
		c := receiptsprom.New(nil)
		if err := prometheus.NewRegistry().Register(c); err != nil {
			return nil, nil, err
		}
		return c, func() {}, nil
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(dropSpans{}))
	var mp *sdkmetric.MeterProvider
	var o *receiptsotel.Observer
	var err error
	if name == "receipts-otel" {
		o, err = receiptsotel.New(&receiptsotel.Options{TracerProvider: tp, SampleRatio: 0.01, Producer: true})
		if err == nil {
			mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader(sdkmetric.WithProducer(o))))
		}
	} else {
		mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
		o, err = receiptsotel.New(&receiptsotel.Options{TracerProvider: tp, MeterProvider: mp, SampleRatio: 0.01})
	}
	stop := func() {
		_ = tp.Shutdown(context.Background())
		if mp != nil {
			_ = mp.Shutdown(context.Background())
		}
	}
	if err != nil {
		stop()
		return nil, nil, fmt.Errorf("%s: %w", name, err)
	}
	return o, stop, nil
}

// dropSpans is a span exporter that drops everything.
type dropSpans struct{}

func (dropSpans) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (dropSpans) Shutdown(context.Context) error                             { return nil }
