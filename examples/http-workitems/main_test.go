package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/examples/internal/exampledb"
	"github.com/receiptstore/receipts/internal/pgtest"
	"github.com/receiptstore/receipts/receiptsprom"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var quiet = slog.New(slog.DiscardHandler)

// newTestService opens the service on an engine: "pebble" (a directory) or
// "postgresql" (a fresh schema of the test server), as -pg would.
func newTestService(t *testing.T, engine string, opts receipts.Options) *service {
	t.Helper()
	cfg := exampledb.Config{Dir: t.TempDir(), Options: opts}
	if engine == "postgresql" {
		cfg.PG, cfg.Schema = pgtest.Schema(t)
	}
	store, err := exampledb.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := store.Close(); err != nil {
			t.Error(err)
		}
	})
	items, err := storeItems(context.Background(), store)
	if err != nil {
		t.Fatal(err)
	}
	s := &service{db: store.DB, items: items, tokens: map[string]string{"a": "alice", "b": "bob"},
		now: func() time.Time { return time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC) }}
	return s
}

var engines = []string{"pebble", "postgresql"}

func TestService(t *testing.T) {
	for _, engine := range engines {
		t.Run(engine, func(t *testing.T) { testService(t, engine) })
	}
}

func testService(t *testing.T, engine string) {
	s := newTestService(t, engine, receipts.Options{GCInterval: -1})
	h, err := s.handler()
	if err != nil {
		t.Fatal(err)
	}
	call := func(method, path, token, key, body string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, path, strings.NewReader(body))
		if token != "" {
			r.Header.Set("Authorization", "Bearer "+token)
		}
		if key != "" {
			r.Header.Set("Idempotency-Key", key)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	check := func(w *httptest.ResponseRecorder, status int, replayed string) {
		t.Helper()
		if w.Code != status || w.Header().Get("Idempotent-Replayed") != replayed {
			t.Fatalf("got %d (replayed %q) %s; want %d (replayed %q)", w.Code, w.Header().Get("Idempotent-Replayed"), w.Body, status, replayed)
		}
	}

	first := call("POST", "/v1/work-items", "a", "op-1", `{"title":"Write the report","assignee":"bob"}`)
	check(first, http.StatusCreated, "")
	// Same intent, other spacing and key order: replayed.
	again := call("POST", "/v1/work-items", "a", "op-1", `{ "assignee":"bob", "title":"Write the report" }`)
	check(again, http.StatusCreated, "true")
	if again.Body.String() != first.Body.String() || again.Header().Get("Location") != first.Header().Get("Location") {
		t.Fatalf("replay differs:\n%s\n%s", again.Body, first.Body)
	}
	check(call("POST", "/v1/work-items", "a", "op-1", `{"title":"Something else"}`), http.StatusUnprocessableEntity, "")
	check(call("POST", "/v1/work-items", "a", "", `{"title":"x"}`), http.StatusBadRequest, "")
	check(call("POST", "/v1/work-items", "", "op-1", `{"title":"x"}`), http.StatusUnauthorized, "")
	check(call("POST", "/v1/work-items", "a", "op-2", `not json`), http.StatusBadRequest, "")
	check(call("POST", "/v1/work-items", "a", "op-3", `{"title":""}`), http.StatusBadRequest, "")
	check(call("POST", "/v1/work-items", "a", "op-3", `{"title":""}`), http.StatusBadRequest, "true")
	check(call("POST", "/v1/work-items", "b", "op-1", `{"title":"Bob's own"}`), http.StatusCreated, "")

	var list struct{ Items []WorkItem }
	w := call("GET", "/v1/work-items", "a", "", "")
	check(w, http.StatusOK, "")
	if err := json.Unmarshal(w.Body.Bytes(), &list); err != nil || len(list.Items) != 1 || list.Items[0].Title != "Write the report" {
		t.Fatalf("alice's items = %+v, %v", list.Items, err)
	}
	var item WorkItem
	if err := json.Unmarshal(first.Body.Bytes(), &item); err != nil || list.Items[0] != item {
		t.Fatalf("the listed item %+v is not the one created %+v (%v)", list.Items[0], item, err)
	}
	check(call("GET", first.Header().Get("Location"), "a", "", ""), http.StatusOK, "")
	check(call("GET", first.Header().Get("Location"), "b", "", ""), http.StatusNotFound, "")
}

// The admin listener serves /metrics: the store's receipts_* figures,
// labelled with the operation class, and never a key.
func TestMetrics(t *testing.T) {
	metrics := receiptsprom.New(nil)
	s := newTestService(t, "pebble", receipts.Options{GCInterval: -1, Observer: metrics})
	h, err := s.handler()
	if err != nil {
		t.Fatal(err)
	}
	admin := adminMux(s.db, metrics)
	for range 2 {
		r := httptest.NewRequest("POST", "/v1/work-items", strings.NewReader(`{"title":"t"}`))
		r.Header.Set("Authorization", "Bearer a")
		r.Header.Set("Idempotency-Key", "op-secret-77")
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	// The console is mounted beside it, for loopback only.
	for remote, want := range map[string]int{"127.0.0.1:5000": http.StatusOK, "192.0.2.1:5000": http.StatusForbidden} {
		r := httptest.NewRequest("GET", "/admin/console/", nil)
		r.RemoteAddr = remote
		w := httptest.NewRecorder()
		admin.ServeHTTP(w, r)
		if w.Code != want {
			t.Errorf("GET /admin/console/ from %s: %d, want %d", remote, w.Code, want)
		}
	}
	w := httptest.NewRecorder()
	admin.ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	body := w.Body.String()
	for _, want := range []string{
		`receipts_claims_total{class="create_work_item",engine="pebble",outcome="claimed"} 1`,
		`receipts_claims_total{class="create_work_item",engine="pebble",outcome="replayed"} 1`,
		`receipts_finishes_total{class="create_work_item",engine="pebble",result="succeeded"} 1`,
		`receipts_waiters{engine="pebble"} 0`,
		`receipts_pebble_wal_bytes{engine="pebble"}`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if strings.Contains(body, "op-secret-77") || strings.Contains(body, "alice") {
		t.Errorf("/metrics shows a key:\n%s", body)
	}
}

// -pg alone starts a throwaway cluster, serves from it, and removes it at
// stop; -pg DSN after the flag is its value, and the flags after it are
// parsed.
func TestThrowawayCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	if _, err := pgtest.FindBinDir(); err != nil {
		t.Skip(err)
	}
	in, err := start(context.Background(), config{addr: "127.0.0.1:0", pg: exampledb.Auto, schema: "workitems", leaseTTL: 30 * time.Second, log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	dsn := in.store.DSN
	if !strings.HasPrefix(dsn, "postgres://") {
		t.Fatalf("the throwaway cluster's DSN: %q", dsn)
	}
	c := &client{t: t, http: &http.Client{Timeout: 30 * time.Second}}
	url := "http://" + in.addrs[0]
	for i, want := range []string{"", "true"} {
		r := c.post(url, "op-1", `{"title":"t"}`)
		if r.StatusCode != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != want {
			t.Fatalf("request %d: %d replayed %q", i, r.StatusCode, r.Header.Get("Idempotent-Replayed"))
		}
	}
	if err := in.stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := exampledb.Open(context.Background(), exampledb.Config{PG: dsn, Schema: "workitems"}); err == nil {
		t.Fatal("the throwaway cluster still answers after stop")
	}

	got := exampledb.Args([]string{"-pg", "postgres://x@y/z", "-addr", ":1", "-pg", "-admin", ""})
	want := []string{"-pg=postgres://x@y/z", "-addr", ":1", "-pg", "-admin", ""}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("Args = %q, want %q", got, want)
	}
}
