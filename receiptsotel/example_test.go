package receiptsotel_test

import (
	"context"
	"fmt"
	"log"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/receiptstore/receipts/receiptsotel"
)

// An Observer that aggregates its metrics itself (Options.Producer) and
// traces 1% of the operations that begin a trace: its metrics reach the
// readers it is registered with (here a ManualReader; in a service, a
// PeriodicReader with an exporter).
func ExampleOptions_producer() {
	ctx := context.Background()
	obs, err := receiptsotel.New(&receiptsotel.Options{Producer: true, SampleRatio: 0.01})
	if err != nil {
		log.Fatal(err)
	}
	reader := sdkmetric.NewManualReader(sdkmetric.WithProducer(obs))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(ctx) }()

	db, err := pebblestore.Open("db", &pebblestore.Options{
		Options: receipts.Options{Observer: obs},
		Pebble:  &pebble.Options{FS: vfs.NewMem()},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	k := receipts.Key{Scope: "tenant-1", ID: "op-1"}
	for range 3 { // one execution, two replays
		if _, err := db.Do(ctx, k, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
			return []byte("done"), nil
		}); err != nil {
			log.Fatal(err)
		}
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		log.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok {
				for _, dp := range sum.DataPoints {
					out, _ := dp.Attributes.Value("receipts.outcome")
					fmt.Println(m.Name, out.AsString(), dp.Value)
				}
			}
		}
	}
	// Unordered output:
	// receipts.claims claimed 1
	// receipts.claims replayed 2
	// receipts.finishes succeeded 1
}
