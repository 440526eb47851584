package receipthttp_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/receipthttp"
)

// stepApp is a handler of three steps (reserve, charge, notify). Step
// failStep (1-based) fails with an unknown outcome while failing is set;
// then the handler answers then (the step's error is the handler's to
// ignore or pass on). names overrides the step names, for a mismatch.
type stepApp struct {
	runs      [3]atomic.Int32
	recovered [3]atomic.Bool
	keys      [3]atomic.Value
	failStep  int
	failing   atomic.Bool
	then      int // the status the handler answers after a step failed
	names     atomic.Pointer[[3]string]
}

func (s *stepApp) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a, _ := receipthttp.AttemptFrom(r.Context())
	names := [3]string{"reserve", "charge", "notify"}
	if n := s.names.Load(); n != nil {
		names = *n
	}
	var out []string
	for i, name := range names {
		res, err := a.Step(r.Context(), name, nil, func(ctx context.Context, st *receipts.Step) ([]byte, error) {
			s.runs[i].Add(1)
			s.recovered[i].Store(st.Recovered())
			s.keys[i].Store(st.ProviderKey())
			if s.failStep == i+1 && s.failing.Load() {
				return nil, errors.New("connection reset by the provider")
			}
			return []byte(name + "-done"), nil
		})
		if err != nil {
			w.WriteHeader(s.then)
			fmt.Fprintf(w, "step %s: %v", name, err)
			return
		}
		out = append(out, string(res))
	}
	w.WriteHeader(http.StatusCreated)
	fmt.Fprint(w, strings.Join(out, ","))
}

// TestStepUnknownIsNotRecorded: a step whose outcome is unknown answers
// 503 ProblemNotRecorded naming the step, whatever the handler writes
// after it (a success, a 5xx, a 409 that would release, a 4xx that would
// be stored); the retry resumes: the finished steps are not run again, and
// the uncertain one runs Recovered with the same provider key.
func TestStepUnknownIsNotRecorded(t *testing.T) {
	for _, then := range []int{http.StatusCreated, http.StatusInternalServerError, http.StatusConflict, http.StatusUnprocessableEntity} {
		t.Run(fmt.Sprint(then), func(t *testing.T) {
			app := &stepApp{failStep: 3, then: then}
			app.failing.Store(true)
			e := newEnv(t, receipthttp.Config{}, app)
			p := wantProblem(t, e.post("alice", "k1", "x"), http.StatusServiceUnavailable, receipthttp.ProblemNotRecorded)
			if p.Step != "notify" {
				t.Fatalf("problem step = %q, want notify", p.Step)
			}
			key1 := app.keys[2].Load()
			app.failing.Store(false)
			w := e.post("alice", "k1", "x")
			wantStatus(t, w, http.StatusCreated)
			if got := w.Body.String(); got != "reserve-done,charge-done,notify-done" {
				t.Fatalf("body = %q", got)
			}
			for i, want := range []int32{1, 1, 2} {
				if n := app.runs[i].Load(); n != want {
					t.Fatalf("step %d ran %d times, want %d", i, n, want)
				}
			}
			if !app.recovered[2].Load() || app.keys[2].Load() != key1 {
				t.Fatalf("retry of the uncertain step: recovered %v, key %v (was %v)", app.recovered[2].Load(), app.keys[2].Load(), key1)
			}
			if w := e.post("alice", "k1", "x"); w.Header().Get(receipthttp.ReplayedHeader) != "true" {
				t.Fatalf("third call not replayed: %d %s", w.Code, w.Body)
			}
		})
	}
}

// TestStepMismatchIsRefused: a retry whose handler calls another step
// than the journal holds gets 500 ProblemStepMismatch naming it, whatever
// the handler answers, and nothing runs; the claim stays abandoned, and a
// retry with the recorded steps resumes.
func TestStepMismatchIsRefused(t *testing.T) {
	app := &stepApp{failStep: 2, then: http.StatusCreated}
	app.failing.Store(true)
	e := newEnv(t, receipthttp.Config{}, app)
	wantProblem(t, e.post("alice", "k1", "x"), http.StatusServiceUnavailable, receipthttp.ProblemNotRecorded)
	app.failing.Store(false)
	app.names.Store(&[3]string{"reserve", "refund", "notify"})
	p := wantProblem(t, e.post("alice", "k1", "x"), http.StatusInternalServerError, receipthttp.ProblemStepMismatch)
	if p.Step != "refund" {
		t.Fatalf("problem step = %q, want refund", p.Step)
	}
	if a, b := app.runs[0].Load(), app.runs[1].Load(); a != 1 || b != 1 {
		t.Fatalf("runs after the mismatch: %d %d, want 1 1", a, b)
	}
	rec, err := e.db.Lookup(t.Context(), receipts.Key{Scope: "alice", ID: "k1"})
	if err != nil || !rec.Abandoned(e.clk.Now()) {
		t.Fatalf("after a mismatch: %+v, %v; want an abandoned claim", rec, err)
	}
	app.names.Store(nil)
	wantStatus(t, e.post("alice", "k1", "x"), http.StatusCreated)
	if a, b, c := app.runs[0].Load(), app.runs[1].Load(), app.runs[2].Load(); a != 1 || b != 2 || c != 1 {
		t.Fatalf("runs after resuming: %d %d %d, want 1 2 1", a, b, c)
	}
}
