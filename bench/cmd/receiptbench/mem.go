package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/receiptstore/receipts/bench/internal/engine"
	"github.com/receiptstore/receipts/bench/internal/stores"
	"github.com/receiptstore/receipts/bench/internal/workload"
	"github.com/receiptstore/receipts/pebblestore"
)

// memPoint is one checkpoint of the memory run.
type memPoint struct {
	Receipts        uint64  `json:"receipts"`
	RSSBytes        uint64  `json:"rss_bytes"`
	PeakRSSBytes    uint64  `json:"peak_rss_bytes"`
	GoHeapBytes     uint64  `json:"go_heap_bytes"`
	DiskBytes       uint64  `json:"disk_bytes"`
	DiskPerReceipt  float64 `json:"disk_bytes_per_receipt"`
	LoadOpsPerSec   float64 `json:"load_ops_per_sec"`
	ElapsedSeconds  float64 `json:"elapsed_seconds"`
	RSSOverBaseline int64   `json:"rss_over_baseline_bytes"`
}

type memReport struct {
	Machine        machine    `json:"machine"`
	Store          string     `json:"store"`
	Receipts       int        `json:"receipts"`
	Conc           int        `json:"conc"`
	KeyBytes       int        `json:"key_bytes"`
	ResultBytes    int        `json:"result_bytes"`
	FingerprintLen int        `json:"fingerprint_bytes"`
	CacheBytes     int64      `json:"pebble_cache_bytes"`
	MemTableBytes  uint64     `json:"pebble_memtable_bytes"`
	Baseline       memPoint   `json:"baseline"`
	Points         []memPoint `json:"points"`
	Final          memPoint   `json:"final_after_flush"`
}

// runMem loads cfg.mem receipts through DB.Do (or the floor, with -mem-store) (64-way, durable, as in production) and
// reports the process RSS and the store's disk bytes per receipt at ten checkpoints.
func runMem(ctx context.Context, cfg *config) error {
	base, err := os.MkdirTemp(cfg.dir, "receiptbench-mem-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(base)
	n := int(cfg.mem)
	const conc = loadConc
	opts := engine.Options(nil)
	opts.Pebble = cfg.pebbleOptions()
	po := opts.Pebble.Clone()
	po.EnsureDefaults()
	k0 := workload.UUIDKey(0)
	rep := &memReport{Machine: describeMachine(), Receipts: n, Conc: conc,
		KeyBytes: len(k0.Scope) + len(k0.ID), ResultBytes: workload.ResultSize, FingerprintLen: 32,
		CacheBytes: po.CacheSize, MemTableBytes: po.MemTableSize}
	if rep.Machine.FsyncP50, err = measureFsync(base); err != nil {
		return err
	}
	dir := filepath.Join(base, "store")
	var s stores.Store
	var pdb *pebble.DB
	switch cfg.memStore {
	case "receipts", "receipts-sealed":
		if cfg.memStore == "receipts-sealed" { // results encrypted (Options.Keyring)
			if opts.Keyring, err = benchKeyring(base); err != nil {
				return err
			}
		}
		e, err := engine.Open(dir, opts, engine.ModeDo)
		if err != nil {
			return err
		}
		e.Label = cfg.memStore
		s, pdb = e, pebblestore.DB(e.DB)
	case "pebble-floor":
		f, err := stores.OpenFloor(dir, opts.Pebble)
		if err != nil {
			return err
		}
		s, pdb = f, f.DB
	default:
		return fmt.Errorf("-mem-store: want receipts, receipts-sealed or pebble-floor, not %q", cfg.memStore)
	}
	rep.Store = s.Name()
	defer s.Close()

	start := time.Now()
	rep.Baseline = measureMem(dir, 0, start, 0)
	progress("mem: %s CPU; Pebble cache %s, memtable %s; baseline RSS %s", rep.Machine.CPU,
		fmtBytes(uint64(rep.CacheBytes)), fmtBytes(rep.MemTableBytes), fmtBytes(rep.Baseline.RSSBytes))
	err = loadReceipts(ctx, s, uint64(n), 10, func(loaded uint64, opsPerSec float64) {
		p := measureMem(dir, loaded, start, opsPerSec)
		p.RSSOverBaseline = int64(p.RSSBytes) - int64(rep.Baseline.RSSBytes)
		rep.Points = append(rep.Points, p)
		progress("mem: %9d receipts  RSS %-9s (+%s)  Go heap %-9s  disk %-9s (%.0f B/receipt)  load %.0f ops/s",
			p.Receipts, fmtBytes(p.RSSBytes), fmtBytes(uint64(max(p.RSSOverBaseline, 0))), fmtBytes(p.GoHeapBytes),
			fmtBytes(p.DiskBytes), p.DiskPerReceipt, p.LoadOpsPerSec)
	})
	if err != nil {
		return err
	}
	loaded := uint64(n)
	if err := pdb.Flush(); err != nil {
		return err
	}
	rep.Final = measureMem(dir, loaded, start, 0)
	rep.Final.RSSOverBaseline = int64(rep.Final.RSSBytes) - int64(rep.Baseline.RSSBytes)
	if cfg.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	printMem(rep)
	return nil
}

func printMem(rep *memReport) {
	m := rep.Machine
	fmt.Fprintf(stdout, "receiptbench -mem: %s, %d CPUs, %s; %d receipts into %s at %d-way (durable first calls)\n", m.CPU, m.CPUs, m.Go, rep.Receipts, rep.Store, rep.Conc)
	fmt.Fprintf(stdout, "key %d B (scope+id), fingerprint %d B, result %d B; Pebble cache %s, memtable %s\n",
		rep.KeyBytes, rep.FingerprintLen, rep.ResultBytes, fmtBytes(uint64(rep.CacheBytes)), fmtBytes(rep.MemTableBytes))
	t := &table{header: []string{"receipts", "RSS", "RSS - baseline", "peak RSS", "Go heap", "disk", "disk/receipt", "load ops/s"}}
	row := func(p memPoint, label string) {
		t.rows = append(t.rows, []string{label, fmtBytes(p.RSSBytes), fmtBytes(uint64(max(p.RSSOverBaseline, 0))), fmtBytes(p.PeakRSSBytes),
			fmtBytes(p.GoHeapBytes), fmtBytes(p.DiskBytes), fmt.Sprintf("%.0f B", p.DiskPerReceipt), fmtOps(p.LoadOpsPerSec)})
	}
	row(rep.Baseline, "0")
	for _, p := range rep.Points {
		row(p, fmtOps(float64(p.Receipts)))
	}
	row(rep.Final, fmtOps(float64(rep.Final.Receipts))+" (flushed)")
	t.write(stdout)
}

// loadConc is how many goroutines load receipts in -mem and -scale: first calls at the
// concurrency of a loaded server, so the load's syncs are shared as they would be.
const loadConc = 64

// loadReceipts makes n durable first calls on s, of workload.UUIDKey(0) to UUIDKey(n-1),
// loadConc-way, in steps equal parts, calling after at the end of each part with the
// receipts loaded so far and the part's ops/s. It is the population of -mem and -scale.
func loadReceipts(ctx context.Context, s stores.Store, n uint64, steps int, after func(loaded uint64, opsPerSec float64)) error {
	var next atomic.Uint64
	loaded := uint64(0)
	for step := 1; step <= steps; step++ {
		target := n * uint64(step) / uint64(steps)
		t0 := time.Now()
		r := workload.Run(ctx, loadConc, 0, target-loaded, func(ctx context.Context, _ int, _ uint64) error {
			k := workload.UUIDKey(next.Add(1) - 1)
			replayed, err := s.Do(ctx, k, workload.Fingerprint(k), workload.ResultFor(k))
			if err == nil && replayed {
				err = fmt.Errorf("key %v was already there", k)
			}
			return err
		})
		if r.FirstErr != nil {
			return fmt.Errorf("%s: loading %d receipts: %w", s.Name(), n, r.FirstErr)
		}
		loaded = target
		if after != nil {
			after(loaded, float64(r.Ops)/time.Since(t0).Seconds())
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return nil
}

func measureMem(dir string, receipts uint64, start time.Time, opsPerSec float64) memPoint {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	rss, hwm := procRSS()
	disk := dirBytes(dir)
	p := memPoint{Receipts: receipts, RSSBytes: rss, PeakRSSBytes: hwm, GoHeapBytes: ms.HeapInuse,
		DiskBytes: disk, LoadOpsPerSec: opsPerSec, ElapsedSeconds: time.Since(start).Seconds()}
	if receipts > 0 {
		p.DiskPerReceipt = float64(disk) / float64(receipts)
	}
	return p
}

// procRSS returns the resident set size and its peak (VmRSS, VmHWM) of this process.
func procRSS() (rss, peak uint64) {
	st := procStatus()
	return st["VmRSS"], st["VmHWM"]
}

// procRSSParts reads the resident set's anonymous and file-backed parts.
func procRSSParts() (anon, file uint64) {
	st := procStatus()
	return st["RssAnon"], st["RssFile"]
}

// procStatus reads the sizes in /proc/self/status, in bytes; empty where there is none.
func procStatus() map[string]uint64 {
	st := map[string]uint64{}
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return st
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || !strings.HasSuffix(v, " kB") {
			continue
		}
		if kb, err := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(v, " kB")), 10, 64); err == nil {
			st[k] = kb << 10
		}
	}
	return st
}

func dirBytes(dir string) uint64 {
	var n uint64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if fi, err := d.Info(); err == nil {
				n += uint64(fi.Size())
			}
		}
		return nil
	})
	return n
}

func fmtBytes(b uint64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10))
	default:
		return fmt.Sprintf("%d B", b)
	}
}
