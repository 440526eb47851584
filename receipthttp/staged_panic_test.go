package receipthttp_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/receipthttp"
)

// TestPanickingStagedEffectAbandonsClaim (issue 43, item 2): a handler's staged effect
// (Attempt.Stage) that panics while the response is recorded abandons the claim at once: the
// panic reaches the server, and the client's retry runs right away, Recovered, instead of
// getting 409 for a whole lease.
func TestPanickingStagedEffectAbandonsClaim(t *testing.T) {
	explode := true
	attempts := make(chan receipthttp.Attempt, 2)
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a, _ := receipthttp.AttemptFrom(r.Context())
		attempts <- *a
		boom := explode
		a.Stage(receipts.EffectOn(func(_ context.Context, b *pebble.Batch) error {
			if boom {
				panic("effect exploded")
			}
			return b.Set([]byte("app/"+a.Key.ID), []byte("done"), nil)
		}))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"ok":true}`)
	})
	e := newEnv(t, receipthttp.Config{}, app)
	var got any
	func() {
		defer func() { got = recover() }()
		e.post("alice", "k1", "x")
	}()
	if got != "effect exploded" {
		t.Fatalf("the server recovered %v, want the effect's panic", got)
	}
	if a := <-attempts; a.Number != 1 || a.Recovered {
		t.Fatalf("first attempt = %+v", a)
	}

	explode = false // the retry, right away (no time passes): it runs, recovered
	wantStatus(t, e.post("alice", "k1", "x"), http.StatusCreated)
	if a := <-attempts; a.Number != 2 || !a.Recovered {
		t.Fatalf("retry attempt = %+v, want Number 2, Recovered", a)
	}
}
