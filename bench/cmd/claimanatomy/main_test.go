package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/receiptstore/receipts/bench/internal/pgtemp"
)

// TestRun runs every variant once, briefly, on a throwaway cluster: each gets its row, and
// pgbench ran transactions of each (run fails otherwise), so that no variant's SQL rots.
func TestRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	err := run(ctx, &out, "", time.Second, 1, 100)
	if errors.Is(err, pgtemp.ErrNoServer) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + out.String())
	for _, v := range variants {
		if !strings.Contains(out.String(), " "+v.name+" ") {
			t.Errorf("no row for %s:\n%s", v.name, out.String())
		}
	}
}

// TestParse reads pgbench -r's sections: the claim is every line but \set and the last (a
// pipeline's time is on its \endpipeline line), the finish the last.
func TestParse(t *testing.T) {
	out := `latency average = 1.280 ms
SQL script 1: /tmp/x/floor.sql
 - weight: 1 (targets 50.0% of total)
 - 1125 transactions (48.2% of total, tps = 376.906645)
 - statement latencies in milliseconds and failures:
         0.001           0  \set k random(1, 2000000000)
         0.080           0  INSERT INTO pg_floor
         0.070           0  UPDATE pg_floor SET
SQL script 2: /tmp/x/flat-pipelined.sql
 - weight: 1 (targets 50.0% of total)
 - 1207 transactions (51.8% of total, tps = 404.378952)
 - statement latencies in milliseconds and failures:
         0.001           0  \set k random(1, 2000000000)
         0.003           0  \startpipeline
         0.000           0  SELECT pg_advisory_xact_lock(7, 12345)
         0.000           0  WITH t AS MATERIALIZED
         0.140           0  \endpipeline
         0.100           0  WITH t AS MATERIALIZED (SELECT
`
	got, err := parse(out)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]timing{"floor": {n: 1125, claim: 80, finish: 70}, "flat-pipelined": {n: 1207, claim: 143, finish: 100}}
	for name, w := range want {
		g := got[name]
		if g.n != w.n || !near(g.claim, w.claim) || !near(g.finish, w.finish) {
			t.Errorf("%s: got %+v, want %+v", name, g, w)
		}
	}
}

func near(a, b float64) bool { return a-b < 0.01 && b-a < 0.01 }
