package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
