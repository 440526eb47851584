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
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/intents"
	"github.com/receiptstore/receipts/intents/intentspg"
	"github.com/receiptstore/receipts/internal/pgtest"
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

// sharedService is a receipthttp service that counts, by key, the
// requests it receives (every delivery that reached it) and the effects
// it performs. The first request of a key in fail gets a 503 before
// receipthttp sees it: a delivery with no answer, which is retried.
type sharedService struct {
	srv *httptest.Server

	mu       sync.Mutex
	requests map[string]int
	firstAt  map[string]time.Time // the first request's arrival
	effects  map[string]int
	fail     map[string]bool
}

func newSharedService(t *testing.T) *sharedService {
	t.Helper()
	db, err := pebblestore.Open("svc", &pebblestore.Options{Options: receipts.Options{GCInterval: -1}, Pebble: &pebble.Options{FS: vfs.NewMem()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	mw, err := receipthttp.New(db, receipthttp.Config{Scope: func(*http.Request) (string, error) { return "hosts", nil }})
	if err != nil {
		t.Fatal(err)
	}
	s := &sharedService{requests: map[string]int{}, firstAt: map[string]time.Time{}, effects: map[string]int{}, fail: map[string]bool{}}
	inner := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.effects[r.Header.Get("Idempotency-Key")]++
		s.mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	}))
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		s.mu.Lock()
		if s.requests[key]++; s.requests[key] == 1 {
			s.firstAt[key] = time.Now()
		}
		fail := s.fail[key]
		s.fail[key] = false
		s.mu.Unlock()
		if fail {
			http.Error(w, "try again", http.StatusServiceUnavailable)
			return
		}
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

// TestHostsShareDeliveries: three hosts (each its own pool, journal and
// Dispatcher) on one intentspg journal deliver 60 actions, a third of
// which get a 503 on their first delivery. Each action is delivered by
// one host at a time, under a lease: it reaches the service once (twice
// for those that got a 503), has one effect, and its recorded Attempts is
// the number of deliveries the service received, whichever hosts made
// them. Before leases every host delivered every action (about 2 to 3
// deliveries each here), and Attempts counted one host's.
func TestHostsShareDeliveries(t *testing.T) {
	leakCheck(t)
	ctx := context.Background()
	svc := newSharedService(t)
	dsn, schema := pgtest.Schema(t)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	const hosts, actions = 3, 60
	var journals []*intents.Journal
	for range hosts {
		p, err := pgxpool.New(ctx, dsn) // a pool per host, as separate processes have
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		j, err := intentspg.Open(ctx, p, &intentspg.Options{Schema: schema, Journal: &intents.Options{PollInterval: 20 * time.Millisecond, Logger: quiet}})
		if err != nil {
			t.Fatal(err)
		}
		defer j.Close()
		d, err := intents.NewDispatcher(j, intents.DispatcherOptions{
			Transports: map[string]intents.Transport{"svc": &intents.HTTPTransport{BaseURL: svc.srv.URL}},
			MinBackoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
		})
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		journals = append(journals, j)
	}
	var keys []string
	wantRequests := map[string]int{}
	for i := range actions {
		a, err := journals[i%hosts].Approve(ctx, intents.Approval{Target: "svc", Operation: "POST /x",
			Arguments: map[string]int{"i": i}, ApprovedBy: fmt.Sprintf("host-%d", i%hosts)})
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, a.Key)
		wantRequests[a.Key] = 1
		if i%3 == 0 {
			svc.mu.Lock()
			if svc.requests[a.Key] == 0 { // (not delivered yet: the 503 is its first answer)
				svc.fail[a.Key] = true
				wantRequests[a.Key] = 2
			}
			svc.mu.Unlock()
		}
	}
	got := map[string]*intents.Action{}
	for i, k := range keys {
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		a, err := journals[(i+1)%hosts].Wait(wctx, k)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		got[k] = a
	}
	svc.mu.Lock()
	defer svc.mu.Unlock()
	deliveries, want := 0, 0
	for _, k := range keys {
		deliveries, want = deliveries+svc.requests[k], want+wantRequests[k]
	}
	t.Logf("%d hosts, %d actions: %d deliveries (%.2f per action; %d expected: one each, and a second after a 503)",
		hosts, actions, deliveries, float64(deliveries)/actions, want)
	for _, k := range keys {
		a := got[k]
		switch {
		case a.State != intents.Succeeded:
			t.Errorf("%s: %v (%s)", k, a.State, a.LastError)
		case svc.effects[k] != 1:
			t.Errorf("%s: %d effects", k, svc.effects[k])
		case svc.requests[k] != wantRequests[k]:
			t.Errorf("%s: delivered %d times, want %d: more than one host delivered it", k, svc.requests[k], wantRequests[k])
		case int(a.Attempts) != svc.requests[k]:
			t.Errorf("%s: Attempts %d, the service got %d deliveries", k, a.Attempts, svc.requests[k])
		}
	}
}

// TestDeadHostIsReplaced: a host claimed an action (its delivery counted)
// and died before sending it, leaving its lease in the journal. Two live
// hosts do not deliver it while that lease runs, and one of them does once
// it ends: one delivery, one effect, Attempts 2 (the dead host's counted
// delivery that never left, and the live one).
func TestDeadHostIsReplaced(t *testing.T) {
	leakCheck(t)
	ctx := context.Background()
	svc := newSharedService(t)
	p, schema := pool(t)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	j, err := intentspg.Open(ctx, p, &intentspg.Options{Schema: schema, Journal: &intents.Options{PollInterval: 20 * time.Millisecond, Logger: quiet}})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	a, err := j.Approve(ctx, intents.Approval{Target: "svc", Operation: "POST /x", ApprovedBy: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	leaseEnd := time.Now().Add(time.Second)
	if _, err := p.Exec(ctx, `UPDATE `+schema+`.actions SET holder = 'dead-host:4711', lease_until = $2, attempts = 1 WHERE key = $1`, a.Key, leaseEnd); err != nil {
		t.Fatal(err)
	}
	if got, err := j.Get(ctx, a.Key); err != nil || got.Holder != "dead-host:4711" || !got.LeaseUntil.Equal(leaseEnd.Truncate(time.Microsecond)) {
		t.Fatalf("the dead host's lease: %+v, %v", got, err)
	}
	for range 2 {
		d, err := intents.NewDispatcher(j, intents.DispatcherOptions{
			Transports: map[string]intents.Transport{"svc": &intents.HTTPTransport{BaseURL: svc.srv.URL}},
		})
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	done, err := j.Wait(wctx, a.Key)
	if err != nil {
		t.Fatal(err)
	}
	svc.mu.Lock()
	defer svc.mu.Unlock()
	if first := svc.firstAt[a.Key]; first.Before(leaseEnd.Truncate(time.Microsecond)) { // as stored
		t.Errorf("delivered at %v, while the dead host's lease ran (until %v)", first, leaseEnd)
	}
	if done.State != intents.Succeeded || svc.requests[a.Key] != 1 || svc.effects[a.Key] != 1 || done.Attempts != 2 || done.Holder != "" {
		t.Fatalf("%v, %d deliveries, %d effects, Attempts %d, holder %q", done.State, svc.requests[a.Key], svc.effects[a.Key], done.Attempts, done.Holder)
	}
}
