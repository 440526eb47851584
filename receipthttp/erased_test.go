package receipthttp_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/receiptstore/receipts/receipthttp"
)

// A retry in a scope that was erased (receipts.DB.EraseScope) gets 410 Gone with
// ProblemKeyErased, whatever the payload, and the handler does not run again; another
// scope is served as before.
func TestErasedScopeGets410(t *testing.T) {
	app := &counter{}
	e := newEnv(t, receipthttp.Config{}, app)
	wantStatus(t, e.post("alice", "k1", `{"title":"a"}`), http.StatusCreated)
	wantStatus(t, e.post("bob", "k1", `{"title":"a"}`), http.StatusCreated)
	if _, err := e.db.EraseScope(t.Context(), "alice"); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"k1", "never-used"} {
		w := e.post("alice", id, `{"title":"a"}`)
		wantStatus(t, w, http.StatusGone)
		var p receipthttp.Problem
		if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
			t.Fatal(err)
		}
		if p.Type != receipthttp.ProblemKeyErased || p.Status != http.StatusGone {
			t.Fatalf("problem %+v", p)
		}
	}
	if n := app.runs.Load(); n != 2 {
		t.Fatalf("handler ran %d times, want 2", n)
	}
	wantStatus(t, e.post("bob", "k1", `{"title":"a"}`), http.StatusCreated) // a replay
	if n := app.runs.Load(); n != 2 {
		t.Fatalf("handler ran %d times, want 2", n)
	}
}
