package intents_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/receiptstore/receipts/intents"
)

// stepService answers POST /v1/trips as a service whose multi-step action
// died in a step: 503 with a problem details body naming the step (body),
// until ok is set; then 201.
type stepService struct {
	srv  *httptest.Server
	ok   atomic.Bool
	body atomic.Pointer[string]
	ct   atomic.Pointer[string]
	reqs atomic.Int32
	// hang, if set, is closed by the test's end: every request after the first waits for it
	// (or for its client to give up) and answers nothing.
	hang chan struct{}
}

func newStepService(t *testing.T) *stepService {
	t.Helper()
	return newStepServiceHanging(t, false)
}

// newStepServiceHanging is newStepService whose requests after the first hang, if hang is set.
func newStepServiceHanging(t *testing.T, hang bool) *stepService {
	t.Helper()
	s := &stepService{}
	if hang {
		s.hang = make(chan struct{})
	}
	body, ct := `{"type":"https://receipts.dev/problems/outcome-unknown","title":"Outcome unknown","status":503,"step":"charge"}`, "application/problem+json"
	s.body.Store(&body)
	s.ct.Store(&ct)
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.reqs.Add(1) > 1 && s.hang != nil {
			select {
			case <-s.hang:
			case <-r.Context().Done():
			}
			return
		}
		if s.ok.Load() {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, `{"trip":"booked"}`)
			return
		}
		w.Header().Set("Content-Type", *s.ct.Load())
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, *s.body.Load())
	}))
	t.Cleanup(s.srv.Close)
	if hang {
		t.Cleanup(func() { close(s.hang) }) // before srv.Close, which waits for the requests
	}
	return s
}

// deliverUntilUncertain approves one action in j and dispatches it to svc
// until its deadline: it returns the action, Uncertain.
func deliverUntilUncertain(t *testing.T, j *intents.Journal, svc *stepService) *intents.Action {
	t.Helper()
	ctx := context.Background()
	d, err := intents.NewDispatcher(j, intents.DispatcherOptions{
		Transports: map[string]intents.Transport{"trips": &intents.HTTPTransport{BaseURL: svc.srv.URL}},
		MinBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	a, err := j.Approve(ctx, intents.Approval{Target: "trips", Operation: "POST /v1/trips", Arguments: map[string]string{"to": "Lisbon"},
		ApprovedBy: "alice", Deadline: time.Now().Add(300 * time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	got, err := j.Wait(wctx, a.Key)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != intents.Uncertain || got.Attempts < 2 {
		t.Fatalf("want an uncertain action after several attempts: %+v", got)
	}
	return got
}

// TestUncertainStep: a service that answers "outcome unknown" naming the
// step of its action that was uncertain (HTTP 503, problem details with a
// "step" member) makes the uncertain action say which step it was; the
// journal keeps it across a restart and through Redeliver, and an answer
// clears it. Answers without a step string name none.
func TestUncertainStep(t *testing.T) {
	svc := newStepService(t)
	dir := t.TempDir()
	opts := &intents.Options{PollInterval: 20 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	j, err := intents.Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	got := deliverUntilUncertain(t, j, svc)
	if got.UncertainStep != "charge" {
		t.Fatalf("UncertainStep = %q, want charge: %+v", got.UncertainStep, got)
	}
	if !strings.Contains(got.LastError, "503") || !strings.Contains(got.LastError, `step "charge" uncertain`) {
		t.Fatalf("LastError = %q", got.LastError)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}

	// Kept by the store: a restart reads it back.
	j, err = intents.Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	ctx := context.Background()
	a, err := j.Get(ctx, got.Key)
	if err != nil || a.UncertainStep != "charge" || a.State != intents.Uncertain {
		t.Fatalf("after a restart: %+v, %v", a, err)
	}

	// Redelivered: it keeps the step until an answer, which clears it.
	if a, err = j.Redeliver(ctx, got.Key, time.Now().Add(20*time.Second)); err != nil || a.UncertainStep != "charge" {
		t.Fatalf("Redeliver: %+v, %v", a, err)
	}
	svc.ok.Store(true)
	d, err := intents.NewDispatcher(j, intents.DispatcherOptions{
		Transports: map[string]intents.Transport{"trips": &intents.HTTPTransport{BaseURL: svc.srv.URL}}})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	a, err = j.Wait(wctx, got.Key)
	_ = d.Close()
	if err != nil || a.State != intents.Succeeded || a.UncertainStep != "" {
		t.Fatalf("answered: %+v, %v", a, err)
	}

	// Tolerant: a body without a step, a step that is not a string, and a
	// body that is not JSON name none.
	svc.ok.Store(false)
	for _, c := range []struct{ ct, body string }{
		{"application/problem+json", `{"type":"https://receipts.dev/problems/outcome-unknown","status":503}`},
		{"application/problem+json", `{"type":"x","step":42}`},
		{"application/problem+json", `{"type":"x","step":""}`},
		{"text/plain", `{"step":"charge"}`},
		{"application/json", `not json`},
	} {
		svc.body.Store(&c.body)
		svc.ct.Store(&c.ct)
		if a := deliverUntilUncertain(t, j, svc); a.UncertainStep != "" {
			t.Fatalf("%s %s: UncertainStep = %q", c.ct, c.body, a.UncertainStep)
		}
	}
}

func TestStepOf(t *testing.T) {
	for body, want := range map[string]string{
		`{"type":"t","step":"charge"}`: "charge",
		`{"step":"send itinerary"}`:    "send itinerary",
		`{"step":7}`:                   "",
		`{"step":null}`:                "",
		`{"step":"  "}`:                "",
		`{"type":"t"}`:                 "",
		`["step"]`:                     "",
		``:                             "",
		`{"step":"` + strings.Repeat("s", 513) + `"}`: "",
	} {
		if got := intents.StepOf([]byte(body)); got != want {
			t.Errorf("StepOf(%.40s) = %q, want %q", body, got, want)
		}
	}
}

// TestDeadlineCutKeepsLastAnswer: when the deadline cuts an attempt that is still waiting
// for its reply, the action turns Uncertain with what the service last said (here a 503
// naming the uncertain step), not with the cut, which learned nothing.
func TestDeadlineCutKeepsLastAnswer(t *testing.T) {
	svc := newStepServiceHanging(t, true) // its first answer is a 503 naming the step; then nothing
	j, err := intents.Open(t.TempDir(), &intents.Options{PollInterval: 20 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	got := deliverUntilUncertain(t, j, svc)
	if got.UncertainStep != "charge" || !strings.Contains(got.LastError, "503") || !strings.Contains(got.LastError, `step "charge" uncertain`) {
		t.Fatalf("want the 503 naming the step as the last error: %+v", got)
	}
}
