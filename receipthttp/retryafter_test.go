package receipthttp_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/receipthttp"
	"github.com/receiptstore/receipts/receiptstest"
)

// TestRetryAfterPerRoute: a route whose requests take 1.5 s, measured among
// many 100 ms requests of another. A duplicate on the slow route is told
// Retry-After: 2, on the fast one 1. With one estimate for the store (the
// fast route dominates it: about 0.2 s) both were told 1, and the slow
// route's clients came back too soon.
func TestRetryAfterPerRoute(t *testing.T) {
	clk := receiptstest.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	db, err := receipts.Open(t.TempDir(), &receipts.Options{Now: clk.Now, LeaseTTL: leaseTTL, GCInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	mw, err := receipthttp.New(db, receipthttp.Config{Scope: callerScope})
	if err != nil {
		t.Fatal(err)
	}
	started, gate := make(chan struct{}), make(chan struct{})
	handler := func(took time.Duration) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Query().Get("hold") != "" {
				started <- struct{}{}
				<-gate
			}
			clk.Advance(took)
			w.WriteHeader(http.StatusCreated)
		})
	}
	mux := http.NewServeMux()
	mux.Handle("POST /exports", mw(handler(1500*time.Millisecond)))
	mux.Handle("POST /items", mw(handler(100*time.Millisecond)))
	post := func(path, key string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, req(http.MethodPost, path, "alice", key, "x"))
		return w
	}
	post("/exports", "e0")
	for i := range 20 {
		post("/items", fmt.Sprint("i", i))
	}
	retryAfter := func(path string) int {
		t.Helper()
		done := make(chan struct{})
		go func() { defer close(done); post(path+"?hold=1", "held"+path) }()
		<-started
		resp := post(path+"?hold=1", "held"+path)
		gate <- struct{}{}
		<-done
		if resp.Code != http.StatusConflict {
			t.Fatalf("%s: status %d, want 409", path, resp.Code)
		}
		n, err := strconv.Atoi(resp.Header().Get("Retry-After"))
		if err != nil {
			t.Fatalf("%s: Retry-After %q", path, resp.Header().Get("Retry-After"))
		}
		return n
	}
	if got := retryAfter("/exports"); got != 2 {
		t.Errorf("/exports: Retry-After %d, want 2 (its one request took 1.5 s)", got)
	}
	if got := retryAfter("/items"); got != 1 {
		t.Errorf("/items: Retry-After %d, want 1", got)
	}
}
