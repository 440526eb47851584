package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/receiptstore/receipts/bench/internal/engine"
	"github.com/receiptstore/receipts/bench/internal/pgtemp"
	"github.com/receiptstore/receipts/bench/internal/stores"
	"github.com/receiptstore/receipts/bench/internal/workload"
	"github.com/receiptstore/receipts/keyring"
	"github.com/receiptstore/receipts/pgstore"
)

// result is one row of the table.
type result struct {
	Workload     string        `json:"workload"`
	Store        string        `json:"store"`
	Conc         int           `json:"conc"`
	Ops          uint64        `json:"ops"`
	Seconds      float64       `json:"seconds"`
	OpsPerSec    float64       `json:"ops_per_sec"`
	P50          time.Duration `json:"p50_ns"`
	P99          time.Duration `json:"p99_ns"`
	Mean         time.Duration `json:"mean_ns"`
	RatioToFloor float64       `json:"ratio_to_floor,omitempty"`
	RatioToPG    float64       `json:"ratio_to_postgres,omitempty"`
	RatioToPGFl  float64       `json:"ratio_to_pg_floor,omitempty"`
	RatioToPGTx  float64       `json:"ratio_to_pg_tx_floor,omitempty"`
	FirstCalls   uint64        `json:"first_calls,omitempty"`
	// CPUPerOp is this process's CPU time (user + system, background work included) over
	// the measured run, per operation; ServerCPUPerOp is the PostgreSQL server's (its
	// processes read from /proc: a local server only), per operation.
	CPUPerOp time.Duration `json:"cpu_per_op_ns,omitempty"`
	// SyncsPerOp is the WAL syncs Pebble issued over the measured run, per operation (the
	// Pebble stores): a first call writes two durable records, so 2/SyncsPerOp records
	// share a sync.
	SyncsPerOp     float64       `json:"wal_syncs_per_op,omitempty"`
	ServerCPUPerOp time.Duration `json:"server_cpu_per_op_ns,omitempty"`
	Error          string        `json:"error,omitempty"`
}

type report struct {
	Machine    machine           `json:"machine"`
	Duration   time.Duration     `json:"duration_per_config_ns"`
	ReplayKeys int               `json:"replay_keys"`
	CacheMiB   int               `json:"pebble_cache_mib"`
	Postgres   string            `json:"postgres"`
	Skipped    map[string]string `json:"skipped,omitempty"`
	Results    []result          `json:"results"`
	Scale      *scaleReport      `json:"scale,omitempty"`
}

const (
	hotGoroutines  = 64
	hotKeys        = 16
	hotCallsPerKey = 32
)

func runCompare(ctx context.Context, cfg *config) error {
	base, err := os.MkdirTemp(cfg.dir, "receiptbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(base)

	rep := &report{Machine: describeMachine(), Duration: cfg.duration, Skipped: map[string]string{}, ReplayKeys: cfg.replayN, CacheMiB: cfg.cacheMiB}
	if rep.Machine.FsyncP50, err = measureFsync(base); err != nil {
		return err
	}
	progress("%s, %d CPUs (GOMAXPROCS %d), %s; fdatasync p50 %s; %s per configuration; Pebble cache %d MiB",
		rep.Machine.CPU, rep.Machine.CPUs, rep.Machine.GOMAXPROCS, rep.Machine.Go, fmtDur(rep.Machine.FsyncP50), cfg.duration, cfg.cacheMiB)

	dsn := cfg.dsn
	if cfg.anyPG() {
		switch {
		case dsn != "":
			rep.Postgres = "given DSN"
		default:
			progress("starting a throwaway PostgreSQL cluster")
			c, err := pgtemp.Start(ctx)
			switch {
			case errors.Is(err, pgtemp.ErrNoServer):
				cfg.skipPG(rep, "no -dsn given and no PostgreSQL server binaries found (Debian: apt-get install postgresql)")
			case err != nil:
				cfg.skipPG(rep, "throwaway cluster failed to start: "+err.Error())
			default:
				defer func() {
					if err := c.Stop(); err != nil {
						progress("stopping PostgreSQL: %v", err)
					} else {
						progress("throwaway PostgreSQL cluster stopped and removed")
					}
				}()
				dsn = c.DSN
				rep.Postgres = "throwaway cluster (" + filepath.Base(filepath.Dir(c.BinDir)) + ")"
				progress("PostgreSQL up at %s", c.DSN)
			}
		}
	}

	maxConc := slices.Max(append(slices.Clone(cfg.concs), hotGoroutines))
	var open []stores.Store
	syncs := map[string]*stores.SyncCounter{} // the Pebble stores' WAL syncs
	defer func() {
		for _, s := range open {
			if err := s.Close(); err != nil {
				progress("%s: close: %v", s.Name(), err)
			}
		}
	}()
	var pool *pgxpool.Pool // the PostgreSQL stores but "postgres" share it
	defer func() {
		if pool != nil {
			pool.Close()
		}
	}()
	for _, name := range allStores {
		if !cfg.stores[name] || rep.Skipped[name] != "" {
			continue
		}
		if pool == nil && slices.Contains(pgStores, name) && name != "postgres" {
			if pool, err = stores.OpenPGPool(ctx, dsn, maxConc+8); err != nil {
				cfg.skipPG(rep, "connect: "+err.Error())
				continue
			}
		}
		dir := filepath.Join(base, name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		var s stores.Store
		switch name {
		case "pebble-floor":
			o := cfg.pebbleOptions()
			syncs[name] = stores.CountSyncs(o)
			s, err = stores.OpenFloor(dir, o)
		case "receipts", "receipts-notomb", "receipts-sealed", "receipts-prom", "receipts-otel", "receipts-otel-sdk":
			opts := engine.Options(nil)
			opts.Pebble = cfg.pebbleOptions()
			syncs[name] = stores.CountSyncs(opts.Pebble)
			if name == "receipts-notomb" { // tombstones off: the cost of tombstones is receipts next to it
				opts.TombstoneWindow = -1
			}
			if name == "receipts-sealed" { // results encrypted: the cost of Options.Keyring is receipts next to it
				if opts.Keyring, err = benchKeyring(base); err != nil {
					break
				}
			}
			var stopObserver func()
			if slices.Contains(observerStores, name) { // the cost of an observer is receipts next to it
				if opts.Observer, stopObserver, err = benchObserver(name); err != nil {
					break
				}
			}
			var es *engine.Store
			if es, err = engine.Open(dir, opts, engine.ModeDo); err == nil {
				es.Label = name
				es.AfterClose = stopObserver
				s = es
			} else if stopObserver != nil {
				stopObserver()
			}
		case "bbolt":
			s, err = stores.OpenBolt(dir)
		case "sqlite":
			s, err = stores.OpenSQLite(dir, maxConc)
		case "postgres":
			s, err = stores.OpenPostgres(ctx, dsn, maxConc)
		case "pg-floor":
			s, err = stores.OpenPGFloor(ctx, pool)
		case "pg-tx-floor":
			s, err = stores.OpenPGTxFloor(ctx, pool)
		case "fgi-style":
			s, err = stores.OpenFGIStyle(ctx, pool)
		case "receipts-pg":
			s, err = engine.OpenPG(ctx, pool, "bench_receipts_pg", false)
		case "receipts-pg-tx":
			s, err = engine.OpenPG(ctx, pool, "bench_receipts_pg_tx", true)
		case "receipts-pg-sealed":
			var kr *keyring.File
			if kr, err = benchKeyring(base); err == nil {
				var ps *engine.PGStore
				if ps, err = engine.OpenPGWith(ctx, pool, "bench_receipts_pg_sealed", false, func(o *pgstore.Options) { o.Keyring = kr }); err == nil {
					ps.Label = "receipts-pg-sealed"
					s = ps
				}
			}
		case "receipts-pg-aged": // a store as old as its retention + tombstone window (OpenPGAged)
			s, err = engine.OpenPGAged(ctx, pool, "bench_receipts_pg_aged", cfg.agedN)
		case "receipts-pg-notomb": // tombstones off: the cost of tombstones is receipts-pg next to it
			var ps *engine.PGStore
			if ps, err = engine.OpenPGWith(ctx, pool, "bench_receipts_pg_notomb", false, func(o *pgstore.Options) { o.TombstoneWindow = -1 }); err == nil {
				ps.Label = "receipts-pg-notomb"
				s = ps
			}
		case "receipts-pg-tx-notomb": // DoTx with tombstones off
			var ps *engine.PGStore
			if ps, err = engine.OpenPGWith(ctx, pool, "bench_receipts_pg_tx_notomb", true, func(o *pgstore.Options) { o.TombstoneWindow = -1 }); err == nil {
				ps.Label = "receipts-pg-tx-notomb"
				s = ps
			}
		case "receipts-pg-lookup":
			var ps *engine.PGStore
			if ps, err = engine.OpenPG(ctx, pool, "bench_receipts_pg_lookup", false); err == nil {
				ps.LookupReplay = true
				s = ps
			}
		}
		if err != nil {
			rep.Skipped[name] = "open failed: " + err.Error()
			progress("%s: skipped: %v", name, err)
			continue
		}
		open = append(open, s)
	}
	if cfg.scale > 0 {
		if err := populateScale(ctx, cfg, base, rep, open); err != nil {
			return err
		}
	}
	rep.Results = runAll(ctx, cfg, rep, open, newServerCPU(pool), syncs)
	if err := ctx.Err(); err != nil {
		return err
	}
	if rep.Scale != nil {
		open = measureScaleRSS(rep.Scale, open, cfg.memProf)
	}
	ratios(rep.Results)
	if cfg.json {
		return printJSON(stdout, rep)
	}
	if cfg.csv {
		return printCSV(stdout, rep)
	}
	printTable(stdout, rep, cfg)
	return nil
}

// runAll runs every selected workload. Each configuration (workload, concurrency) runs
// on every store back to back, so that a ratio compares runs minutes apart at most, not
// a whole store's run apart: on a shared machine the disk and the CPUs drift.
func runAll(ctx context.Context, cfg *config, rep *report, all []stores.Store, srv *serverCPU, syncs map[string]*stores.SyncCounter) []result {
	var out []result
	// measured runs workload.Run, noting the CPU time it took, this process's and the
	// PostgreSQL server's (for the PostgreSQL stores), and the WAL syncs of a Pebble
	// store, in cpu.
	var cpu struct {
		self, server time.Duration
		syncs        uint64
	}
	measured := func(s stores.Store, conc int, d time.Duration, op workload.Op) *workload.Result {
		cpu.self, cpu.server, cpu.syncs = 0, 0, 0
		pg := slices.Contains(pgStores, s.Name())
		s0, ok0 := srv.total(ctx)
		var w0 uint64
		sc := syncs[s.Name()]
		if sc != nil {
			w0 = sc.WAL()
		}
		c0 := processCPU()
		r := workload.Run(ctx, conc, d, 0, op)
		cpu.self = processCPU() - c0
		if sc != nil {
			cpu.syncs = sc.WAL() - w0
		}
		if s1, ok1 := srv.total(ctx); pg && ok0 && ok1 {
			cpu.server = s1 - s0
		}
		return r
	}
	add := func(wl, name string, conc int, r *workload.Result, firsts uint64) {
		row := result{Workload: wl, Store: name, Conc: conc, Ops: r.Ops, Seconds: r.Elapsed.Seconds(),
			OpsPerSec: r.OpsPerSec(), P50: r.Hist.Quantile(0.50), P99: r.Hist.Quantile(0.99), Mean: r.Hist.Mean(), FirstCalls: firsts}
		if r.Ops > 0 {
			row.CPUPerOp = cpu.self / time.Duration(r.Ops)
			row.ServerCPUPerOp = cpu.server / time.Duration(r.Ops)
			row.SyncsPerOp = float64(cpu.syncs) / float64(r.Ops)
		}
		cpu.self, cpu.server, cpu.syncs = 0, 0, 0
		if r.FirstErr != nil {
			row.Error = r.FirstErr.Error()
			progress("%-9s %-12s conc=%-3d ERROR %v", wl, name, conc, r.FirstErr)
		} else {
			progress("%-9s %-12s conc=%-3d %10.0f ops/s  p50 %-8s p99 %s", wl, name, conc, row.OpsPerSec, fmtDur(row.P50), fmtDur(row.P99))
		}
		out = append(out, row)
	}
	if cfg.workloads["new"] {
		for _, conc := range cfg.concs {
			for _, s := range all {
				if ctx.Err() != nil {
					return out
				}
				newKeys := func(run string) workload.Op {
					return func(ctx context.Context, w int, seq uint64) error {
						k := workload.NewKey(run, w, seq)
						replayed, err := s.Do(ctx, k, workload.Fingerprint(k), workload.ResultFor(k))
						if err == nil && replayed {
							err = fmt.Errorf("new key %v was replayed", k)
						}
						return err
					}
				}
				if cfg.warmup > 0 { // keys of their own, not measured
					if w := workload.Run(ctx, conc, cfg.warmup, 0, newKeys(workload.RunID())); w.FirstErr != nil {
						add("new", s.Name(), conc, w, 0)
						continue
					}
				}
				r := measured(s, conc, cfg.duration, newKeys(workload.RunID()))
				add("new", s.Name(), conc, r, 0)
			}
		}
	}
	if cfg.workloads["replay"] && ctx.Err() == nil {
		// pick returns the key and fingerprint worker w's seq-th replay reads.
		var pick func(w int, seq uint64) (workload.Key, []byte)
		var populate func(s stores.Store) *workload.Result
		if rep.Scale != nil {
			// -scale: the stores already hold the keys; replays read a sample spread over all of them.
			progress("%-9s sampling %d of the %d loaded keys", "replay", rep.Scale.ReplaySample, rep.Scale.Receipts)
			ks := newScaleKeys(rep.Scale.Receipts, rep.Scale.ReplaySample)
			m := uint64(ks.m)
			pick = func(w int, seq uint64) (workload.Key, []byte) {
				return ks.key(int((uint64(w)*7919 + seq*2654435761) % m))
			}
			populate = func(stores.Store) *workload.Result { return &workload.Result{} }
		} else {
			set := "replay-" + workload.RunID()
			n := rep.ReplayKeys
			ks := make([]workload.Key, n)
			fps := make([][]byte, n)
			for i := range ks {
				ks[i] = workload.FixedKey(set, i)
				fps[i] = workload.Fingerprint(ks[i])
			}
			pick = func(w int, seq uint64) (workload.Key, []byte) {
				j := int((uint64(w)*7919 + seq*2654435761) % uint64(n))
				return ks[j], fps[j]
			}
			populate = func(s stores.Store) *workload.Result {
				progress("%-9s %-12s populating %d committed keys", "replay", s.Name(), n)
				var next atomic.Uint64
				return workload.Run(ctx, 64, 0, uint64(n), func(ctx context.Context, _ int, _ uint64) error {
					i := next.Add(1) - 1
					_, err := s.Do(ctx, ks[i], fps[i], workload.ResultFor(ks[i]))
					return err
				})
			}
		}
		var ready []stores.Store
		for _, s := range all {
			pr := populate(s)
			if pr.FirstErr != nil {
				add("replay", s.Name(), 0, pr, 0)
				continue
			}
			// The Pebble stores answer from settled sstables, not from whatever part of the
			// set the memtable happens to hold after the earlier workloads, and no compaction
			// left over from those runs while another store is measured: the same state for
			// both, and a loaded server's (its memtables hold its last fraction of a second).
			if st, ok := s.(stores.Settler); ok && cfg.settle {
				if err := st.Settle(); err != nil {
					pr.FirstErr = fmt.Errorf("settle after populating: %w", err)
					add("replay", s.Name(), 0, pr, 0)
					continue
				}
			}
			ready = append(ready, s)
		}
		for _, conc := range cfg.concs {
			for _, s := range ready {
				if ctx.Err() != nil {
					return out
				}
				replay := func(ctx context.Context, w int, seq uint64) error {
					k, fp := pick(w, seq)
					return s.Replay(ctx, k, fp)
				}
				if cfg.warmup > 0 {
					if w := workload.Run(ctx, conc, cfg.warmup, 0, replay); w.FirstErr != nil {
						add("replay", s.Name(), conc, w, 0)
						continue
					}
				}
				r := measured(s, conc, cfg.duration, replay)
				add("replay", s.Name(), conc, r, 0)
			}
		}
	}
	// Hot keys need a store that waits for an in-flight first call: the peers answer
	// "in progress" instead (they have no waiting), so only the engine and the floor run them.
	var hot []stores.Store
	for _, s := range all {
		if slices.Contains(pebbleStores, s.Name()) {
			hot = append(hot, s)
		}
	}
	if cfg.workloads["hot"] {
		for _, s := range hot {
			if ctx.Err() != nil {
				return out
			}
			run := workload.RunID()
			var calls [hotKeys]atomic.Uint64
			var firsts, slotSeq atomic.Uint64
			r := workload.Run(ctx, hotGoroutines, cfg.duration, 0, func(ctx context.Context, w int, seq uint64) error {
				slot := slotSeq.Add(1) % hotKeys
				gen := (calls[slot].Add(1) - 1) / hotCallsPerKey
				k := workload.FixedKey(run+"-"+strconv.FormatUint(gen, 10), int(slot))
				replayed, err := s.Do(ctx, k, workload.Fingerprint(k), workload.ResultFor(k))
				if err == nil && !replayed {
					firsts.Add(1)
				}
				return err
			})
			add("hot", s.Name(), hotGoroutines, r, firsts.Load())
		}
	}
	if cfg.workloads["hot-retry"] {
		set := "hotretry-" + workload.RunID()
		var ks [hotKeys]workload.Key
		var fps [hotKeys][]byte
		for i := range ks {
			ks[i] = workload.FixedKey(set, i)
			fps[i] = workload.Fingerprint(ks[i])
		}
		for _, s := range hot {
			if ctx.Err() != nil {
				return out
			}
			var err error
			for i := range ks {
				if _, e := s.Do(ctx, ks[i], fps[i], workload.ResultFor(ks[i])); e != nil && err == nil {
					err = e
				}
			}
			var slotSeq atomic.Uint64
			r := workload.Run(ctx, hotGoroutines, cfg.duration, 0, func(ctx context.Context, w int, seq uint64) error {
				if err != nil {
					return err
				}
				j := slotSeq.Add(1) % hotKeys
				replayed, err := s.Do(ctx, ks[j], fps[j], nil)
				if err == nil && !replayed {
					err = errors.New("a retry of a committed key was not replayed")
				}
				return err
			})
			add("hot-retry", s.Name(), hotGoroutines, r, 0)
		}
	}
	return out
}

// ratios fills RatioToFloor, RatioToPG, RatioToPGFl and RatioToPGTx: each row's ops/s over
// the floor's (and PostgreSQL's, pg-floor's, pg-tx-floor's) in the same workload and
// concurrency.
func ratios(rs []result) {
	floor := map[string]float64{}
	pg := map[string]float64{}
	pgFloor := map[string]float64{}
	pgTxFloor := map[string]float64{}
	for _, r := range rs {
		if r.Error != "" {
			continue
		}
		switch r.Store {
		case "pebble-floor":
			floor[r.Workload+"/"+strconv.Itoa(r.Conc)] = r.OpsPerSec
		case "postgres":
			pg[r.Workload+"/"+strconv.Itoa(r.Conc)] = r.OpsPerSec
		case "pg-floor":
			pgFloor[r.Workload+"/"+strconv.Itoa(r.Conc)] = r.OpsPerSec
		case "pg-tx-floor":
			pgTxFloor[r.Workload+"/"+strconv.Itoa(r.Conc)] = r.OpsPerSec
		}
	}
	for i := range rs {
		if rs[i].Error != "" {
			continue
		}
		g := rs[i].Workload + "/" + strconv.Itoa(rs[i].Conc)
		if f := floor[g]; f > 0 {
			rs[i].RatioToFloor = rs[i].OpsPerSec / f
		}
		if p := pg[g]; p > 0 {
			rs[i].RatioToPG = rs[i].OpsPerSec / p
		}
		if p := pgFloor[g]; p > 0 {
			rs[i].RatioToPGFl = rs[i].OpsPerSec / p
		}
		if p := pgTxFloor[g]; p > 0 {
			rs[i].RatioToPGTx = rs[i].OpsPerSec / p
		}
	}
}

// measureFsync times appending 4 KiB to a file and fdatasync-ing it, the unit of cost of
// every durable write here, and returns the median.
func measureFsync(dir string) (time.Duration, error) {
	f, err := os.Create(filepath.Join(dir, "fsync-probe"))
	if err != nil {
		return 0, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	buf := make([]byte, 4096)
	var h workload.Hist
	for range 200 {
		t0 := time.Now()
		if _, err := f.Write(buf); err != nil {
			return 0, err
		}
		if err := syscall.Fdatasync(int(f.Fd())); err != nil {
			return 0, err
		}
		h.Record(time.Since(t0))
	}
	return h.Quantile(0.5), nil
}

// anyPG reports whether a PostgreSQL store is selected.
func (c *config) anyPG() bool {
	return slices.ContainsFunc(pgStores, func(s string) bool { return c.stores[s] })
}

// skipPG marks every selected PostgreSQL store skipped, for why.
func (c *config) skipPG(rep *report, why string) {
	for _, s := range pgStores {
		if c.stores[s] && rep.Skipped[s] == "" {
			rep.Skipped[s] = why
			progress("%s: skipped: %s", s, why)
		}
	}
}

// benchKeyring is the key file of the stores with encrypted results (receipts-sealed,
// receipts-pg-sealed), in the run's temporary directory.
func benchKeyring(base string) (*keyring.File, error) {
	path := filepath.Join(base, "receipts.keyring")
	if kr, err := keyring.Open(path); err == nil {
		return kr, nil
	}
	return keyring.Create(path)
}
