package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"time"
	"unsafe"

	"github.com/cockroachdb/pebble/v2"
	"github.com/receiptstore/receipts/bench/internal/engine"
	"github.com/receiptstore/receipts/bench/internal/stores"
	"github.com/receiptstore/receipts/bench/internal/workload"
	"github.com/receiptstore/receipts/internal/peek"
)

// scaleReplaySample is the most keys -scale's replays read: a sample of the loaded keys
// spread evenly over all of them, packed in memory before the timed runs so that building
// a key (two SHA-256s) is not part of what a replay costs.
const scaleReplaySample = 1 << 20

// scaleReport is what -scale adds to the report: the population and the memory after the run.
type scaleReport struct {
	Receipts       int                `json:"receipts"`
	ReplaySample   int                `json:"replay_sample_keys"`
	LoadOpsPerSec  map[string]float64 `json:"load_ops_per_sec"`
	LoadSeconds    map[string]float64 `json:"load_seconds"`
	SettleSeconds  map[string]float64 `json:"settle_seconds,omitempty"`
	DiskBytes      map[string]uint64  `json:"disk_bytes"`
	BaselineRSS    uint64             `json:"baseline_rss_bytes"`
	RSSBothBytes   uint64             `json:"rss_both_open_bytes"`
	RSSBytes       uint64             `json:"rss_receipts_only_bytes"`
	PeakRSSBytes   uint64             `json:"peak_rss_bytes"`
	GoHeapBytes    uint64             `json:"go_heap_bytes"`
	CacheBytes     int64              `json:"pebble_cache_bytes"`
	CacheInUse     int64              `json:"pebble_cache_in_use_bytes"`
	MemTableBytes  uint64             `json:"pebble_memtable_bytes"`
	ReplayCache    int64              `json:"replay_cache_bytes"`
	MallocTrimmed  bool               `json:"malloc_trimmed"`
	RSSOverCache   int64              `json:"rss_over_cache_bytes"`
	ReplayCacheHit uint64             `json:"replay_cache_hits"`
	Alone          string             `json:"store_measured_alone"`
	Breakdown      rssBreakdown       `json:"rss_breakdown"`
}

// rssBreakdown is where the RSS of the process holding one store alone sits: pages backed
// by files (the executable) against anonymous memory, and of the anonymous memory what the
// Go runtime and the C heap (Pebble's block cache and memtables, with cgo) hold.
type rssBreakdown struct {
	AnonBytes      uint64 `json:"rss_anon_bytes"`
	FileBytes      uint64 `json:"rss_file_bytes"`
	GoHeapInuse    uint64 `json:"go_heap_inuse_bytes"`
	GoHeapLive     uint64 `json:"go_heap_live_bytes"`
	GoHeapUnreturn uint64 `json:"go_heap_idle_unreleased_bytes"`
	GoStacks       uint64 `json:"go_stack_bytes"`
	GoRuntime      uint64 `json:"go_runtime_meta_bytes"`
	CHeapInUse     uint64 `json:"c_heap_in_use_bytes"`
	CHeapFree      uint64 `json:"c_heap_free_bytes"`
	CHeapKnown     bool   `json:"c_heap_known"`
}

// String is the breakdown as the progress lines and the report's notes print it.
func (b rssBreakdown) String() string {
	s := fmt.Sprintf("anonymous %s, file-backed %s; Go: heap in use %s (live %s), idle not returned %s, stacks %s, runtime metadata %s",
		fmtBytes(b.AnonBytes), fmtBytes(b.FileBytes), fmtBytes(b.GoHeapInuse), fmtBytes(b.GoHeapLive), fmtBytes(b.GoHeapUnreturn), fmtBytes(b.GoStacks), fmtBytes(b.GoRuntime))
	if b.CHeapKnown {
		s += fmt.Sprintf("; C heap: in use %s, free in malloc's arenas %s", fmtBytes(b.CHeapInUse), fmtBytes(b.CHeapFree))
	}
	return s
}

// measureBreakdown reads the RSS breakdown of this process now; the caller has run a GC.
func measureBreakdown() rssBreakdown {
	var b rssBreakdown
	b.AnonBytes, b.FileBytes = procRSSParts()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	b.GoHeapInuse = ms.HeapInuse
	b.GoHeapLive = ms.HeapAlloc
	b.GoHeapUnreturn = ms.HeapIdle - ms.HeapReleased
	b.GoStacks = ms.StackInuse
	b.GoRuntime = ms.MSpanInuse + ms.MCacheInuse + ms.GCSys + ms.OtherSys + ms.BuckHashSys
	b.CHeapInUse, b.CHeapFree, b.CHeapKnown = cHeap()
	return b
}

// populateScale loads cfg.scale receipts into each of the -scale stores, one after the
// other, through the same loader as -mem, and settles each (when -settle) so that the
// first timed run on one does not share the machine with the other's compactions.
func populateScale(ctx context.Context, cfg *config, base string, rep *report, all []stores.Store) error {
	sr := &scaleReport{Receipts: int(cfg.scale), ReplaySample: min(int(cfg.scale), scaleReplaySample),
		LoadOpsPerSec: map[string]float64{}, LoadSeconds: map[string]float64{}, SettleSeconds: map[string]float64{}, DiskBytes: map[string]uint64{}}
	rep.Scale = sr
	po := cfg.pebbleOptions()
	po.EnsureDefaults()
	sr.CacheBytes = po.CacheSize
	n := uint64(cfg.scale)
	sr.BaselineRSS, _ = procRSS()
	progress("scale: RSS %s with both stores open and empty", fmtBytes(sr.BaselineRSS))
	for _, s := range all {
		progress("scale: %s: loading %d receipts %d-way", s.Name(), n, loadConc)
		t0 := time.Now()
		err := loadReceipts(ctx, s, n, 10, func(loaded uint64, opsPerSec float64) {
			progress("scale: %s: %9d receipts  %.0f ops/s  disk %s", s.Name(), loaded, opsPerSec, fmtBytes(dirBytes(filepath.Join(base, s.Name()))))
		})
		if err != nil {
			return err
		}
		sr.LoadSeconds[s.Name()] = time.Since(t0).Seconds()
		sr.LoadOpsPerSec[s.Name()] = float64(n) / time.Since(t0).Seconds()
		if st, ok := s.(stores.Settler); ok && cfg.settle {
			t1 := time.Now()
			if err := st.Settle(); err != nil {
				return fmt.Errorf("%s: settle after loading: %w", s.Name(), err)
			}
			sr.SettleSeconds[s.Name()] = time.Since(t1).Seconds()
			progress("scale: %s: flushed and compacted in %s", s.Name(), time.Since(t1).Round(time.Millisecond))
		}
		sr.DiskBytes[s.Name()] = dirBytes(filepath.Join(base, s.Name()))
	}
	return nil
}

// scaleKeys is the replay sample of -scale: m of the n loaded keys (workload.UUIDKey(i),
// i < n), one drawn at random from each of m equal stretches of 0..n-1, so that the
// replays read the whole key set, its oldest receipts as much as its newest. Each entry
// packs the 36-byte ID, the 32-byte fingerprint and the scope's number.
type scaleKeys struct {
	buf []byte
	m   int
}

const scaleEntry = 36 + 32 + 1

var scopeNames = func() []string {
	s := make([]string, workload.Scopes)
	for i := range s {
		s[i] = "tenant-" + strconv.Itoa(i)
	}
	return s
}()

func newScaleKeys(n, m int) *scaleKeys {
	ks := &scaleKeys{buf: make([]byte, m*scaleEntry), m: m}
	r := rand.New(rand.NewPCG(uint64(n), uint64(m)))
	for i := range m {
		lo, hi := uint64(i)*uint64(n)/uint64(m), uint64(i+1)*uint64(n)/uint64(m)
		idx := lo + r.Uint64N(hi-lo)
		k := workload.UUIDKey(idx)
		e := ks.buf[i*scaleEntry : (i+1)*scaleEntry]
		if len(k.ID) != 36 || k.Scope != scopeNames[idx%workload.Scopes] {
			panic("receiptbench: workload.UUIDKey changed shape; update scaleKeys")
		}
		copy(e, k.ID)
		copy(e[36:], workload.Fingerprint(k))
		e[68] = byte(idx % workload.Scopes)
	}
	return ks
}

// key returns the j-th sampled key and its fingerprint, without allocating: the ID points
// into the table, which is never written again.
func (ks *scaleKeys) key(j int) (workload.Key, []byte) {
	e := ks.buf[j*scaleEntry : (j+1)*scaleEntry : (j+1)*scaleEntry]
	return workload.Key{Scope: scopeNames[e[68]], ID: unsafe.String(&e[0], 36)}, e[36:68:68]
}

// measureScaleRSS records the process RSS with both stores open, then closes every store
// but receipts, returns the freed memory to the system and records the RSS of the process
// holding receipts' store alone, with its Pebble cache and memtables. Run with one store
// only (-stores pebble-floor), it measures that store alone the same way. It returns the
// stores still open.
func measureScaleRSS(sr *scaleReport, all []stores.Store, heapProfile string) []stores.Store {
	freeMem := func() {
		runtime.GC()
		debug.FreeOSMemory()
		sr.MallocTrimmed = mallocTrim()
	}
	freeMem()
	sr.RSSBothBytes, _ = procRSS()
	var left []stores.Store
	var alone stores.Store
	for _, s := range all {
		if _, ok := s.(*engine.Store); ok || len(all) == 1 {
			alone = s
			left = append(left, s)
			continue
		}
		if err := s.Close(); err != nil {
			progress("%s: close: %v", s.Name(), err)
		}
	}
	freeMem()
	writeHeapProfile(heapProfile)
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	sr.RSSBytes, sr.PeakRSSBytes = procRSS()
	sr.GoHeapBytes = ms.HeapInuse
	sr.Alone = "none"
	var pdb *pebble.DB
	switch s := alone.(type) {
	case *engine.Store:
		pdb = peek.Pebble(s.DB)
		st := s.DB.Stats()
		sr.ReplayCache = st.ReplayCacheBytes
		sr.ReplayCacheHit = st.ReplayCacheHits
	case *stores.Floor:
		pdb = s.DB
	}
	if alone != nil {
		sr.Alone = alone.Name()
	}
	if pdb != nil {
		m := pdb.Metrics()
		sr.CacheInUse = m.BlockCache.Size
		sr.MemTableBytes = m.MemTable.Size
	}
	sr.RSSOverCache = int64(sr.RSSBytes) - sr.CacheBytes
	sr.Breakdown = measureBreakdown()
	progress("scale: RSS %s with both stores open; %s alone: RSS %s (cache %s configured, %s in use; memtables %s; replay cache %s; Go heap %s), %s over the cache; peak %s",
		fmtBytes(sr.RSSBothBytes), sr.Alone, fmtBytes(sr.RSSBytes), fmtBytes(uint64(sr.CacheBytes)), fmtBytes(uint64(sr.CacheInUse)),
		fmtBytes(sr.MemTableBytes), fmtBytes(uint64(sr.ReplayCache)), fmtBytes(sr.GoHeapBytes), fmtBytes(uint64(max(sr.RSSOverCache, 0))), fmtBytes(sr.PeakRSSBytes))
	progress("scale: where it sits: %s", sr.Breakdown)
	return left
}

// writeHeapProfile writes a heap profile to file (-memprofile), if set: what the Go
// heap holds where the RSS is measured.
func writeHeapProfile(file string) {
	if file == "" {
		return
	}
	f, err := os.Create(file)
	if err == nil {
		err = pprof.Lookup("heap").WriteTo(f, 0)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		progress("-memprofile: %v", err)
	}
}
