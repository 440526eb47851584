package main

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// printSaved prints the table of a report saved with -json.
func printSaved(cfg *config) error {
	b, err := os.ReadFile(cfg.fromJSON)
	if err != nil {
		return err
	}
	var rep report
	if err := json.Unmarshal(b, &rep); err != nil {
		return fmt.Errorf("%s: %w", cfg.fromJSON, err)
	}
	if cfg.csv {
		return printCSV(stdout, &rep)
	}
	cfg.workloads = map[string]bool{}
	for _, r := range rep.Results {
		cfg.workloads[r.Workload] = true
	}
	printTable(stdout, &rep, cfg)
	return nil
}

// csvHeader names the columns of printCSV: durations in nanoseconds, ratios
// taken in the same run (0: none).
var csvHeader = []string{"workload", "conc", "store", "ops", "seconds", "ops_per_sec", "p50_ns", "p99_ns", "mean_ns",
	"ratio_to_floor", "ratio_to_postgres", "ratio_to_pg_floor", "error"}

// printCSV writes rep's results as CSV, a row per workload, concurrency and
// store, for spreadsheets and plotting (cmd/benchplot reads the JSON).
func printCSV(w io.Writer, rep *report) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(csvHeader); err != nil {
		return err
	}
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', 6, 64) }
	for _, r := range rep.Results {
		row := []string{r.Workload, strconv.Itoa(r.Conc), r.Store, strconv.FormatUint(r.Ops, 10), f(r.Seconds), f(r.OpsPerSec),
			strconv.FormatInt(int64(r.P50), 10), strconv.FormatInt(int64(r.P99), 10), strconv.FormatInt(int64(r.Mean), 10),
			f(r.RatioToFloor), f(r.RatioToPG), f(r.RatioToPGFl), r.Error}
		if err := cw.Write(row); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

func printJSON(w io.Writer, rep *report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

var workloadTitle = map[string]string{
	"new":       "new keys: first call, durable claim + durable commit",
	"replay":    "replay: retry of a committed key",
	"hot":       "hot keys: 64 goroutines on 16 keys, 1 first call per 32 calls",
	"hot-retry": "hot retries: 64 goroutines on 16 committed keys (compare with replay at 64)",
}

func printTable(w io.Writer, rep *report, cfg *config) {
	m := rep.Machine
	fmt.Fprintf(w, "receiptbench: %s, %d CPUs, %s/%s, %s; fdatasync p50 %s; %s per configuration; Pebble cache %d MiB\n",
		m.CPU, m.CPUs, m.GOOS, m.GOARCH, m.Go, fmtDur(m.FsyncP50), rep.Duration, rep.CacheMiB)
	rows := slices.Clone(rep.Results)
	order := func(list []string, s string) int { return slices.Index(list, s) }
	slices.SortStableFunc(rows, func(a, b result) int {
		if d := order(allWorkloads, a.Workload) - order(allWorkloads, b.Workload); d != 0 {
			return d
		}
		if d := a.Conc - b.Conc; d != 0 {
			return d
		}
		return order(allStores, a.Store) - order(allStores, b.Store)
	})
	hasPG := slices.ContainsFunc(rows, func(r result) bool { return r.RatioToPG > 0 })
	t := &table{header: []string{"workload", "conc", "store", "ops/s", "p50", "p99", "x floor"}, left: map[int]bool{0: true, 2: true}}
	if hasPG {
		t.header = append(t.header, "x postgres")
	}
	hasPGFloor := slices.ContainsFunc(rows, func(r result) bool { return r.RatioToPGFl > 0 })
	if hasPGFloor {
		t.header = append(t.header, "x pg-floor")
	}
	hasPGTx := slices.ContainsFunc(rows, func(r result) bool { return r.RatioToPGTx > 0 })
	if hasPGTx {
		t.header = append(t.header, "x tx-floor")
	}
	hasCPU := slices.ContainsFunc(rows, func(r result) bool { return r.CPUPerOp > 0 })
	if hasCPU {
		t.header = append(t.header, "cpu-µs/op")
	}
	hasSyncs := slices.ContainsFunc(rows, func(r result) bool { return r.SyncsPerOp > 0 })
	if hasSyncs {
		t.header = append(t.header, "syncs/op")
	}
	hasSrv := slices.ContainsFunc(rows, func(r result) bool { return r.ServerCPUPerOp > 0 })
	if hasSrv {
		t.header = append(t.header, "srv-cpu-µs/op")
	}
	prev := ""
	for _, r := range rows {
		group := r.Workload + "/" + fmt.Sprint(r.Conc)
		if prev != "" && group != prev {
			t.rows = append(t.rows, nil)
		}
		prev = group
		if r.Error != "" {
			t.rows = append(t.rows, []string{r.Workload, fmt.Sprint(r.Conc), r.Store, "error", "", "", ""})
			continue
		}
		ratio := ratioString(r.RatioToFloor)
		row := []string{r.Workload, fmt.Sprint(r.Conc), r.Store, fmtOps(r.OpsPerSec), fmtDur(r.P50), fmtDur(r.P99), ratio}
		if hasPG {
			row = append(row, ratioString(r.RatioToPG))
		}
		if hasPGFloor {
			row = append(row, ratioString(r.RatioToPGFl))
		}
		if hasPGTx {
			row = append(row, ratioString(r.RatioToPGTx))
		}
		if hasCPU {
			row = append(row, cpuString(r.CPUPerOp))
		}
		if hasSyncs {
			row = append(row, syncsString(r.SyncsPerOp))
		}
		if hasSrv {
			row = append(row, cpuString(r.ServerCPUPerOp))
		}
		t.rows = append(t.rows, row)
	}
	t.write(w)
	var notes []string
	for _, wl := range allWorkloads {
		if cfg.workloads[wl] {
			notes = append(notes, fmt.Sprintf("  %-10s %s", wl+":", workloadTitle[wl]))
		}
	}
	if cfg.workloads["hot"] || cfg.workloads["hot-retry"] {
		notes = append(notes, "  (hot runs on receipts and the floor only: the peers have no way to wait for an in-flight first call)")
	}
	if cfg.workloads["replay"] {
		settled := ""
		if cfg.settle {
			settled = " (floor and receipts: flushed and compacted first)"
		}
		if sc := rep.Scale; sc != nil {
			notes = append(notes, fmt.Sprintf("  replays read %d keys sampled evenly from all %d loaded ones%s", sc.ReplaySample, sc.Receipts, settled))
		} else {
			notes = append(notes, fmt.Sprintf("  replays read %d committed keys%s", rep.ReplayKeys, settled))
		}
	}
	if sc := rep.Scale; sc != nil {
		settled := ""
		if cfg.settle {
			settled = ", then flushed and compacted"
		}
		notes = append(notes, fmt.Sprintf("  scale: each store loaded with %d durable receipts first (%d-way first calls, as -mem)%s", sc.Receipts, loadConc, settled))
		for _, name := range scaleStores {
			if ops, ok := sc.LoadOpsPerSec[name]; ok {
				notes = append(notes, fmt.Sprintf("    %-12s load %s ops/s (%.0fs), settle %.1fs, disk %s after loading", name, fmtOps(ops), sc.LoadSeconds[name], sc.SettleSeconds[name], fmtBytes(sc.DiskBytes[name])))
			}
		}
		if sc.RSSBytes > 0 {
			notes = append(notes, fmt.Sprintf("  RSS after the run: %s with both stores open; %s's store alone %s = Pebble cache %s + %s (cache in use %s, memtables %s, replay cache %s, Go heap %s; peak RSS of the run %s; RSS with both stores empty, before loading: %s)",
				fmtBytes(sc.RSSBothBytes), sc.Alone, fmtBytes(sc.RSSBytes), fmtBytes(uint64(sc.CacheBytes)), signedBytes(sc.RSSOverCache),
				fmtBytes(uint64(sc.CacheInUse)), fmtBytes(sc.MemTableBytes), fmtBytes(uint64(sc.ReplayCache)), fmtBytes(sc.GoHeapBytes), fmtBytes(sc.PeakRSSBytes), fmtBytes(sc.BaselineRSS)))
			notes = append(notes, "    where it sits: "+sc.Breakdown.String())
		}
	}
	if rep.Postgres != "" {
		notes = append(notes, "  postgres: "+rep.Postgres)
	}
	for _, name := range allStores {
		if why := rep.Skipped[name]; why != "" {
			notes = append(notes, fmt.Sprintf("  %s: SKIPPED: %s", name, why))
		}
	}
	for _, r := range rows {
		if r.Error != "" {
			notes = append(notes, fmt.Sprintf("  %s %s conc=%d: ERROR: %s", r.Workload, r.Store, r.Conc, r.Error))
		}
	}
	fmt.Fprintln(w, strings.Join(notes, "\n"))
}

// cpuString is a CPU time per operation in µs ("-": not measured).
func cpuString(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f", float64(d)/1e3)
}

// syncsString is WAL syncs per operation ("-": none counted).
func syncsString(v float64) string {
	if v <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.3f", v)
}

func signedBytes(b int64) string {
	if b < 0 {
		return "-" + fmtBytes(uint64(-b))
	}
	return fmtBytes(uint64(b))
}

func ratioString(v float64) string {
	switch {
	case v <= 0:
		return "-"
	case v >= 10:
		return fmt.Sprintf("%.0f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

func fmtOps(v float64) string {
	s := fmt.Sprintf("%.0f", v)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

func fmtDur(d time.Duration) string {
	switch {
	case d <= 0:
		return "-"
	case d < 10*time.Microsecond:
		return fmt.Sprintf("%.2fµs", float64(d)/1e3)
	case d < time.Millisecond:
		return fmt.Sprintf("%.0fµs", float64(d)/1e3)
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.2fms", float64(d)/1e6)
	case d >= 10*time.Second:
		return fmt.Sprintf("%.1fs", d.Seconds())
	default:
		return fmt.Sprintf("%.1fms", float64(d)/1e6)
	}
}

// table prints columns padded to their widest cell: the columns in left left-aligned,
// the others right-aligned. A nil row is a blank line.
type table struct {
	header []string
	rows   [][]string
	left   map[int]bool
}

func (t *table) write(w io.Writer) {
	width := make([]int, len(t.header))
	for _, r := range append([][]string{t.header}, t.rows...) {
		for i, c := range r {
			width[i] = max(width[i], utf8.RuneCountInString(c))
		}
	}
	for _, r := range append([][]string{t.header}, t.rows...) {
		if r == nil {
			fmt.Fprintln(w)
			continue
		}
		var b strings.Builder
		for i, c := range r {
			pad := strings.Repeat(" ", width[i]-utf8.RuneCountInString(c))
			if i > 0 {
				b.WriteString("  ")
			}
			if t.left[i] {
				b.WriteString(c + pad)
			} else {
				b.WriteString(pad + c)
			}
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
}
