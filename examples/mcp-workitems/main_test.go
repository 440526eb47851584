package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/receiptstore/receipts/examples/internal/exampledb"
	"github.com/receiptstore/receipts/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestRun runs the demo on each engine: the first attempt times out, the
// retry is a replay, and the tracker holds one work item (on PostgreSQL, a
// row of the tracker's table, inserted with the receipt).
func TestRun(t *testing.T) {
	for _, engine := range []string{"pebble", "postgresql"} {
		t.Run(engine, func(t *testing.T) {
			o := options{dir: t.TempDir(), slow: 200 * time.Millisecond, timeout: 50 * time.Millisecond}
			if engine == "postgresql" {
				dsn, schema := pgtest.Schema(t)
				o.pg, o.schema = exampledb.PGFlag(dsn), schema
			}
			var out bytes.Buffer
			if err := run(context.Background(), &out, o); err != nil {
				t.Fatalf("%v\n%s", err, out.String())
			}
			for _, want := range []string{
				"attempt 1: no answer within 50ms; retrying with the same key",
				"(replayed: ", // true, unless attempt 1 never reached the server
				"same key, other arguments: idempotency_key_conflict",
				"work items in the tracker: 1\n",
			} {
				if !strings.Contains(out.String(), want) {
					t.Errorf("output lacks %q:\n%s", want, out.String())
				}
			}
		})
	}
}
