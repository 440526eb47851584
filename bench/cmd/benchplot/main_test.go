package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Two runs of two stores on each engine: a ratio chart and a latency chart
// per workload and engine, SVG, and the Markdown tables with the medians
// and every run's ratio.
func TestDraw(t *testing.T) {
	dir := t.TempDir()
	var paths []string
	for i, ratio := range []float64{0.8, 1.2} {
		r := run{}
		for _, c := range []int{1, 8, 64} {
			r.Results = append(r.Results,
				result{Workload: "new", Store: "pebble-floor", Conc: c, P50: 1e6, P99: 5e6, RatioToFloor: 1},
				result{Workload: "new", Store: "receipts", Conc: c, P50: 2e6, P99: 9e6, RatioToFloor: ratio},
				result{Workload: "new", Store: "pg-floor", Conc: c, P50: 3e6, P99: 9e6, RatioToPGFl: 1},
				result{Workload: "new", Store: "receipts-pg", Conc: c, P50: 3e6, P99: 9e6, RatioToPGFl: 2 * ratio},
				result{Workload: "new", Store: "bbolt", Conc: c, Error: "failed"}, // left out
			)
		}
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, "run"+string(rune('1'+i))+".json")
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	runs, err := load(paths)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := drawAll(&out, runs, dir, "svg", "test"); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"ratio-new-pebble.svg", "latency-new-pebble.svg", "ratio-new-postgres.svg", "latency-new-postgres.svg"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(b, []byte("<svg")) || !bytes.Contains(b, []byte("receipts")) {
			t.Errorf("%s is not a chart naming receipts", name)
		}
		if !strings.Contains(out.String(), name) {
			t.Errorf("%s not reported:\n%s", name, out.String())
		}
	}
	md := filepath.Join(dir, "tables.md")
	if err := writeTables(md, runs); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(md)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| receipts | **1.00** (0.80, 1.20); 2ms / 9ms |", "| receipts-pg | **2.00** (1.60, 2.40);", "1 caller |"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("tables lack %q:\n%s", want, b)
		}
	}
	if strings.Contains(string(b), "bbolt") {
		t.Errorf("a failed result was tabled:\n%s", b)
	}
}
