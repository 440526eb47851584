// Command http-workitems is a small "create work item" tool service that
// shows package receipthttp at work: POST /v1/work-items takes an
// Idempotency-Key, runs once per key and caller, and commits the new item
// together with the receipt of its response in one synced batch. Retries
// get the stored response with "Idempotent-Replayed: true".
//
//	go run ./examples/http-workitems
//	curl -i -X POST localhost:8080/v1/work-items \
//	  -H 'Authorization: Bearer alice-token' -H 'Idempotency-Key: op-1' \
//	  -d '{"title":"Write the report"}'
//
// Callers are fixed demo tokens: alice-token (alice) and bob-token (bob).
// A read-only receiptadmin.Handler listens on -admin for receiptctl, with
// the store's Prometheus metrics (package receiptsprom) at /metrics:
//
//	go run ./cmd/receiptctl --addr http://127.0.0.1:8081/admin/receipts ls
//	curl -s localhost:8081/metrics | grep '^receipts_'
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
	"github.com/receiptstore/receipts/receiptadmin"
	"github.com/receiptstore/receipts/receiptsprom"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "http-workitems:", err)
		os.Exit(1)
	}
}

func run() error {
	addr := flag.String("addr", "127.0.0.1:8080", "listen address of the API")
	admin := flag.String("admin", "127.0.0.1:8081", `listen address of the read-only receipts admin API ("" = off)`)
	dir := flag.String("dir", filepath.Join(os.TempDir(), "receipts-http-workitems"), "store directory")
	delay := flag.Duration("delay", 0, "time each create takes (try a duplicate sent meanwhile)")
	leaseTTL := flag.Duration("lease", 30*time.Second, "lease TTL: how long an abandoned claim blocks its key")
	flag.Parse()

	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	metrics := receiptsprom.New(nil)
	db, err := receipts.Open(*dir, &receipts.Options{LeaseTTL: *leaseTTL, Logger: log, Observer: metrics})
	if err != nil {
		return err
	}
	defer db.Close()

	s := &service{
		db:     db,
		tokens: map[string]string{"alice-token": "alice", "bob-token": "bob"},
		delay:  *delay,
		now:    time.Now,
	}
	api, err := s.handler()
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	servers := []*http.Server{{Addr: *addr, Handler: api, ReadHeaderTimeout: 10 * time.Second}}
	if *admin != "" {
		servers = append(servers, &http.Server{Addr: *admin, Handler: adminMux(db, metrics), ReadHeaderTimeout: 10 * time.Second})
	}
	errc := make(chan error, len(servers))
	for _, srv := range servers {
		ln, err := net.Listen("tcp", srv.Addr)
		if err != nil {
			return err
		}
		log.Info("listening", "addr", ln.Addr().String(), "dir", *dir)
		go func() { errc <- srv.Serve(ln) }()
	}

	select {
	case <-ctx.Done():
	case err := <-errc:
		if !errors.Is(err, http.ErrServerClosed) {
			return err
		}
	}
	log.Info("shutting down")
	shutdown, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, srv := range servers {
		_ = srv.Shutdown(shutdown) // in-flight requests finish and record their receipts
	}
	return db.Close()
}

// adminMux serves the read-only receipts admin API and the Prometheus
// metrics: the store's (metrics, which observes db) and the process's.
func adminMux(db *receipts.DB, metrics *receiptsprom.Collector) http.Handler {
	metrics.Watch(db)
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	mux.Handle("/admin/receipts/", receiptadmin.Handler(db))
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	return mux
}
