package receipthttp_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/receipthttp"
)

// A retry after the stored response's retention, within the store's
// tombstone window, gets 410 Gone, whatever the payload, and the handler
// does not run again; after the window the key is a new request.
func TestExpiredKeyGets410(t *testing.T) {
	app := &counter{}
	e := newEnv(t, receipthttp.Config{}, app)
	wantStatus(t, e.post("alice", "k1", `{"title":"a"}`), http.StatusCreated)
	opts := e.db.Options()
	e.clk.Advance(opts.Retention)
	for _, body := range []string{`{"title":"a"}`, `{"title":"other"}`} {
		w := e.post("alice", "k1", body)
		wantStatus(t, w, http.StatusGone)
		if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" {
			t.Fatalf("Content-Type %q", ct)
		}
		var p receipthttp.Problem
		if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
			t.Fatal(err)
		}
		if p.Type != receipthttp.ProblemKeyExpired || p.Status != http.StatusGone {
			t.Fatalf("problem %+v", p)
		}
	}
	if n := app.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
	e.clk.Advance(opts.TombstoneWindow)
	wantStatus(t, e.post("alice", "k1", `{"title":"a"}`), http.StatusCreated)
	if n := app.runs.Load(); n != 2 {
		t.Fatalf("handler ran %d times, want 2 (a new request after the window)", n)
	}
	if _, err := e.db.Lookup(t.Context(), receipts.Key{Scope: "alice", ID: "k1"}); err != nil {
		t.Fatal(err)
	}
}
