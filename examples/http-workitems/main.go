// Command http-workitems is a small "create work item" tool service that
// shows package receipthttp at work: POST /v1/work-items takes an
// Idempotency-Key, runs once per key and caller, and commits the new item
// together with the receipt of its response (one synced Pebble batch, or
// one PostgreSQL transaction). Retries get the stored response with
// "Idempotent-Replayed: true".
//
//	go run ./examples/http-workitems
//	curl -i -X POST localhost:8080/v1/work-items \
//	  -H 'Authorization: Bearer alice-token' -H 'Idempotency-Key: op-1' \
//	  -d '{"title":"Write the report"}'
//
// On PostgreSQL, several instances share one database, as the replicas of
// a service do, and a retry may land on any of them (docs/two-instances.md):
//
//	go run ./examples/http-workitems -pg postgres://app@db/app   # a server
//	go run ./examples/http-workitems -pg                         # a throwaway cluster
//
// -pg alone starts a throwaway cluster from the installed PostgreSQL server
// binaries, removed at exit, and logs its DSN for a second instance:
//
//	go run ./examples/http-workitems -pg 'postgres://...' -addr 127.0.0.1:8090 -admin ''
//
// Callers are fixed demo tokens: alice-token (alice) and bob-token (bob).
// A read-only receiptadmin.Handler listens on -admin for receiptctl, with
// the store's Prometheus metrics (package receiptsprom) at /metrics and the
// operators' console (package receiptconsole, loopback only) at /admin/console/:
//
//	go run ./cmd/receiptctl --addr http://127.0.0.1:8081/admin/receipts ls
//	curl -s localhost:8081/metrics | grep '^receipts_'
//	open http://127.0.0.1:8081/admin/console/
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/examples/internal/exampledb"
	"github.com/receiptstore/receipts/receiptadmin"
	"github.com/receiptstore/receipts/receiptconsole"
	"github.com/receiptstore/receipts/receiptsprom"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "http-workitems:", err)
		os.Exit(1)
	}
}

// config is an instance's command line.
type config struct {
	addr, admin string
	dir         string
	pg          exampledb.PGFlag
	schema      string
	delay       time.Duration
	leaseTTL    time.Duration
	log         *slog.Logger
	now         func() time.Time // the store's and the service's clock (tests); nil: time.Now
}

func run() error {
	var c config
	fs := flag.NewFlagSet("http-workitems", flag.ExitOnError)
	fs.StringVar(&c.addr, "addr", "127.0.0.1:8080", "listen address of the API")
	fs.StringVar(&c.admin, "admin", "127.0.0.1:8081", `listen address of the read-only receipts admin API ("" = off)`)
	fs.StringVar(&c.dir, "dir", filepath.Join(os.TempDir(), "receipts-http-workitems"), "store directory (Pebble)")
	fs.Var(&c.pg, "pg", "keep the store on PostgreSQL: -pg DSN, or -pg alone for a throwaway cluster")
	fs.StringVar(&c.schema, "schema", "workitems", "PostgreSQL schema of the store and the work items (with -pg)")
	fs.DurationVar(&c.delay, "delay", 0, "time each create takes (try a duplicate sent meanwhile)")
	fs.DurationVar(&c.leaseTTL, "lease", 30*time.Second, "lease TTL: how long an abandoned claim blocks its key")
	_ = fs.Parse(exampledb.Args(os.Args[1:]))
	c.log = slog.New(slog.NewTextHandler(os.Stderr, nil))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	in, err := start(ctx, c)
	if err != nil {
		return err
	}
	select {
	case <-ctx.Done():
	case err := <-in.errc:
		if !errors.Is(err, http.ErrServerClosed) {
			_ = in.stop()
			return err
		}
	}
	c.log.Info("shutting down")
	return in.stop()
}

// instance is a running service: its store and its listeners.
type instance struct {
	store   *exampledb.Store
	servers []*http.Server
	addrs   []string // the servers' addresses: the API's, then the admin's
	errc    chan error
	log     *slog.Logger
}

// start opens the store c names and serves the API (and the admin API) on
// their addresses, until stop.
func start(ctx context.Context, c config) (*instance, error) {
	metrics := receiptsprom.New(nil)
	now := c.now
	if now == nil {
		now = time.Now
	}
	store, err := exampledb.Open(ctx, exampledb.Config{
		Dir: c.dir, PG: string(c.pg), Schema: c.schema, Log: c.log,
		Options: receipts.Options{LeaseTTL: c.leaseTTL, Logger: c.log, Observer: metrics, Now: c.now},
	})
	if err != nil {
		return nil, err
	}
	items, err := storeItems(ctx, store)
	if err != nil {
		return nil, errors.Join(err, store.Close())
	}
	s := &service{
		db:     store.DB,
		items:  items,
		tokens: map[string]string{"alice-token": "alice", "bob-token": "bob"},
		delay:  c.delay,
		now:    now,
	}
	api, err := s.handler()
	if err != nil {
		return nil, errors.Join(err, store.Close())
	}
	in := &instance{store: store, log: c.log}
	var servedBy string // the API's address, once it listens
	api = withServedBy(&servedBy, api)
	in.servers = []*http.Server{{Addr: c.addr, Handler: api, ReadHeaderTimeout: 10 * time.Second}}
	if c.admin != "" {
		in.servers = append(in.servers, &http.Server{Addr: c.admin, Handler: adminMux(store.DB, metrics), ReadHeaderTimeout: 10 * time.Second})
	}
	in.errc = make(chan error, len(in.servers))
	for _, srv := range in.servers {
		ln, err := net.Listen("tcp", srv.Addr)
		if err != nil {
			return nil, errors.Join(err, in.stop())
		}
		in.addrs = append(in.addrs, ln.Addr().String())
		if servedBy == "" {
			servedBy = ln.Addr().String()
		}
		where := []any{"addr", ln.Addr().String()}
		if c.pg == "" {
			where = append(where, "dir", c.dir)
		} else {
			where = append(where, "schema", store.Schema)
		}
		c.log.Info("listening", where...)
		go func() { in.errc <- srv.Serve(ln) }()
	}
	return in, nil
}

// storeItems returns where the service keeps the items of store: a table
// of its PostgreSQL schema, or its Pebble database.
func storeItems(ctx context.Context, store *exampledb.Store) (items, error) {
	if store.Pool != nil {
		return newPGItems(ctx, store.Pool, store.Schema)
	}
	return newPebbleItems(store.DB)
}

// withServedBy sets the Served-By header of every response to the
// instance's address, so that a client sees which instance answered: a
// replay carries the instance that replayed it (the header is not stored).
func withServedBy(addr *string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Served-By", *addr)
		h.ServeHTTP(w, r)
	})
}

// stop shuts the servers down (requests in flight finish and record their
// receipts) and closes the store.
func (in *instance) stop() error {
	shutdown, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, srv := range in.servers {
		_ = srv.Shutdown(shutdown)
	}
	return in.store.Close()
}

// adminMux serves the read-only receipts admin API, the operators' console
// (loopback only: the demo has no operator authentication) and the Prometheus
// metrics: the store's (metrics, which observes db) and the process's.
func adminMux(db *receipts.DB, metrics *receiptsprom.Collector) http.Handler {
	metrics.Watch(db)
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	mux.Handle("/admin/receipts/", receiptadmin.Handler(db))
	mux.Handle("/admin/console/", receiptconsole.Handler(db, nil))
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	return mux
}
