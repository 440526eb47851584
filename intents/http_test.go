package intents_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/intents"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/receiptstore/receipts/receipthttp"
	"github.com/receiptstore/receipts/receiptstest"
)

// charge is the request body of the test service's POST /v1/charges.
type charge struct {
	Intent string `json:"intent"` // the test's name for the action; never a key
	Amount int    `json:"amount"`
}

// httpService is a real receipthttp service on a receipts store, over a
// real listener on 127.0.0.1. Its effects are counted by intent.
type httpService struct {
	t     *testing.T
	db    *receipts.DB
	clock *receiptstest.Clock
	srv   *httptest.Server

	mu      sync.Mutex
	effects map[string]int             // intent → effects performed
	keys    map[string]map[string]bool // intent → keys it arrived with
	dropped map[string]bool            // intents whose first response was dropped
	reqs    map[string]int             // intent → requests received (deliveries)

	dropFirst atomic.Bool            // drop the first response of each intent after it is recorded
	slow      chan struct{}          // when set, creates wait on it
	down      atomic.Bool            // answer 503 to everything
	busyFor   atomic.Pointer[string] // when set, answer 503 with this Retry-After
	runs      atomic.Int64           // handler runs
	lastReq   atomic.Pointer[string] // the last Idempotency-Key seen
}

func newHTTPService(t *testing.T) *httpService {
	t.Helper()
	s := &httpService{t: t, clock: receiptstest.NewClock(time.Now()),
		effects: map[string]int{}, keys: map[string]map[string]bool{}, dropped: map[string]bool{}, reqs: map[string]int{}}
	db, err := pebblestore.Open("svc", &pebblestore.Options{
		Options: receipts.Options{
			Now:        s.clock.Now,
			Retention:  time.Hour,
			LeaseTTL:   2 * time.Second,
			GCInterval: -1,
		},
		Pebble: &pebble.Options{FS: vfs.NewMem()},
	})
	if err != nil {
		t.Fatal(err)
	}
	s.db = db
	mw, err := receipthttp.New(db, receipthttp.Config{Scope: func(*http.Request) (string, error) { return "host-1", nil }})
	if err != nil {
		t.Fatal(err)
	}
	inner := mw(http.HandlerFunc(s.create))
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(strings.NewReader(string(body)))
		var c charge
		_ = json.Unmarshal(body, &c)
		key := r.Header.Get("Idempotency-Key")
		s.lastReq.Store(&key)
		s.mu.Lock()
		if s.keys[c.Intent] == nil {
			s.keys[c.Intent] = map[string]bool{}
		}
		s.keys[c.Intent][key] = true
		s.reqs[c.Intent]++
		drop := s.dropFirst.Load() && !s.dropped[c.Intent]
		s.dropped[c.Intent] = true
		s.mu.Unlock()
		if s.down.Load() {
			http.Error(w, "down for maintenance", http.StatusServiceUnavailable)
			return
		}
		if v := s.busyFor.Load(); v != nil {
			w.Header().Set("Retry-After", *v)
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		if drop {
			// Let the service run and record, then cut the connection
			// before the response leaves: the response is lost.
			inner.ServeHTTP(discard{h: http.Header{}}, r)
			panic(http.ErrAbortHandler)
		}
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		s.srv.Close()
		if err := s.db.Close(); err != nil {
			t.Error(err)
		}
	})
	return s
}

// create is the service's handler: it charges once per call it gets.
func (s *httpService) create(w http.ResponseWriter, r *http.Request) {
	s.runs.Add(1)
	var c charge
	if err := json.NewDecoder(r.Body).Decode(&c); err != nil || c.Amount <= 0 {
		http.Error(w, "amount must be positive", http.StatusBadRequest)
		return
	}
	if ch := s.slow; ch != nil {
		<-ch
	}
	s.mu.Lock()
	s.effects[c.Intent]++
	n := s.effects[c.Intent]
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"charge":"ch_%s_%d"}`, c.Intent, n)
}

func (s *httpService) effectsOf(intent string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.effects[intent]
}

func (s *httpService) requestsOf(intent string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reqs[intent]
}

func (s *httpService) keysOf(intent string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.keys[intent])
}

// discard is a ResponseWriter that loses what it is given.
type discard struct{ h http.Header }

func (d discard) Header() http.Header         { return d.h }
func (d discard) Write(b []byte) (int, error) { return len(b), nil }
func (d discard) WriteHeader(int)             {}

// host is a journal (real clock, in memory) and, once started, a
// Dispatcher with an HTTPTransport to svc.
type host struct {
	t  *testing.T
	j  *intents.Journal
	d  *intents.Dispatcher
	tr *intents.HTTPTransport

	uncertain chan *intents.Action
}

func newHost(t *testing.T, svc *httpService) *host {
	t.Helper()
	j, err := intents.Open("host", &intents.Options{Pebble: &pebble.Options{FS: vfs.NewMem()}, PollInterval: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	h := &host{t: t, j: j, tr: &intents.HTTPTransport{BaseURL: svc.srv.URL}, uncertain: make(chan *intents.Action, 16)}
	t.Cleanup(func() {
		if h.d != nil {
			_ = h.d.Close()
		}
		_ = j.Close()
	})
	return h
}

func (h *host) start(o intents.DispatcherOptions) {
	h.t.Helper()
	o.Transports = map[string]intents.Transport{"billing": h.tr}
	if o.MinBackoff == 0 {
		o.MinBackoff, o.MaxBackoff = 5*time.Millisecond, 50*time.Millisecond
	}
	o.OnUncertain = func(_ context.Context, a *intents.Action) { h.uncertain <- a }
	d, err := intents.NewDispatcher(h.j, o)
	if err != nil {
		h.t.Fatal(err)
	}
	h.d = d
}

func (h *host) approve(intent string, amount int, op string) *intents.Action {
	h.t.Helper()
	a, err := h.j.Approve(context.Background(), intents.Approval{Target: "billing", Operation: op,
		Arguments: charge{Intent: intent, Amount: amount}, ApprovedBy: "alice", Deadline: time.Now().Add(20 * time.Second)})
	if err != nil {
		h.t.Fatal(err)
	}
	return a
}

func (h *host) wait(key string) *intents.Action {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, err := h.j.Wait(ctx, key)
	if err != nil {
		h.t.Fatal(err)
	}
	return a
}

func TestHTTPDeliversOnce(t *testing.T) {
	svc := newHTTPService(t)
	h := newHost(t, svc)
	h.start(intents.DispatcherOptions{})
	a := h.approve("i1", 100, "POST /v1/charges")
	b := h.approve("i1-again", 100, "POST /v1/charges") // same amount, a second intended charge
	for _, x := range []*intents.Action{a, b} {
		got := h.wait(x.Key)
		if got.State != intents.Succeeded || got.Answer.Status != http.StatusCreated || got.Answer.Replayed {
			t.Fatalf("%s: %+v", x.Key, got.Answer)
		}
	}
	if svc.effectsOf("i1") != 1 || svc.effectsOf("i1-again") != 1 {
		t.Fatalf("effects %v, want one per approval", svc.effects)
	}
	if got := string(h.wait(a.Key).Answer.Body); got != `{"charge":"ch_i1_1"}` {
		t.Fatalf("answer body %s", got)
	}
}

// TestHTTPLostResponse: the service performs the charge and records it,
// and the response is lost on the way back. The retry carries the same key
// and gets the stored response.
func TestHTTPLostResponse(t *testing.T) {
	svc := newHTTPService(t)
	svc.dropFirst.Store(true)
	h := newHost(t, svc)
	h.start(intents.DispatcherOptions{})
	a := h.approve("i2", 250, "POST /v1/charges")
	got := h.wait(a.Key)
	if got.State != intents.Succeeded || !got.Answer.Replayed || string(got.Answer.Body) != `{"charge":"ch_i2_1"}` {
		t.Fatalf("after a lost response: %+v (%s)", got.Answer, got.Answer.Body)
	}
	if got.Attempts < 2 {
		t.Fatalf("%d attempts recorded, want 2", got.Attempts)
	}
	if n, k := svc.effectsOf("i2"), svc.keysOf("i2"); n != 1 || k != 1 {
		t.Fatalf("%d effects under %d keys, want 1 and 1", n, k)
	}
}

// TestHTTPInProgress: the first attempt times out while the service still
// works on it; the retry, with the same key, gets 409 and Retry-After until
// the first one is recorded, then its response.
func TestHTTPInProgress(t *testing.T) {
	svc := newHTTPService(t)
	release := make(chan struct{})
	svc.slow = release
	h := newHost(t, svc)
	h.start(intents.DispatcherOptions{AttemptTimeout: 100 * time.Millisecond})
	a := h.approve("i3", 10, "POST /v1/charges")
	// Wait for a few attempts to find the key in progress.
	deadline := time.Now().Add(10 * time.Second)
	for {
		cur, err := h.j.Get(context.Background(), a.Key)
		if err != nil {
			t.Fatal(err)
		}
		if cur.Attempts >= 2 && strings.Contains(cur.LastError, "409") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no 409 seen: %+v", cur)
		}
		time.Sleep(10 * time.Millisecond)
	}
	close(release)
	got := h.wait(a.Key)
	if got.State != intents.Succeeded || svc.effectsOf("i3") != 1 || svc.keysOf("i3") != 1 {
		t.Fatalf("%+v; effects %d keys %d", got, svc.effectsOf("i3"), svc.keysOf("i3"))
	}
}

func TestHTTPDefinitiveAnswers(t *testing.T) {
	svc := newHTTPService(t)
	h := newHost(t, svc)
	ctx := context.Background()

	failed := h.approve("bad", 0, "POST /v1/charges") // the service refuses: 400, stored

	// A key whose receipt is past the service's retention: 410.
	expired := h.approve("e1", 7, "POST /v1/charges")
	send(t, svc, expired.Key, `{"intent":"e1","amount":7}`)
	svc.clock.Advance(2 * time.Hour)

	// A key the service has for another request: 422.
	conflict := h.approve("c1", 5, "POST /v1/charges")
	send(t, svc, conflict.Key, `{"intent":"c1","amount":6}`)

	h.start(intents.DispatcherOptions{})
	for _, c := range []struct {
		a      *intents.Action
		state  intents.State
		status int
	}{{failed, intents.Failed, 400}, {conflict, intents.Conflict, 422}, {expired, intents.Expired, 410}} {
		got := h.wait(c.a.Key)
		if got.State != c.state || got.Answer.Status != c.status {
			t.Errorf("%s: %v %+v, want %v %d", c.a.Key, got.State, got.Answer, c.state, c.status)
		}
	}
	if got := h.wait(conflict.Key).Answer.Code; got != receipthttp.ProblemKeyReused {
		t.Errorf("conflict code %q", got)
	}
	if svc.effectsOf("bad") != 0 || svc.effectsOf("c1") != 1 || svc.effectsOf("e1") != 1 {
		t.Errorf("effects %v", svc.effects)
	}
	if err := h.j.Forget(ctx, failed.Key); err != nil {
		t.Fatal(err)
	}
}

// send sends body under key to the service's charges, as an earlier
// process of the host might have.
func send(t *testing.T, svc *httpService, key, body string) {
	t.Helper()
	req, _ := http.NewRequest("POST", svc.srv.URL+"/v1/charges", strings.NewReader(body))
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("send: %s", resp.Status)
	}
}

// TestHTTPAnswerFetchedAgain: the service answered an earlier attempt (of
// a process that died before recording the answer); the Dispatcher
// delivers the action with its key and records the replayed answer.
func TestHTTPAnswerFetchedAgain(t *testing.T) {
	svc := newHTTPService(t)
	h := newHost(t, svc)
	a := h.approve("f1", 40, "POST /v1/charges")
	send(t, svc, a.Key, string(a.Arguments))
	h.start(intents.DispatcherOptions{})
	got := h.wait(a.Key)
	if got.State != intents.Succeeded || string(got.Answer.Body) != `{"charge":"ch_f1_1"}` || svc.effectsOf("f1") != 1 {
		t.Fatalf("%+v (%s), %d effects", got.Answer, got.Answer.Body, svc.effectsOf("f1"))
	}
}

// TestHTTPUncertainThenRedeliver: the service is down past the deadline:
// the action turns Uncertain (the hook hears of it) with its key, and
// Redeliver sends it again under that key once the service is back.
func TestHTTPUncertainThenRedeliver(t *testing.T) {
	svc := newHTTPService(t)
	svc.down.Store(true)
	h := newHost(t, svc)
	h.start(intents.DispatcherOptions{})
	a, err := h.j.Approve(context.Background(), intents.Approval{Target: "billing", Operation: "POST /v1/charges",
		Arguments: charge{Intent: "u1", Amount: 3}, ApprovedBy: "alice", Deadline: time.Now().Add(300 * time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	got := h.wait(a.Key)
	// At least one delivery: a loaded machine may fit no second one in the 300 ms.
	if got.State != intents.Uncertain || got.Attempts < 1 || !strings.Contains(got.LastError, "503") {
		t.Fatalf("%+v", got)
	}
	select {
	case u := <-h.uncertain:
		if u.Key != a.Key {
			t.Fatalf("hook got %s", u.Key)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("OnUncertain not called")
	}
	if l := list(t, h.j, intents.Uncertain); len(l) != 1 || l[0].Key != a.Key {
		t.Fatalf("List(Uncertain) = %v", l)
	}
	svc.down.Store(false)
	if _, err := h.j.Redeliver(context.Background(), a.Key, time.Now().Add(20*time.Second)); err != nil {
		t.Fatal(err)
	}
	got = h.wait(a.Key)
	if got.State != intents.Succeeded || svc.effectsOf("u1") != 1 || svc.keysOf("u1") != 1 {
		t.Fatalf("after Redeliver: %+v, %d effects, %d keys", got, svc.effectsOf("u1"), svc.keysOf("u1"))
	}
}

// TestHTTPResumeAfterClose: a Dispatcher closed mid-delivery leaves the
// action Approved with its key; the next one delivers it under that key.
func TestHTTPResumeAfterClose(t *testing.T) {
	svc := newHTTPService(t)
	svc.down.Store(true)
	h := newHost(t, svc)
	h.start(intents.DispatcherOptions{})
	a := h.approve("r1", 8, "POST /v1/charges")
	for svc.lastReq.Load() == nil {
		time.Sleep(5 * time.Millisecond)
	}
	if err := h.d.Close(); err != nil {
		t.Fatal(err)
	}
	cur, err := h.j.Get(context.Background(), a.Key)
	if err != nil || cur.State != intents.Approved {
		t.Fatalf("after Close: %+v %v", cur, err)
	}
	svc.down.Store(false)
	h.start(intents.DispatcherOptions{})
	if got := h.wait(a.Key); got.State != intents.Succeeded || svc.keysOf("r1") != 1 || *svc.lastReq.Load() != a.Key {
		t.Fatalf("%+v, %d keys", got, svc.keysOf("r1"))
	}
}

func TestNewDispatcherBadOptions(t *testing.T) {
	j := openMem(t, vfs.NewMem(), receiptstest.NewClock(t0))
	defer j.Close()
	tr := map[string]intents.Transport{"x": &intents.HTTPTransport{BaseURL: "http://127.0.0.1:1"}}
	for _, o := range []intents.DispatcherOptions{
		{},
		{Transports: map[string]intents.Transport{"x": nil}},
		{Transports: tr, Concurrency: -1},
		{Transports: tr, MinBackoff: time.Second, MaxBackoff: time.Millisecond},
		{Transports: tr, LeaseMargin: -time.Second},
	} {
		if _, err := intents.NewDispatcher(j, o); !errors.Is(err, intents.ErrInvalid) {
			t.Errorf("%+v: %v, want ErrInvalid", o, err)
		}
	}
}

// TestNoTransport: an action whose target has no Transport is not sent,
// stays approved until its deadline, then turns uncertain (an earlier
// process might have sent it), saying why.
func TestNoTransport(t *testing.T) {
	svc := newHTTPService(t)
	h := newHost(t, svc)
	h.start(intents.DispatcherOptions{})
	a, err := h.j.Approve(context.Background(), intents.Approval{Target: "nowhere", Operation: "POST /v1/charges",
		Arguments: charge{Intent: "n1", Amount: 1}, ApprovedBy: "alice", Deadline: time.Now().Add(200 * time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	got := h.wait(a.Key)
	if got.State != intents.Uncertain || !strings.Contains(got.LastError, intents.ErrNoTransport.Error()) || svc.keysOf("n1") != 0 {
		t.Fatalf("%+v; %d keys at the service", got, svc.keysOf("n1"))
	}
}

// TestHTTPRetryAfterTooLargeIsALongWait: a 503 whose Retry-After is more
// delay-seconds than 32 (or 64) bits hold is a long wait, capped at 24
// hours as the others are, over a real HTTP round trip. It was ignored
// (ParseUint(v, 10, 32) failed), so the action was retried at once.
func TestHTTPRetryAfterTooLargeIsALongWait(t *testing.T) {
	for _, v := range []string{"4294967296", "18446744073709551616", "99999999999999999999999999999999"} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Retry-After", v)
			http.Error(w, "busy", http.StatusServiceUnavailable)
		}))
		tr := &intents.HTTPTransport{BaseURL: srv.URL}
		_, err := tr.Deliver(context.Background(), &intents.Action{Key: "0190f1d2-0000-7000-8000-000000000001",
			Target: "svc", Operation: "POST /v1/charges", Arguments: json.RawMessage(`{}`)})
		srv.Close()
		var re *intents.RetryError
		if !errors.As(err, &re) || re.After != 24*time.Hour {
			t.Errorf("Retry-After: %s: %v (%#v), want a RetryError of 24h", v, err, re)
		}
	}
}
