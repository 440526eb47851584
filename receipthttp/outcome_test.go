package receipthttp_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/receiptstore/receipts/receipthttp"
)

// TestUnrecordedResponseAbandonsClaim: a handler whose response cannot be
// recorded (a staged effect fails, so the commit does) gets 503 "not
// recorded", and its claim is abandoned: the client's retry takes over at
// once, Recovered, instead of getting 409 for a whole lease.
func TestUnrecordedResponseAbandonsClaim(t *testing.T) {
	var failEffect = true
	attempts := make(chan receipthttp.Attempt, 2)
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a, _ := receipthttp.AttemptFrom(r.Context())
		attempts <- *a
		fail := failEffect
		a.Stage(pebblestore.Effect(func(b *pebble.Batch) error {
			if fail {
				return errors.New("disk quota exceeded")
			}
			return b.Set([]byte("app/"+a.Key.ID), []byte("done"), nil)
		}))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"ok":true}`)
	})
	e := newEnv(t, receipthttp.Config{}, app)
	w := e.post("alice", "k1", "x")
	wantProblem(t, w, http.StatusServiceUnavailable, receipthttp.ProblemNotRecorded)
	if ra := w.Header().Get("Retry-After"); ra != "1" {
		t.Fatalf("Retry-After = %q, want 1", ra)
	}
	if a := <-attempts; a.Number != 1 || a.Recovered {
		t.Fatalf("first attempt = %+v", a)
	}
	rec, err := e.db.Lookup(t.Context(), receipts.Key{Scope: "alice", ID: "k1"})
	if err != nil || !rec.Abandoned(e.clk.Now()) {
		t.Fatalf("after a failed recording: %+v, %v; want an abandoned claim", rec, err)
	}

	// The retry, right away (no time passes): it runs, recovered.
	failEffect = false
	wantStatus(t, e.post("alice", "k1", "x"), http.StatusCreated)
	if a := <-attempts; a.Number != 2 || !a.Recovered {
		t.Fatalf("retry attempt = %+v, want Number 2, Recovered", a)
	}
	if w := e.post("alice", "k1", "x"); w.Header().Get(receipthttp.ReplayedHeader) != "true" {
		t.Fatalf("third call not replayed: %d %s", w.Code, w.Body)
	}
}

// TestCloseWaitsForHandler: db.Close during an in-flight handler waits for
// it and for its response to be recorded; after a restart the retry gets
// the stored response.
func TestCloseWaitsForHandler(t *testing.T) {
	app := &counter{gate: make(chan struct{}), started: make(chan struct{}, 1)}
	e := newEnv(t, receipthttp.Config{}, app)
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() { done <- e.post("alice", "k1", "x") }()
	waitStarted(t, app.started, done)

	closed := make(chan error, 1)
	db := e.db
	go func() { closed <- db.Close() }()
	waitClosing(t, db)
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while a handler was in flight", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(app.gate)
	first := <-done
	wantStatus(t, first, http.StatusCreated)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}

	e.open()
	again := e.post("alice", "k1", "x")
	wantStatus(t, again, http.StatusCreated)
	if again.Header().Get(receipthttp.ReplayedHeader) != "true" || again.Body.String() != first.Body.String() {
		t.Fatalf("retry after restart: %s %q, want the replay of %q", again.Header(), again.Body, first.Body)
	}
	if n := app.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

// TestRetryAfterFollowsOperationTimes: after a few requests that took
// 100ms, a duplicate of one in progress is told to retry in 1s (the whole
// second the estimate rounds up to), not in the lease's 30s.
func TestRetryAfterFollowsOperationTimes(t *testing.T) {
	gate := make(chan struct{})
	var e *env
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Slow") != "" {
			<-gate
		}
		e.clk.Advance(100 * time.Millisecond)
		w.WriteHeader(http.StatusCreated)
	})
	e = newEnv(t, receipthttp.Config{}, app)
	for i := range 5 {
		wantStatus(t, e.post("alice", fmt.Sprint("fast", i), "x"), http.StatusCreated)
	}
	slow := func() *http.Request {
		r := req(http.MethodPost, "/items", "alice", "slow", "x")
		r.Header.Set("X-Slow", "1")
		return r
	}
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() { done <- e.do(slow()) }()
	// Wait until the slow request holds its claim.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := e.db.Lookup(t.Context(), receipts.Key{Scope: "alice", ID: "slow"}); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the slow request never claimed its key")
		}
		time.Sleep(time.Millisecond)
	}
	w := e.do(slow())
	wantProblem(t, w, http.StatusConflict, receipthttp.ProblemInProgress)
	close(gate)
	wantStatus(t, <-done, http.StatusCreated)
	if ra := w.Header().Get("Retry-After"); ra != "1" {
		t.Fatalf("Retry-After = %q, want 1 (operations take 100ms; the lease is %s)", ra, leaseTTL)
	}
}

// waitClosing polls until Close has begun (new calls get ErrClosed).
func waitClosing(t *testing.T, db *receipts.DB) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := db.Lookup(t.Context(), receipts.Key{Scope: "probe", ID: "probe"}); errors.Is(err, receipts.ErrClosed) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("Close did not begin")
		}
		time.Sleep(time.Millisecond)
	}
}
