package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/receiptstore/receipts/bench/internal/pgtemp"
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
	var out bytes.Buffer
	stdout = &out
	defer func() { stdout = os.Stdout }()
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
	cfg, err := parseFlags([]string{"-dsn", dsn, "-duration", "50ms", "-replay-keys", "32", "-conc", "1,4",
		"-stores", strings.Join(pgStores, ","), "-workloads", "new,replay", "-dir", t.TempDir(), "-json"})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	stdout = &out
	defer func() { stdout = os.Stdout }()
	if err := runCompare(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	var rep report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("JSON: %v\n%s", err, out.String())
	}
	seen := map[string]int{}
	for _, r := range rep.Results {
		if r.Error != "" || r.Ops == 0 {
			t.Errorf("%s %s conc=%d: %d ops, error %q", r.Workload, r.Store, r.Conc, r.Ops, r.Error)
		}
		if r.RatioToPGFl <= 0 {
			t.Errorf("%s %s conc=%d: no ratio to pg-floor", r.Workload, r.Store, r.Conc)
		}
		seen[r.Store]++
	}
	for _, s := range pgStores {
		if seen[s] != 4 {
			t.Errorf("%s: %d rows, want 4 (new and replay at 1 and 4)", s, seen[s])
		}
	}

	out.Reset()
	cfg, err = parseFlags([]string{"-dsn", dsn, "-purge=3000"})
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
