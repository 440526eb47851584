// Command receiptbench measures receipts side by side with the raw Pebble floor and the
// stores users would otherwise pick for idempotency keys (bbolt, SQLite, PostgreSQL), and
// prints one table: ops/s, p50, p99 and each store's ratio to the floor, per workload and
// concurrency. Every store runs on disk in a temporary directory; fsync is the point.
//
//	go run ./cmd/receiptbench                      # 5s per configuration
//	go run ./cmd/receiptbench -quick               # 1s per configuration, fewer keys
//	go run ./cmd/receiptbench -dsn postgres://...  # an existing PostgreSQL
//	go run ./cmd/receiptbench -json > out.json
//	go run ./cmd/receiptbench -mem                 # memory: load 1M receipts, RSS and disk
//	go run ./cmd/receiptbench -mem=10M             # the same with 10M receipts
//	go run ./cmd/receiptbench -scale 1M            # new and replay on a floor and receipts holding 1M receipts each
//	go run ./cmd/receiptbench -purge               # PostgreSQL: GC of 1M expired receipts vs DELETE
//	go run ./cmd/receiptbench -wake                # PostgreSQL: cross-node wake-up latency
//
// Without -dsn, PostgreSQL runs as a throwaway cluster (initdb in a temp dir, a server on
// 127.0.0.1 at a free port, stopped and removed at the end) when its server binaries are
// installed (Debian: apt-get install postgresql); as root, the cluster runs as the
// postgres system user through runuser. With neither, the PostgreSQL rows are skipped and
// the table says so. Progress goes to stderr, one line per configuration.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	_ "net/http/pprof" // -pprof
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/receiptstore/receipts/bench/internal/stores"
)

type config struct {
	dsn       string
	duration  time.Duration
	warmup    time.Duration
	quick     bool
	settle    bool
	json      bool
	csv       bool
	concs     []int
	stores    map[string]bool
	workloads map[string]bool
	dir       string
	mem       memFlag
	replayN   int
	agedN     int // -aged-receipts: receipts-pg-aged's receipts per epoch while it ages
	memStore  string
	cpuProf   string
	pprofAddr string // -pprof: serve net/http/pprof here during the run
	memProf   string // -memprofile: a heap profile where -scale measures the RSS
	cacheMiB  int
	fromJSON  string
	purge     memFlag // -purge: reclaim this many expired receipts on PostgreSQL
	wake      bool    // -wake: cross-node wake-up latency on PostgreSQL
	wakeN     int
	scale     countFlag // -scale: populate the floor and receipts with this many receipts first
}

func main() {
	cfg, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "receiptbench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if cfg.cpuProf != "" {
		f, err := os.Create(cfg.cpuProf)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "receiptbench:", err)
			os.Exit(1)
		}
		defer f.Close()
		defer pprof.StopCPUProfile()
	}
	if cfg.pprofAddr != "" {
		runtime.SetBlockProfileRate(10_000) // one blocking event per 10 µs blocked
		runtime.SetMutexProfileFraction(10)
		go func() {
			if err := http.ListenAndServe(cfg.pprofAddr, nil); err != nil {
				progress("pprof: %v", err)
			}
		}()
	}
	switch {
	case cfg.fromJSON != "":
		err = printSaved(cfg)
	case cfg.mem > 0:
		err = runMem(ctx, cfg)
	case cfg.purge > 0:
		err = runPurge(ctx, cfg)
	case cfg.wake:
		err = runWake(ctx, cfg)
	default:
		err = runCompare(ctx, cfg)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "receiptbench:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

var allStores = []string{"pebble-floor", "receipts", "receipts-notomb", "bbolt", "sqlite", "postgres", "pg-floor", "receipts-pg", "pg-tx-floor", "receipts-pg-tx", "fgi-style", "receipts-sealed", "receipts-pg-sealed", "receipts-pg-lookup", "receipts-pg-notomb", "receipts-pg-tx-notomb", "receipts-pg-aged", "receipts-prom", "receipts-otel", "receipts-otel-sdk"}

// defaultStores run unless -stores names others: all but receipts-notomb,
// receipts-pg-lookup (a measurement of pgstore's plain read, not a path a retry takes),
// receipts-pg-notomb and receipts-pg-tx-notomb (the engine's, pgstore's Do and DoTx with
// tombstones off: a measurement of what they cost), receipts-pg-aged (receipts-pg aged to its
// retention + tombstone window before the run: what a long-running store's partitions cost),
// and receipts-sealed and receipts-pg-sealed (results encrypted, Options.Keyring: a
// measurement of what encryption costs, next to receipts and receipts-pg), and the observer
// stores (observerStores: what an observer costs, next to receipts).
var defaultStores = slices.DeleteFunc(slices.Clone(allStores), func(s string) bool {
	return s == "receipts-notomb" || s == "receipts-pg-lookup" || s == "receipts-pg-notomb" || s == "receipts-pg-tx-notomb" ||
		s == "receipts-pg-aged" || s == "receipts-sealed" || s == "receipts-pg-sealed" || slices.Contains(observerStores, s)
})

// pgStores are the stores that run on PostgreSQL (one cluster, one shared pool).
var pgStores = []string{"postgres", "pg-floor", "receipts-pg", "pg-tx-floor", "receipts-pg-tx", "fgi-style", "receipts-pg-sealed", "receipts-pg-lookup", "receipts-pg-notomb", "receipts-pg-tx-notomb", "receipts-pg-aged"}
var allWorkloads = []string{"new", "replay", "hot", "hot-retry"}

func parseFlags(args []string) (*config, error) {
	fs := flag.NewFlagSet("receiptbench", flag.ContinueOnError)
	cfg := &config{}
	var concs, storeList, workloadList string
	fs.StringVar(&cfg.dsn, "dsn", "", "PostgreSQL DSN (default: a throwaway cluster if the server binaries are installed)")
	fs.DurationVar(&cfg.duration, "duration", 5*time.Second, "measured time per configuration")
	fs.DurationVar(&cfg.warmup, "warmup", 500*time.Millisecond, "unmeasured run of the same workload before each measured configuration (new and replay), so that connections, statement caches and memtables are warm (default: 500ms, at most a quarter of -duration); 0: none")
	fs.BoolVar(&cfg.quick, "quick", false, "short run: 1s per configuration, fewer replay keys")
	fs.BoolVar(&cfg.settle, "settle", true, "flush and compact the floor and receipts before the replay rows (false: replays read whatever the earlier workloads left in memtables and L0)")
	fs.BoolVar(&cfg.json, "json", false, "print the results as JSON instead of a table")
	fs.BoolVar(&cfg.csv, "csv", false, "print the results as CSV (a row per workload, callers and store) instead of a table; with -table FILE, that run's")
	fs.StringVar(&concs, "conc", "1,8,64", "concurrencies (goroutines), comma-separated")
	fs.StringVar(&storeList, "stores", strings.Join(defaultStores, ","), "stores to run, comma-separated (also: receipts-pg-lookup, replays through DB.Lookup, pgstore's plain read)")
	fs.StringVar(&workloadList, "workloads", strings.Join(allWorkloads, ","),
		"workloads: new (first calls on new keys), replay (retries of committed keys), hot (64 goroutines on 16 keys, 1 first call per 32), hot-retry (64 goroutines on 16 committed keys)")
	fs.StringVar(&cfg.dir, "dir", "", "directory for the stores' temporary files (default: the system temp dir)")
	fs.IntVar(&cfg.replayN, "replay-keys", 0, "committed keys replays read (default 10000, 2000 with -quick)")
	fs.IntVar(&cfg.agedN, "aged-receipts", 200, "receipts-pg-aged: receipts written in each epoch while the store ages (Retention + TombstoneWindow, an epoch at a time)")
	fs.StringVar(&cfg.memStore, "mem-store", "receipts", "memory mode: the store to load (receipts, receipts-sealed or pebble-floor)")
	fs.IntVar(&cfg.cacheMiB, "cache", stores.CacheSize>>20, "Pebble block cache in MiB for the floor and receipts (0: Pebble's default, 8 MiB, which its memtables fill)")
	fs.StringVar(&cfg.fromJSON, "table", "", "print the table of an earlier -json run (a file) and exit")
	fs.StringVar(&cfg.cpuProf, "cpuprofile", "", "write a CPU profile of the whole run to this file")
	fs.StringVar(&cfg.pprofAddr, "pprof", "", "serve net/http/pprof at this address during the run (say localhost:6061): goroutine dumps, block and mutex profiles mid-run")
	fs.StringVar(&cfg.memProf, "memprofile", "", "scale mode: write a heap profile to this file where the RSS is measured (after a GC)")
	fs.Var(&cfg.purge, "purge", "PostgreSQL purge mode: N expired receipts (-purge alone: 1M) reclaimed by pgstore's GC vs a batched DELETE: time and WAL bytes")
	fs.BoolVar(&cfg.wake, "wake", false, "PostgreSQL wake mode: how soon a waiter on node B returns after node A commits, with LISTEN and poll-only (p50/p99)")
	fs.IntVar(&cfg.wakeN, "wake-samples", 100, "wake mode: samples per mode")
	fs.Var(&cfg.mem, "mem", "memory mode: load N receipts (-mem alone: 1M; -mem=10M) and report RSS and disk bytes per receipt")
	fs.Var(&cfg.scale, "scale", "scale mode: populate pebble-floor and receipts with N durable receipts each (like -mem: 1M, 10M), then run new and replay on them, replays spread over all N keys, and report the RSS after the run")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: receiptbench [flags]\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if cfg.quick && !flagSet(fs, "duration") {
		cfg.duration = time.Second
	}
	if !flagSet(fs, "warmup") {
		cfg.warmup = min(cfg.warmup, cfg.duration/4)
	}
	if cfg.replayN == 0 {
		cfg.replayN = 10000
		if cfg.quick {
			cfg.replayN = 2000
		}
	}
	if cfg.replayN < 1 {
		return nil, errors.New("-replay-keys must be positive")
	}
	if cfg.agedN < 1 {
		return nil, errors.New("-aged-receipts must be positive")
	}
	if cfg.wakeN < 1 {
		return nil, errors.New("-wake-samples must be positive")
	}
	if cfg.duration <= 0 {
		return nil, errors.New("-duration must be positive")
	}
	for _, c := range strings.Split(concs, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(c))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("bad -conc value %q", c)
		}
		cfg.concs = append(cfg.concs, n)
	}
	var err error
	if cfg.stores, err = setOf(storeList, allStores); err != nil {
		return nil, fmt.Errorf("-stores: %w", err)
	}
	if cfg.workloads, err = setOf(workloadList, allWorkloads); err != nil {
		return nil, fmt.Errorf("-workloads: %w", err)
	}
	if cfg.scale > 0 {
		if cfg.mem > 0 || cfg.purge > 0 || cfg.wake || cfg.fromJSON != "" {
			return nil, errors.New("-scale runs the comparison: not with -mem, -purge, -wake or -table")
		}
		if !flagSet(fs, "stores") {
			cfg.stores = map[string]bool{}
			for _, s := range scaleStores {
				cfg.stores[s] = true
			}
		}
		for s := range cfg.stores {
			if !slices.Contains(scaleStores, s) {
				return nil, fmt.Errorf("-scale runs on %s only, not %q", strings.Join(scaleStores, " and "), s)
			}
		}
		if !flagSet(fs, "workloads") {
			cfg.workloads = map[string]bool{"new": true, "replay": true}
		}
	}
	return cfg, nil
}

// pebbleStores are the stores that run on Pebble: their WAL syncs are counted.
var pebbleStores = []string{"pebble-floor", "receipts", "receipts-notomb", "receipts-sealed", "receipts-prom", "receipts-otel", "receipts-otel-sdk"}

// scaleStores are the stores -scale populates: the engine and its floor.
var scaleStores = []string{"pebble-floor", "receipts"}

func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

func setOf(list string, known []string) (map[string]bool, error) {
	m := map[string]bool{}
	for _, s := range strings.Split(list, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		ok := false
		for _, k := range known {
			ok = ok || k == s
		}
		if !ok {
			return nil, fmt.Errorf("unknown %q (known: %s)", s, strings.Join(known, ", "))
		}
		m[s] = true
	}
	return m, nil
}

// memFlag is -mem: a receipt count, "true" (bare -mem) meaning 1M; accepts K and M suffixes.
type memFlag int

func (m *memFlag) String() string   { return strconv.Itoa(int(*m)) }
func (m *memFlag) IsBoolFlag() bool { return true }
func (m *memFlag) Set(s string) error {
	switch s {
	case "true":
		*m = 1_000_000
		return nil
	case "false":
		*m = 0
		return nil
	}
	n, err := parseCount(s)
	*m = memFlag(n)
	return err
}

// countFlag is -scale: a receipt count with K and M suffixes, as -mem takes, but always
// with a value (-scale 1M), and 0 (the default) for off.
type countFlag int

func (c *countFlag) String() string { return strconv.Itoa(int(*c)) }
func (c *countFlag) Set(s string) error {
	n, err := parseCount(s)
	*c = countFlag(n)
	return err
}

// parseCount parses a receipt count: 250000, 250K, 1M, 10m.
func parseCount(s string) (int, error) {
	mult := 1
	switch {
	case strings.HasSuffix(s, "M"), strings.HasSuffix(s, "m"):
		mult, s = 1_000_000, s[:len(s)-1]
	case strings.HasSuffix(s, "K"), strings.HasSuffix(s, "k"):
		mult, s = 1_000, s[:len(s)-1]
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("want a receipt count like 1M, 10M or 250000")
	}
	return n * mult, nil
}

// stdout receives the table or the JSON (tests replace it).
var stdout io.Writer = os.Stdout

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "receiptbench: "+format+"\n", args...)
}

// machine describes where the run happened.
type machine struct {
	GOOS, GOARCH string
	CPUs         int
	GOMAXPROCS   int
	CPU          string
	Go           string
	FsyncP50     time.Duration
}

func describeMachine() machine {
	m := machine{GOOS: runtime.GOOS, GOARCH: runtime.GOARCH, CPUs: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), Go: runtime.Version()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	return m
}

// pebbleOptions are the Pebble options of the floor and the engine in this run.
func (c *config) pebbleOptions() *pebble.Options {
	o := stores.PebbleOptions()
	o.CacheSize = int64(c.cacheMiB) << 20
	return o
}
