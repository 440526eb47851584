package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"github.com/jackc/pgx/v5"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/receiptstore/receipts/bench/internal/pgtemp"
	"github.com/receiptstore/receipts/bench/internal/workload"
)

func TestParseFlags(t *testing.T) {
	cfg, err := parseFlags([]string{"-quick", "-conc", "2,4", "-stores", "bbolt,sqlite", "-mem=10M"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.duration != time.Second || len(cfg.concs) != 2 || !cfg.stores["sqlite"] || cfg.stores["receipts"] || cfg.mem != 10_000_000 {
		t.Errorf("parsed %+v", cfg)
	}
	if cfg, _ := parseFlags([]string{"-mem"}); cfg.mem != 1_000_000 {
		t.Errorf("-mem alone = %d, want 1M", cfg.mem)
	}
	for _, bad := range [][]string{{"-conc", "0"}, {"-stores", "mysql"}, {"-duration", "0s"}, {"extra"}} {
		if _, err := parseFlags(bad); err == nil {
			t.Errorf("parseFlags(%q) accepted", bad)
		}
	}
}

// TestParseScale checks -scale: a count like -mem's, off by default, the floor and
// receipts with new and replay unless told otherwise, and no other store.
func TestParseScale(t *testing.T) {
	cfg, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.scale != 0 || !cfg.stores["bbolt"] || !cfg.workloads["hot"] {
		t.Errorf("default run changed: scale %d, stores %v, workloads %v", cfg.scale, cfg.stores, cfg.workloads)
	}
	for arg, want := range map[string]countFlag{"1M": 1_000_000, "10M": 10_000_000, "250k": 250_000, "5000": 5000} {
		cfg, err := parseFlags([]string{"-scale", arg})
		if err != nil {
			t.Fatalf("-scale %s: %v", arg, err)
		}
		if cfg.scale != want {
			t.Errorf("-scale %s = %d, want %d", arg, cfg.scale, want)
		}
		if len(cfg.stores) != 2 || !cfg.stores["pebble-floor"] || !cfg.stores["receipts"] {
			t.Errorf("-scale %s: stores %v, want pebble-floor and receipts", arg, cfg.stores)
		}
		if len(cfg.workloads) != 2 || !cfg.workloads["new"] || !cfg.workloads["replay"] {
			t.Errorf("-scale %s: workloads %v, want new and replay", arg, cfg.workloads)
		}
	}
	cfg, err = parseFlags([]string{"-scale=2M", "-stores", "receipts", "-workloads", "replay", "-conc", "1,8,64"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.scale != 2_000_000 || len(cfg.stores) != 1 || len(cfg.workloads) != 1 || len(cfg.concs) != 3 {
		t.Errorf("parsed %+v", cfg)
	}
	for _, bad := range [][]string{{"-scale", "x"}, {"-scale", "-1"}, {"-scale", "1G"}, {"-scale"},
		{"-scale", "1M", "-stores", "pebble-floor,bbolt"}, {"-scale", "1M", "-mem"}} {
		if _, err := parseFlags(bad); err == nil {
			t.Errorf("parseFlags(%q) accepted", bad)
		}
	}
}

// TestScaleKeys checks that -scale's replay sample is spread over the whole loaded key
// set: entry i is one of the loaded keys of the i-th stretch, with its fingerprint.
func TestScaleKeys(t *testing.T) {
	const n, m = 1000, 64
	ks := newScaleKeys(n, m)
	for i := range m {
		k, fp := ks.key(i)
		lo, hi := i*n/m, (i+1)*n/m
		found := false
		for x := lo; x < hi && !found; x++ {
			found = workload.UUIDKey(uint64(x)) == k
		}
		if !found {
			t.Errorf("entry %d: %v is none of the keys %d..%d", i, k, lo, hi-1)
		}
		if !bytes.Equal(fp, workload.Fingerprint(k)) {
			t.Errorf("entry %d: wrong fingerprint", i)
		}
	}
}

// capture sends the tool's output to a buffer until t ends.
func capture(t *testing.T) *bytes.Buffer {
	var out bytes.Buffer
	stdout = &out
	t.Cleanup(func() { stdout = os.Stdout })
	return &out
}

// compareJSON runs receiptbench with args and -json, and returns its report and its
// configuration.
func compareJSON(t *testing.T, args ...string) (report, *config) {
	t.Helper()
	cfg, err := parseFlags(append(args, "-json"))
	if err != nil {
		t.Fatal(err)
	}
	out := capture(t)
	if err := runCompare(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	var rep report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("JSON: %v\n%s", err, out.String())
	}
	return rep, cfg
}

// TestScale runs -scale on a small store: both stores loaded, new and replay on them (a
// replay of a key that was not loaded fails the row), and the RSS reported.
func TestScale(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the stores")
	}
	rep, cfg := compareJSON(t, "-scale", "3000", "-duration", "20ms", "-conc", "1,4", "-dir", t.TempDir())
	if len(rep.Results) != 8 {
		t.Errorf("%d rows, want 8 (new and replay, 2 stores, 2 concurrencies)", len(rep.Results))
	}
	for _, r := range rep.Results {
		if r.Error != "" || r.Ops == 0 || r.RatioToFloor <= 0 {
			t.Errorf("%s %s conc=%d: %d ops, ratio %.2f, error %q", r.Workload, r.Store, r.Conc, r.Ops, r.RatioToFloor, r.Error)
		}
	}
	sc := rep.Scale
	if sc == nil || sc.Receipts != 3000 || sc.ReplaySample != 3000 || sc.RSSBytes == 0 || sc.RSSBothBytes == 0 ||
		sc.LoadOpsPerSec["receipts"] <= 0 || sc.LoadOpsPerSec["pebble-floor"] <= 0 || sc.DiskBytes["receipts"] == 0 {
		t.Errorf("scale report: %+v", sc)
	}
	var out bytes.Buffer
	cfg.json = false
	printTable(&out, &rep, cfg)
	for _, want := range []string{"keys sampled evenly from all 3000", "receipts' store alone", "x floor"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}

// TestCompareTable runs every workload briefly on the stores that need no server and
// checks the table and the JSON.
func TestCompareTable(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the stores")
	}
	cfg, err := parseFlags([]string{"-duration", "20ms", "-replay-keys", "64", "-conc", "1,4", "-stores", "pebble-floor,receipts,bbolt,sqlite", "-dir", t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	out := capture(t)
	if err := runCompare(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"pebble-floor", "receipts", "bbolt", "sqlite", "hot-retry", "x floor"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "ERROR") {
		t.Errorf("a configuration failed:\n%s", out.String())
	}
	out.Reset()
	cfg.json = true
	cfg.workloads = map[string]bool{"new": true}
	cfg.stores = map[string]bool{"pebble-floor": true, "bbolt": true}
	if err := runCompare(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	var rep report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("JSON: %v\n%s", err, out.String())
	}
	if len(rep.Results) != 4 || rep.Results[0].RatioToFloor != 1 {
		t.Errorf("JSON results: %+v", rep.Results)
	}
	saved := filepath.Join(t.TempDir(), "run.json")
	if err := os.WriteFile(saved, out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	cfg, err = parseFlags([]string{"-table", saved})
	if err != nil {
		t.Fatal(err)
	}
	if err := printSaved(cfg); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "bbolt") || !strings.Contains(out.String(), "x floor") {
		t.Errorf("table from JSON:\n%s", out.String())
	}

	// The same run as CSV: a header and a row per result, ratios kept.
	out.Reset()
	if cfg, err = parseFlags([]string{"-table", saved, "-csv"}); err != nil {
		t.Fatal(err)
	}
	if err := printSaved(cfg); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(out).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1+len(rep.Results) || rows[0][0] != "workload" || rows[1][2] != rep.Results[0].Store || rows[1][9] != "1" {
		t.Errorf("CSV rows: %q", rows)
	}
}

// testPG returns the DSN of a throwaway cluster for this test, or skips it.
func testPG(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a PostgreSQL cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := pgtemp.Start(ctx)
	if errors.Is(err, pgtemp.ErrNoServer) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
	})
	return c.DSN
}

// TestComparePG runs the PostgreSQL rows briefly on one cluster: every store's first
// calls run once and its replays read committed receipts; then -purge and -wake on small
// sizes.
func TestComparePG(t *testing.T) {
	dsn := testPG(t)
	rep, _ := compareJSON(t, "-dsn", dsn, "-duration", "50ms", "-replay-keys", "32", "-aged-receipts", "2", "-conc", "1,4",
		"-stores", strings.Join(pgStores, ","), "-workloads", "new,replay", "-dir", t.TempDir())
	seen := map[string]int{}
	for _, r := range rep.Results {
		if r.Error != "" || r.Ops == 0 {
			t.Errorf("%s %s conc=%d: %d ops, error %q", r.Workload, r.Store, r.Conc, r.Ops, r.Error)
		}
		if r.RatioToPGFl <= 0 {
			t.Errorf("%s %s conc=%d: no ratio to pg-floor", r.Workload, r.Store, r.Conc)
		}
		if r.RatioToPGTx <= 0 {
			t.Errorf("%s %s conc=%d: no ratio to pg-tx-floor", r.Workload, r.Store, r.Conc)
		}
		seen[r.Store]++
	}
	for _, s := range pgStores {
		if seen[s] != 4 {
			t.Errorf("%s: %d rows, want 4 (new and replay at 1 and 4)", s, seen[s])
		}
	}
	// receipts-pg-aged ran on an aged schema: a records partition with receipts for every
	// live epoch (Retention 1h, epochs of 15 min) beside the two ahead, and the markers GC
	// wrote in the partitions in force; receipts-pg on a young one.
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	shape := func(schema string) (records, filled, markerParts, markers int) {
		t.Helper()
		rows, err := conn.Query(context.Background(), `SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = $1 AND c.relkind = 'r' AND c.relname ~ '^(records|markers)_e'`, schema)
		if err != nil {
			t.Fatal(err)
		}
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range names {
			var n int
			if err := conn.QueryRow(context.Background(), `SELECT count(*) FROM `+pgx.Identifier{schema, name}.Sanitize()).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if strings.HasPrefix(name, "records_") {
				records++
				if n > 0 {
					filled++
				}
			} else {
				markerParts++
				markers += n
			}
		}
		return records, filled, markerParts, markers
	}
	if r, f, mp, m := shape("bench_receipts_pg_aged"); r < 6 || f < 4 || mp < 3 || m == 0 {
		t.Errorf("receipts-pg-aged: %d records partitions (%d with records), %d markers partitions holding %d markers: not aged", r, f, mp, m)
	}
	if r, _, mp, _ := shape("bench_receipts_pg"); r > 3 || mp > 1 {
		t.Errorf("receipts-pg: %d records partitions, %d markers partitions: not a young store", r, mp)
	}

	out := capture(t)
	cfg, err := parseFlags([]string{"-dsn", dsn, "-purge=3000"})
	if err != nil {
		t.Fatal(err)
	}
	if err := runPurge(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"pgstore GC (drop partitions)", "batched DELETE (FGI-style cleanup)  3,000", "0 left"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("purge output lacks %q:\n%s", want, out.String())
		}
	}

	out.Reset()
	cfg, err = parseFlags([]string{"-dsn", dsn, "-wake", "-wake-samples", "3"})
	if err != nil {
		t.Fatal(err)
	}
	if err := runWake(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"LISTEN (coalesced NOTIFY)", "poll-only"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("wake output lacks %q:\n%s", want, out.String())
		}
	}
}

// The observer stores (receipts with receiptsprom, receiptsotel with its own aggregation, and
// receiptsotel through the SDK's instruments) run every workload beside receipts, and their
// observers are shut down with them: no goroutine of theirs outlives the run.
func TestObserverStores(t *testing.T) {
	before := runtime.NumGoroutine()
	rep, _ := compareJSON(t, "-duration", "20ms", "-warmup", "0", "-replay-keys", "64", "-conc", "1,4",
		"-stores", "receipts,"+strings.Join(observerStores, ","), "-workloads", "new,replay", "-dir", t.TempDir())
	got := map[string]int{}
	for _, r := range rep.Results {
		if r.Ops == 0 || r.Error != "" {
			t.Errorf("%s %s conc=%d: %d operations, error %q", r.Workload, r.Store, r.Conc, r.Ops, r.Error)
		}
		got[r.Store]++
	}
	for _, s := range append([]string{"receipts"}, observerStores...) {
		if got[s] != 4 { // new and replay at 1 and 4 callers
			t.Errorf("%s: %d rows, want 4 (%v)", s, got[s], got)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		t.Errorf("%d goroutines after the run, %d before", n, before)
	}
}
