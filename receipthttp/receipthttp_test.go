package receipthttp_test

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
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/receiptstore/receipts/receipthttp"
	"github.com/receiptstore/receipts/receiptstest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const leaseTTL = 30 * time.Second

// env is one store, one middleware and a handler that counts its runs.
type env struct {
	t   testing.TB
	dir string
	clk *receiptstest.Clock
	db  *receipts.DB
	cfg receipthttp.Config
	h   http.Handler
	app http.Handler // the handler behind the middleware
}

// callerScope authenticates by the X-Caller header (tests only).
func callerScope(r *http.Request) (string, error) {
	if s := r.Header.Get("X-Caller"); s != "" {
		return s, nil
	}
	return "", errors.New("no X-Caller")
}

func newEnv(t testing.TB, cfg receipthttp.Config, app http.Handler) *env {
	t.Helper()
	if cfg.Scope == nil {
		cfg.Scope = callerScope
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	e := &env{t: t, dir: t.TempDir(), clk: receiptstest.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)), cfg: cfg, app: app}
	e.open()
	t.Cleanup(func() {
		if e.db != nil {
			if err := e.db.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		}
	})
	return e
}

func (e *env) open() {
	e.t.Helper()
	db, err := receipts.Open(e.dir, &receipts.Options{Now: e.clk.Now, LeaseTTL: leaseTTL, GCInterval: -1})
	if err != nil {
		e.t.Fatalf("Open: %v", err)
	}
	mw, err := receipthttp.New(db, e.cfg)
	if err != nil {
		e.t.Fatalf("New: %v", err)
	}
	e.db, e.h = db, mw(e.app)
}

// restart closes the store and opens it again, as a process restart would.
func (e *env) restart() {
	e.t.Helper()
	if err := e.db.Close(); err != nil {
		e.t.Fatalf("Close: %v", err)
	}
	e.db = nil
	e.open()
}

// req builds a request; key "" sends no Idempotency-Key.
func req(method, path, caller, key, body string) *http.Request {
	r := httptest.NewRequest(method, path, strings.NewReader(body))
	if caller != "" {
		r.Header.Set("X-Caller", caller)
	}
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	return r
}

func (e *env) do(r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	e.h.ServeHTTP(w, r)
	return w
}

func (e *env) post(caller, key, body string) *httptest.ResponseRecorder {
	return e.do(req(http.MethodPost, "/items", caller, key, body))
}

// counter is an app handler that creates "items" and counts its runs.
type counter struct {
	runs     atomic.Int32
	attempts chan receipthttp.Attempt // if non-nil, gets each run's attempt
	gate     chan struct{}            // if non-nil, each run waits for it
	started  chan struct{}            // if non-nil, each run signals it
	status   int                      // default 201
}

func (c *counter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := c.runs.Add(1)
	a, ok := receipthttp.AttemptFrom(r.Context())
	if c.attempts != nil {
		if !ok {
			panic("no attempt in context")
		}
		c.attempts <- receipthttp.Attempt{Key: a.Key, Number: a.Number, Recovered: a.Recovered, Token: a.Token, ProviderKey: a.ProviderKey}
	}
	if c.started != nil {
		c.started <- struct{}{}
	}
	if c.gate != nil {
		<-c.gate
	}
	body, _ := io.ReadAll(r.Body)
	status := c.status
	if status == 0 {
		status = http.StatusCreated
	}
	w.Header().Set("Location", fmt.Sprintf("/items/%d", n))
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Not-Stored", "1")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"run":%d,"body":%q}`, n, body)
}

// waitStarted waits until the handler runs, failing (not hanging) if the
// request is answered without it.
func waitStarted(t testing.TB, started <-chan struct{}, done <-chan *httptest.ResponseRecorder) {
	t.Helper()
	select {
	case <-started:
	case w := <-done:
		t.Fatalf("answered before the handler ran: %d %s", w.Code, w.Body)
	}
}

func wantStatus(t testing.TB, w *httptest.ResponseRecorder, want int) {
	t.Helper()
	if w.Code != want {
		t.Fatalf("status = %d, want %d; body %s", w.Code, want, w.Body)
	}
}

// wantProblem checks an RFC 9457 response and returns it.
func wantProblem(t testing.TB, w *httptest.ResponseRecorder, status int, typ string) receipthttp.Problem {
	t.Helper()
	wantStatus(t, w, status)
	if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type = %q, want application/problem+json", ct)
	}
	var p receipthttp.Problem
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatalf("problem body %q: %v", w.Body, err)
	}
	if p.Status != status || p.Type != typ || p.Title == "" {
		t.Fatalf("problem = %+v, want status %d type %s", p, status, typ)
	}
	return p
}

func TestFirstRequestThenReplay(t *testing.T) {
	app := &counter{}
	e := newEnv(t, receipthttp.Config{}, app)

	first := e.post("alice", "k1", `{"title":"a"}`)
	wantStatus(t, first, http.StatusCreated)
	if first.Header().Get(receipthttp.ReplayedHeader) != "" {
		t.Fatalf("first response marked replayed")
	}
	if first.Header().Get("X-Not-Stored") != "1" {
		t.Fatalf("first response lost a header the handler set")
	}
	for i := 0; i < 3; i++ {
		again := e.post("alice", "k1", `{"title":"a"}`)
		wantStatus(t, again, http.StatusCreated)
		if got := again.Header().Get(receipthttp.ReplayedHeader); got != "true" {
			t.Fatalf("%s = %q, want true", receipthttp.ReplayedHeader, got)
		}
		if again.Body.String() != first.Body.String() {
			t.Fatalf("replayed body %q, want %q", again.Body, first.Body)
		}
		for _, h := range []string{"Location", "Content-Type"} {
			if again.Header().Get(h) != first.Header().Get(h) {
				t.Fatalf("replayed %s = %q, want %q", h, again.Header().Get(h), first.Header().Get(h))
			}
		}
		if again.Header().Get("X-Not-Stored") != "" {
			t.Fatalf("a header outside StoredHeaders was replayed")
		}
	}
	if n := app.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
	rec, err := e.db.Lookup(context.Background(), receipts.Key{Scope: "alice", ID: "k1"})
	if err != nil || rec.State != receipts.Succeeded {
		t.Fatalf("Lookup = %+v, %v; want Succeeded", rec, err)
	}
}

func TestKeyReusedWithDifferentPayload(t *testing.T) {
	app := &counter{}
	e := newEnv(t, receipthttp.Config{}, app)
	wantStatus(t, e.post("alice", "k1", `{"title":"a"}`), http.StatusCreated)

	wantProblem(t, e.post("alice", "k1", `{"title":"b"}`), http.StatusUnprocessableEntity, receipthttp.ProblemKeyReused)
	other := e.do(req(http.MethodPost, "/other", "alice", "k1", `{"title":"a"}`))
	wantProblem(t, other, http.StatusUnprocessableEntity, receipthttp.ProblemKeyReused)
	patch := e.do(req(http.MethodPatch, "/items", "alice", "k1", `{"title":"a"}`))
	wantProblem(t, patch, http.StatusUnprocessableEntity, receipthttp.ProblemKeyReused)
	if n := app.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

func TestConcurrentDuplicateGets409(t *testing.T) {
	app := &counter{gate: make(chan struct{}), started: make(chan struct{}, 1)}
	e := newEnv(t, receipthttp.Config{}, app)

	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- e.post("alice", "k1", "x") }()
	waitStarted(t, app.started, done)
	defer func() {
		select {
		case <-app.gate:
		default:
			close(app.gate) // never leave the handler blocked, even on failure
			<-done
		}
	}()

	e.clk.Advance(10 * time.Second) // 20s of the 30s lease left
	dup := e.post("alice", "k1", "x")
	wantProblem(t, dup, http.StatusConflict, receipthttp.ProblemInProgress)
	if got := dup.Header().Get("Retry-After"); got != "20" {
		t.Fatalf("Retry-After = %q, want 20", got)
	}
	// A different payload is still 422, even while the first runs.
	wantProblem(t, e.post("alice", "k1", "y"), http.StatusUnprocessableEntity, receipthttp.ProblemKeyReused)

	close(app.gate)
	wantStatus(t, <-done, http.StatusCreated)
	wantStatus(t, e.post("alice", "k1", "x"), http.StatusCreated)
	if n := app.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

// Config.LeaseFor gives each request's claim its own lease: a duplicate
// that comes after the store's 30s LeaseTTL finds the first request still
// in progress (Retry-After from the 10-minute lease), not abandoned.
func TestLeaseForHoldsTheClaim(t *testing.T) {
	app := &counter{gate: make(chan struct{}), started: make(chan struct{}, 1)}
	e := newEnv(t, receipthttp.Config{LeaseFor: 10 * time.Minute}, app)
	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- e.post("alice", "k1", "x") }()
	waitStarted(t, app.started, done)
	defer func() {
		select {
		case <-app.gate:
		default:
			close(app.gate)
			<-done
		}
	}()
	r, err := e.db.Lookup(context.Background(), receipts.Key{Scope: "alice", ID: "k1"})
	if err != nil {
		t.Fatal(err)
	}
	if want := e.clk.Now().Add(10 * time.Minute); !r.LeaseExpiresAt.Equal(want) {
		t.Fatalf("LeaseExpiresAt %s, want %s", r.LeaseExpiresAt, want)
	}
	e.clk.Advance(time.Minute) // past the store's LeaseTTL
	dup := e.post("alice", "k1", "x")
	wantProblem(t, dup, http.StatusConflict, receipthttp.ProblemInProgress)
	if got := dup.Header().Get("Retry-After"); got != "540" {
		t.Fatalf("Retry-After = %q, want 540 (9 of the 10 minutes left)", got)
	}
	close(app.gate)
	wantStatus(t, <-done, http.StatusCreated)
	if n := app.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

func Test64ConcurrentDuplicates(t *testing.T) {
	const n = 64
	for _, wait := range []time.Duration{0, 10 * time.Second} {
		t.Run(fmt.Sprintf("wait=%v", wait), func(t *testing.T) {
			app := &counter{gate: make(chan struct{})}
			e := newEnv(t, receipthttp.Config{Wait: wait}, app)

			var wg sync.WaitGroup
			var conflicts, answered atomic.Int32
			codes := make([]*httptest.ResponseRecorder, n)
			for i := range n {
				wg.Go(func() {
					codes[i] = e.post("alice", "same-key", "payload")
					if codes[i].Code == http.StatusConflict {
						conflicts.Add(1)
					}
					if wait == 0 && answered.Add(1) == n-1 {
						close(app.gate) // every duplicate answered: let the first finish
					}
				})
			}
			if wait > 0 {
				close(app.gate) // duplicates wait for the first response
			}
			wg.Wait()

			if got := app.runs.Load(); got != 1 {
				t.Fatalf("handler ran %d times, want 1", got)
			}
			var created, replayed int
			var body string
			for _, w := range codes {
				switch w.Code {
				case http.StatusCreated:
					created++
					if body == "" {
						body = w.Body.String()
					} else if w.Body.String() != body {
						t.Fatalf("bodies differ: %q vs %q", w.Body, body)
					}
					if w.Header().Get(receipthttp.ReplayedHeader) == "true" {
						replayed++
					}
				case http.StatusConflict:
				default:
					t.Fatalf("unexpected status %d: %s", w.Code, w.Body)
				}
			}
			if wait == 0 && (created != 1 || conflicts.Load() != n-1) {
				t.Fatalf("created %d, conflicts %d; want 1 and %d", created, conflicts.Load(), n-1)
			}
			if wait > 0 && (created != n || replayed != n-1) {
				t.Fatalf("created %d (replayed %d); want %d (%d)", created, replayed, n, n-1)
			}
		})
	}
}

func TestWaitGivesUpWith409(t *testing.T) {
	app := &counter{gate: make(chan struct{}), started: make(chan struct{}, 1)}
	e := newEnv(t, receipthttp.Config{Wait: 20 * time.Millisecond}, app)
	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- e.post("alice", "k1", "x") }()
	waitStarted(t, app.started, done)
	defer func() {
		select {
		case <-app.gate:
		default:
			close(app.gate) // never leave the handler blocked, even on failure
			<-done
		}
	}()
	dup := e.post("alice", "k1", "x")
	wantProblem(t, dup, http.StatusConflict, receipthttp.ProblemInProgress)
	if dup.Header().Get("Retry-After") == "" {
		t.Fatalf("409 without Retry-After")
	}
	close(app.gate)
	wantStatus(t, <-done, http.StatusCreated)
}

func TestMissingKey(t *testing.T) {
	app := &counter{}
	required := newEnv(t, receipthttp.Config{Required: true}, app)
	wantProblem(t, required.post("alice", "", "x"), http.StatusBadRequest, receipthttp.ProblemKeyMissing)
	if n := app.runs.Load(); n != 0 {
		t.Fatalf("handler ran %d times, want 0", n)
	}

	optional := newEnv(t, receipthttp.Config{}, app)
	wantStatus(t, optional.post("alice", "", "x"), http.StatusCreated)
	wantStatus(t, optional.post("alice", "", "x"), http.StatusCreated)
	if n := app.runs.Load(); n != 2 {
		t.Fatalf("handler ran %d times, want 2 (no key, no receipt)", n)
	}
}

func TestUnguardedMethodPassesThrough(t *testing.T) {
	app := &counter{status: http.StatusOK}
	e := newEnv(t, receipthttp.Config{Required: true}, app)
	for range 2 {
		w := e.do(req(http.MethodGet, "/items", "", "k1", ""))
		wantStatus(t, w, http.StatusOK)
	}
	if n := app.runs.Load(); n != 2 {
		t.Fatalf("handler ran %d times, want 2", n)
	}
}

func TestBadKeys(t *testing.T) {
	app := &counter{}
	e := newEnv(t, receipthttp.Config{}, app)
	for name, key := range map[string]string{
		"256 bytes":     strings.Repeat("k", 256),
		"control char":  "a\x01b",
		"non-ASCII":     "clé",
		"empty quoted":  `""`,
		"bad escape":    `"a\b"`,
		"inner quote":   `"a"b"`,
		"quoted 256":    `"` + strings.Repeat("k", 256) + `"`,
		"leading space": `" a"`,
	} {
		t.Run(name, func(t *testing.T) {
			r := req(http.MethodPost, "/items", "alice", "", "x")
			r.Header["Idempotency-Key"] = []string{key}
			wantProblem(t, e.do(r), http.StatusBadRequest, receipthttp.ProblemKeyInvalid)
		})
	}
	t.Run("twice", func(t *testing.T) {
		r := req(http.MethodPost, "/items", "alice", "", "x")
		r.Header["Idempotency-Key"] = []string{"a", "b"}
		wantProblem(t, e.do(r), http.StatusBadRequest, receipthttp.ProblemKeyInvalid)
	})
	if n := app.runs.Load(); n != 0 {
		t.Fatalf("handler ran %d times, want 0", n)
	}

	// 255 bytes is fine, and a Structured Field string names the same key
	// as its bare form.
	wantStatus(t, e.post("alice", strings.Repeat("k", 255), "x"), http.StatusCreated)
	wantStatus(t, e.post("alice", `"sf\"key"`, "x"), http.StatusCreated)
	again := e.post("alice", `sf"key`, "x")
	wantStatus(t, again, http.StatusCreated)
	if again.Header().Get(receipthttp.ReplayedHeader) != "true" {
		t.Fatalf("bare form of a quoted key was not replayed")
	}
}

func TestBodyOverLimit(t *testing.T) {
	app := &counter{}
	e := newEnv(t, receipthttp.Config{MaxBodyBytes: 16}, app)
	wantStatus(t, e.post("alice", "k1", strings.Repeat("b", 16)), http.StatusCreated)
	wantProblem(t, e.post("alice", "k2", strings.Repeat("b", 17)), http.StatusRequestEntityTooLarge, receipthttp.ProblemBodyTooLarge)

	// Unknown length (chunked): caught while reading.
	r := req(http.MethodPost, "/items", "alice", "k3", "")
	r.Body = io.NopCloser(strings.NewReader(strings.Repeat("b", 100)))
	r.ContentLength = -1
	wantProblem(t, e.do(r), http.StatusRequestEntityTooLarge, receipthttp.ProblemBodyTooLarge)
	if n := app.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
	// Nothing was claimed for the refused requests.
	for _, id := range []string{"k2", "k3"} {
		if _, err := e.db.Lookup(context.Background(), receipts.Key{Scope: "alice", ID: id}); !errors.Is(err, receipts.ErrNotFound) {
			t.Fatalf("Lookup(%s) = %v, want ErrNotFound", id, err)
		}
	}
}

func TestScopeIsolation(t *testing.T) {
	app := &counter{}
	e := newEnv(t, receipthttp.Config{}, app)
	a := e.post("alice", "shared-key", "alice's body")
	b := e.post("bob", "shared-key", "bob's body")
	wantStatus(t, a, http.StatusCreated)
	wantStatus(t, b, http.StatusCreated)
	if b.Header().Get(receipthttp.ReplayedHeader) != "" {
		t.Fatalf("bob got alice's receipt")
	}
	if n := app.runs.Load(); n != 2 {
		t.Fatalf("handler ran %d times, want 2", n)
	}
	ra, rb := e.post("alice", "shared-key", "alice's body"), e.post("bob", "shared-key", "bob's body")
	if ra.Body.String() != a.Body.String() || rb.Body.String() != b.Body.String() {
		t.Fatalf("replays crossed scopes: %q / %q", ra.Body, rb.Body)
	}
	wantProblem(t, e.post("", "shared-key", "x"), http.StatusUnauthorized, receipthttp.ProblemUnauthorized)
}

func TestScopeProblem(t *testing.T) {
	forbidden := &receipthttp.Problem{Type: "tag:example.com,2026:forbidden", Title: "Forbidden", Status: http.StatusForbidden}
	e := newEnv(t, receipthttp.Config{Scope: func(*http.Request) (string, error) { return "", forbidden }}, &counter{})
	wantProblem(t, e.post("alice", "k1", "x"), http.StatusForbidden, forbidden.Type)
}

func TestRestartBetweenRequestAndRetry(t *testing.T) {
	app := &counter{}
	e := newEnv(t, receipthttp.Config{}, app)
	first := e.post("alice", "k1", "x")
	wantStatus(t, first, http.StatusCreated)
	e.restart()
	again := e.post("alice", "k1", "x")
	wantStatus(t, again, http.StatusCreated)
	if again.Header().Get(receipthttp.ReplayedHeader) != "true" || again.Body.String() != first.Body.String() {
		t.Fatalf("after restart: %q %q, want replay of %q", again.Header(), again.Body, first.Body)
	}
	wantProblem(t, e.post("alice", "k1", "y"), http.StatusUnprocessableEntity, receipthttp.ProblemKeyReused)
	if n := app.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

// retryUntilRun retries a request whose claim was abandoned: while the
// abandoned lease is live the retry gets 409; past it, the handler runs.
func (e *env) retryUntilRun(caller, key, body string) *httptest.ResponseRecorder {
	e.t.Helper()
	w := e.post(caller, key, body)
	if w.Code == http.StatusConflict {
		e.clk.Advance(leaseTTL)
		w = e.post(caller, key, body)
	}
	return w
}

func TestServerErrorLeavesOutcomeUnknown(t *testing.T) {
	for _, restart := range []bool{false, true} {
		t.Run(fmt.Sprintf("restart=%v", restart), func(t *testing.T) {
			app := &counter{status: http.StatusInternalServerError, attempts: make(chan receipthttp.Attempt, 2)}
			e := newEnv(t, receipthttp.Config{}, app)
			wantStatus(t, e.post("alice", "k1", "x"), http.StatusInternalServerError)
			a1 := <-app.attempts
			if a1.Number != 1 || a1.Recovered || !strings.HasPrefix(a1.ProviderKey, "rk_") || a1.Token == 0 {
				t.Fatalf("first attempt = %+v", a1)
			}
			if r, err := e.db.Lookup(context.Background(), a1.Key); err != nil || r.Token != a1.Token {
				t.Fatalf("first attempt's token %d, the claim's: %+v, %v", a1.Token, r, err)
			}
			if restart {
				e.restart()
			}
			app.status = http.StatusCreated
			wantStatus(t, e.retryUntilRun("alice", "k1", "x"), http.StatusCreated)
			a2 := <-app.attempts
			if a2.Number != 2 || !a2.Recovered || a2.ProviderKey != a1.ProviderKey {
				t.Fatalf("retry attempt = %+v, want number 2, recovered, provider key %s", a2, a1.ProviderKey)
			}
			if a2.Token <= a1.Token {
				t.Fatalf("retry's token %d, want more than the first attempt's %d", a2.Token, a1.Token)
			}
			if r, err := e.db.Lookup(context.Background(), a1.Key); err != nil || r.Token != a2.Token {
				t.Fatalf("receipt %+v, %v: want the retry's token %d", r, err, a2.Token)
			}
			again := e.post("alice", "k1", "x")
			if again.Header().Get(receipthttp.ReplayedHeader) != "true" {
				t.Fatalf("not replayed after the recovered attempt committed")
			}
		})
	}
}

func TestPanicLeavesOutcomeUnknown(t *testing.T) {
	attempts := make(chan receipthttp.Attempt, 2)
	var panicNext atomic.Bool
	panicNext.Store(true)
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a, _ := receipthttp.AttemptFrom(r.Context())
		attempts <- receipthttp.Attempt{Number: a.Number, Recovered: a.Recovered}
		if panicNext.Swap(false) {
			panic("boom")
		}
		w.WriteHeader(http.StatusNoContent)
	})
	e := newEnv(t, receipthttp.Config{}, app)
	func() {
		defer func() {
			if v := recover(); v != "boom" {
				t.Fatalf("recover() = %v, want the handler's panic", v)
			}
		}()
		e.post("alice", "k1", "x")
	}()
	wantStatus(t, e.retryUntilRun("alice", "k1", "x"), http.StatusNoContent)
	<-attempts
	if a := <-attempts; a.Number != 2 || !a.Recovered {
		t.Fatalf("after a panic: %+v, want a recovered second attempt", a)
	}
}

func TestConflictAndTooManyRequestsRelease(t *testing.T) {
	for _, status := range []int{http.StatusConflict, http.StatusTooManyRequests} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			app := &counter{status: status, attempts: make(chan receipthttp.Attempt, 2)}
			e := newEnv(t, receipthttp.Config{}, app)
			w := e.post("alice", "k1", "x")
			wantStatus(t, w, status)
			if w.Header().Get("Content-Type") == "application/problem+json" {
				t.Fatalf("the handler's own %d was replaced", status)
			}
			app.status = http.StatusCreated
			wantStatus(t, e.post("alice", "k1", "x"), http.StatusCreated) // no clock advance needed
			<-app.attempts
			if a := <-app.attempts; a.Number != 1 || a.Recovered {
				t.Fatalf("after %d: %+v, want a fresh first attempt", status, a)
			}
		})
	}
}

func TestClientErrorIsStoredAsFailed(t *testing.T) {
	app := &counter{status: http.StatusBadRequest}
	e := newEnv(t, receipthttp.Config{}, app)
	first := e.post("alice", "k1", "x")
	wantStatus(t, first, http.StatusBadRequest)
	again := e.post("alice", "k1", "x")
	wantStatus(t, again, http.StatusBadRequest)
	if again.Header().Get(receipthttp.ReplayedHeader) != "true" || again.Body.String() != first.Body.String() {
		t.Fatalf("4xx not replayed: %v %q", again.Header(), again.Body)
	}
	rec, err := e.db.Lookup(context.Background(), receipts.Key{Scope: "alice", ID: "k1"})
	if err != nil || rec.State != receipts.Failed {
		t.Fatalf("Lookup = %+v, %v; want Failed", rec, err)
	}
	if n := app.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

func TestCustomPolicy(t *testing.T) {
	app := &counter{status: http.StatusServiceUnavailable}
	e := newEnv(t, receipthttp.Config{Policy: func(status int) receipthttp.Outcome {
		if status == http.StatusServiceUnavailable {
			return receipthttp.Release // this service answers 503 before it acts
		}
		return receipthttp.DefaultPolicy(status)
	}}, app)
	wantStatus(t, e.post("alice", "k1", "x"), http.StatusServiceUnavailable)
	app.status = http.StatusCreated
	wantStatus(t, e.post("alice", "k1", "x"), http.StatusCreated)
}

func TestEffectCommitsWithReceipt(t *testing.T) {
	var fail atomic.Bool
	var db *receipts.DB
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a, _ := receipthttp.AttemptFrom(r.Context())
		a.Stage(pebblestore.Effect(func(b *pebble.Batch) error {
			return b.Set([]byte("app/"+a.Key.ID), []byte("done"), nil)
		}))
		if fail.Load() {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	e := newEnv(t, receipthttp.Config{}, app)
	db = e.db
	get := func(k string) bool {
		v, closer, err := pebblestore.DB(db).Get([]byte(k))
		if errors.Is(err, pebble.ErrNotFound) {
			return false
		}
		if err != nil {
			t.Fatal(err)
		}
		defer closer.Close()
		return string(v) == "done"
	}
	wantStatus(t, e.post("alice", "ok", "x"), http.StatusCreated)
	if !get("app/ok") {
		t.Fatalf("staged effect not committed with the receipt")
	}
	fail.Store(true)
	wantStatus(t, e.post("alice", "bad", "x"), http.StatusBadGateway)
	if get("app/bad") {
		t.Fatalf("staged effect committed although the response was not stored")
	}
}

func TestStreamingPassesThroughWithoutReceipt(t *testing.T) {
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: 1\n\n")
		if err := http.NewResponseController(w).Flush(); err != nil {
			t.Errorf("Flush: %v", err)
		}
		io.WriteString(w, "data: 2\n\n")
	})
	e := newEnv(t, receipthttp.Config{}, app)
	w := e.post("alice", "k1", "x")
	wantStatus(t, w, http.StatusOK)
	if w.Body.String() != "data: 1\n\ndata: 2\n\n" || !w.Flushed {
		t.Fatalf("streamed body %q (flushed %v)", w.Body, w.Flushed)
	}
	rec, err := e.db.Lookup(context.Background(), receipts.Key{Scope: "alice", ID: "k1"})
	if err != nil || rec.State != receipts.Pending {
		t.Fatalf("Lookup = %+v, %v; want a Pending (abandoned) claim, no receipt", rec, err)
	}
}

func TestResponseOverLimitPassesThrough(t *testing.T) {
	app := &counter{}
	e := newEnv(t, receipthttp.Config{MaxResponseBytes: 8}, app)
	w := e.post("alice", "k1", "a body longer than eight bytes")
	wantStatus(t, w, http.StatusCreated)
	if !strings.Contains(w.Body.String(), "a body longer") {
		t.Fatalf("body = %q", w.Body)
	}
	rec, err := e.db.Lookup(context.Background(), receipts.Key{Scope: "alice", ID: "k1"})
	if err != nil || rec.State != receipts.Pending {
		t.Fatalf("Lookup = %+v, %v; want a Pending claim", rec, err)
	}
}

// TestClientDisconnect: the client leaves while the handler runs; the
// handler keeps its context and the receipt is committed.
func TestClientDisconnect(t *testing.T) {
	gate := make(chan struct{})
	started := make(chan struct{})
	handlerErr := make(chan error, 1)
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-gate
		handlerErr <- r.Context().Err()
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "made it")
	})
	e := newEnv(t, receipthttp.Config{}, app)
	served := make(chan struct{}, 2)
	var reqCtx context.Context
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() { served <- struct{}{} }()
		reqCtx = r.Context()
		e.h.ServeHTTP(w, r)
	}))
	defer srv.Close()

	ctx, cancel := context.WithCancel(context.Background())
	r := req(http.MethodPost, srv.URL+"/items", "alice", "k1", "x")
	r.RequestURI = ""
	r = r.WithContext(ctx)
	clientErr := make(chan error, 1)
	go func() {
		resp, err := srv.Client().Do(r)
		if err == nil {
			resp.Body.Close()
		}
		clientErr <- err
	}()
	select {
	case <-started:
	case err := <-clientErr:
		t.Fatalf("answered before the handler ran: %v", err)
	}
	defer func() {
		select {
		case <-gate:
		default:
			close(gate) // never leave the handler blocked, even on failure
		}
	}()
	cancel()
	if err := <-clientErr; err == nil {
		t.Fatalf("client request succeeded; want it cancelled")
	}
	<-reqCtx.Done() // the server noticed the disconnect
	close(gate)
	if err := <-handlerErr; err != nil {
		t.Fatalf("handler context: %v, want it alive after the client left", err)
	}
	<-served
	rec, err := e.db.Lookup(context.Background(), receipts.Key{Scope: "alice", ID: "k1"})
	if err != nil || rec.State != receipts.Succeeded {
		t.Fatalf("Lookup = %+v, %v; want Succeeded", rec, err)
	}

	// The retry over the wire gets the stored response.
	r2 := req(http.MethodPost, srv.URL+"/items", "alice", "k1", "x")
	r2.RequestURI = ""
	resp, err := srv.Client().Do(r2)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	<-served
	if resp.StatusCode != http.StatusCreated || string(body) != "made it" || resp.Header.Get(receipthttp.ReplayedHeader) != "true" {
		t.Fatalf("retry: %d %q %v", resp.StatusCode, body, resp.Header)
	}
}

func TestClosedStore(t *testing.T) {
	e := newEnv(t, receipthttp.Config{}, &counter{})
	if err := e.db.Close(); err != nil {
		t.Fatal(err)
	}
	wantProblem(t, e.post("alice", "k1", "x"), http.StatusServiceUnavailable, receipthttp.ProblemUnavailable)
	e.db = nil
}

func TestNewRejectsBadConfig(t *testing.T) {
	db, err := receipts.Open(t.TempDir(), &receipts.Options{GCInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for name, cfg := range map[string]receipthttp.Config{
		"no scope":          {},
		"bad header":        {Scope: callerScope, Header: "Idempotency Key"},
		"negative body":     {Scope: callerScope, MaxBodyBytes: -1},
		"negative wait":     {Scope: callerScope, Wait: -time.Second},
		"bad stored header": {Scope: callerScope, StoredHeaders: []string{"a:b"}},
		"empty method":      {Scope: callerScope, Methods: []string{""}},
		"negative lease":    {Scope: callerScope, LeaseFor: -time.Second},
		"lease ≥ retention": {Scope: callerScope, LeaseFor: receipts.DefaultRetention},
	} {
		if _, err := receipthttp.New(db, cfg); err == nil {
			t.Errorf("%s: New succeeded, want an error", name)
		}
	}
	if _, err := receipthttp.New(nil, receipthttp.Config{Scope: callerScope}); err == nil {
		t.Errorf("New(nil db) succeeded")
	}
}

func TestAttemptFromOutsideMiddleware(t *testing.T) {
	if _, ok := receipthttp.AttemptFrom(context.Background()); ok {
		t.Fatal("AttemptFrom found an attempt in a bare context")
	}
}

// TestTakeoverFencesTheStalledAttempt: a handler stalls past its lease, a
// retry takes over and commits; the stalled one cannot record its response
// and tells its client to retry, which then gets the winner's receipt.
func TestTakeoverFencesTheStalledAttempt(t *testing.T) {
	app := &counter{gate: make(chan struct{}), started: make(chan struct{}, 2), attempts: make(chan receipthttp.Attempt, 2)}
	e := newEnv(t, receipthttp.Config{}, app)
	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- e.post("alice", "k1", "x") }()
	waitStarted(t, app.started, done)
	<-app.attempts

	e.clk.Advance(leaseTTL) // the first lease runs out (no renewal in fake time)
	second := make(chan *httptest.ResponseRecorder)
	go func() { second <- e.post("alice", "k1", "x") }()
	waitStarted(t, app.started, second)
	if a := <-app.attempts; a.Number != 2 || !a.Recovered {
		t.Fatalf("takeover attempt = %+v", a)
	}
	close(app.gate)
	won, lost := <-second, <-done
	wantStatus(t, won, http.StatusCreated)
	wantProblem(t, lost, http.StatusServiceUnavailable, receipthttp.ProblemNotRecorded)
	if lost.Header().Get("Retry-After") == "" {
		t.Fatalf("503 without Retry-After")
	}
	if strings.Contains(lost.Body.String(), `"run"`) {
		t.Fatalf("the fenced attempt's response leaked: %s", lost.Body)
	}
	again := e.post("alice", "k1", "x")
	if again.Body.String() != won.Body.String() || again.Header().Get(receipthttp.ReplayedHeader) != "true" {
		t.Fatalf("retry got %q, want the winner's %q", again.Body, won.Body)
	}
}

func TestBeforeReplayProblem(t *testing.T) {
	var revoked atomic.Bool
	app := &counter{}
	e := &env{t: t, dir: t.TempDir(), clk: receiptstest.NewClock(time.Unix(1e9, 0)), app: app,
		cfg: receipthttp.Config{Scope: callerScope}}
	db, err := receipts.Open(e.dir, &receipts.Options{Now: e.clk.Now, GCInterval: -1,
		BeforeReplay: func(ctx context.Context, r *receipts.Receipt) error {
			if revoked.Load() {
				return &receipthttp.Problem{Type: "tag:example.com,2026:revoked", Title: "Access revoked", Status: http.StatusForbidden}
			}
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	mw, err := receipthttp.New(db, e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.db, e.h = db, mw(app)
	wantStatus(t, e.post("alice", "k1", "x"), http.StatusCreated)
	wantStatus(t, e.post("alice", "k1", "x"), http.StatusCreated)
	revoked.Store(true)
	wantProblem(t, e.post("alice", "k1", "x"), http.StatusForbidden, "tag:example.com,2026:revoked")
	e.db = nil
}

// TestWaiterTakesOverAReleasedKey: with Config.Wait, a duplicate waiting on
// a request that answers 429 (released) runs the handler itself.
func TestWaiterTakesOverAReleasedKey(t *testing.T) {
	app := &counter{status: http.StatusTooManyRequests, gate: make(chan struct{}), started: make(chan struct{}, 2)}
	e := newEnv(t, receipthttp.Config{Wait: 10 * time.Second}, app)
	first := make(chan *httptest.ResponseRecorder)
	go func() { first <- e.post("alice", "k1", "x") }()
	waitStarted(t, app.started, first)
	second := make(chan *httptest.ResponseRecorder)
	go func() { second <- e.post("alice", "k1", "x") }()
	app.gate <- struct{}{} // the first answers 429 and releases the key
	wantStatus(t, <-first, http.StatusTooManyRequests)
	waitStarted(t, app.started, second)
	app.status = http.StatusCreated
	close(app.gate)
	wantStatus(t, <-second, http.StatusCreated)
	if n := app.runs.Load(); n != 2 {
		t.Fatalf("handler ran %d times, want 2", n)
	}
}
