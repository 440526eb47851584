package intentspg_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/intents"
	"github.com/receiptstore/receipts/intents/intentspg"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/receiptstore/receipts/receipthttp"
)

// TestTwoHostsShareAJournal: two hosts (each its own pool, journal and
// Dispatcher) on one schema deliver every approved action, both of them,
// to a receipthttp service: each action has one effect and ends
// succeeded, whichever host approved it.
func TestTwoHostsShareAJournal(t *testing.T) {
	leakCheck(t)
	ctx := context.Background()
	db, err := pebblestore.Open("svc", &pebblestore.Options{Options: receipts.Options{GCInterval: -1}, Pebble: &pebble.Options{FS: vfs.NewMem()}})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var mu sync.Mutex
	effects := map[string]int{} // by key
	mw, err := receipthttp.New(db, receipthttp.Config{Scope: func(*http.Request) (string, error) { return "hosts", nil }})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(5 * time.Millisecond) // long enough for the other host's attempt to meet this one
		mu.Lock()
		effects[r.Header.Get("Idempotency-Key")]++
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	})))
	defer srv.Close()

	p, schema := pool(t)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	var journals []*intents.Journal
	for range 2 {
		j, err := intentspg.Open(ctx, p, &intentspg.Options{Schema: schema, Journal: &intents.Options{PollInterval: 20 * time.Millisecond, Logger: quiet}})
		if err != nil {
			t.Fatal(err)
		}
		defer j.Close()
		d, err := intents.NewDispatcher(j, intents.DispatcherOptions{
			Transports: map[string]intents.Transport{"svc": &intents.HTTPTransport{BaseURL: srv.URL}},
			MinBackoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
		})
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		journals = append(journals, j)
	}
	var keys []string
	for i := range 20 {
		a, err := journals[i%2].Approve(ctx, intents.Approval{Target: "svc", Operation: "POST /x",
			Arguments: map[string]int{"i": i}, ApprovedBy: fmt.Sprintf("host-%d", i%2)})
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, a.Key)
	}
	for i, k := range keys {
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		a, err := journals[(i+1)%2].Wait(wctx, k) // the other host sees it too
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if a.State != intents.Succeeded {
			t.Fatalf("%s: %+v", k, a)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, k := range keys {
		if effects[k] != 1 {
			t.Fatalf("%s: %d effects", k, effects[k])
		}
	}
	if len(effects) != len(keys) {
		t.Fatalf("%d keys at the service, %d approved", len(effects), len(keys))
	}
}
