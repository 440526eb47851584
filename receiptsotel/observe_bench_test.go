package receiptsotel_test

import (
	"context"
	"testing"
	"time"

	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/receiptstore/receipts/observe"
	"github.com/receiptstore/receipts/receiptsotel"
)

// BenchmarkReplayEvents: what the Observer does for one replay through Do,
// with no store under it: Begin of the Do and of its claim, then the
// claim's and the Do's events. sdk-1pct samples 1% with the SDK's sampler
// (ParentBased(TraceIDRatioBased)); own-1pct with Options.SampleRatio;
// own-1pct-nometrics the same with a no-op MeterProvider.
func BenchmarkReplayEvents(b *testing.B) {
	for _, c := range []struct {
		name    string
		sampler sdktrace.Sampler
		ratio   float64
		metrics bool
	}{
		{"sdk-1pct", sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0.01)), 0, true},
		{"own-1pct", nil, 0.01, true},
		{"own-1pct-nometrics", nil, 0.01, false},
	} {
		b.Run(c.name, func(b *testing.B) {
			topts := []sdktrace.TracerProviderOption{sdktrace.WithBatcher(dropExporter{})}
			if c.sampler != nil {
				topts = append(topts, sdktrace.WithSampler(c.sampler))
			}
			tp := sdktrace.NewTracerProvider(topts...)
			defer func() { _ = tp.Shutdown(bg) }()
			opts := &receiptsotel.Options{TracerProvider: tp, MeterProvider: metricnoop.NewMeterProvider(), SampleRatio: c.ratio}
			if c.metrics {
				mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
				defer func() { _ = mp.Shutdown(bg) }()
				opts.MeterProvider = mp
			}
			o, err := receiptsotel.New(opts)
			if err != nil {
				b.Fatal(err)
			}
			start := time.Now()
			claim := observe.Event{Kind: observe.ClaimEvent, Outcome: observe.OutcomeReplayed, Engine: "pebble", Start: start, Duration: 800 * time.Nanosecond, Attempt: 1}
			do := claim
			do.Kind = observe.DoEvent
			b.ReportAllocs()
			for b.Loop() {
				ctx := o.Begin(bg, observe.DoEvent)
				cctx := o.Begin(ctx, observe.ClaimEvent)
				o.Observe(cctx, claim)
				o.Observe(ctx, do)
			}
		})
	}
}

// dropExporter is a span exporter that drops everything.
type dropExporter struct{}

func (dropExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (dropExporter) Shutdown(context.Context) error                             { return nil }
