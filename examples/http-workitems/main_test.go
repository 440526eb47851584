package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/receiptsprom"
)

func TestService(t *testing.T) {
	db, err := receipts.Open(t.TempDir(), &receipts.Options{GCInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s := &service{db: db, tokens: map[string]string{"a": "alice", "b": "bob"},
		now: func() time.Time { return time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC) }}
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
	check(call("GET", first.Header().Get("Location"), "a", "", ""), http.StatusOK, "")
	check(call("GET", first.Header().Get("Location"), "b", "", ""), http.StatusNotFound, "")
}

// The admin listener serves /metrics: the store's receipts_* figures,
// labelled with the operation class, and never a key.
func TestMetrics(t *testing.T) {
	metrics := receiptsprom.New(nil)
	db, err := receipts.Open(t.TempDir(), &receipts.Options{GCInterval: -1, Observer: metrics})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s := &service{db: db, tokens: map[string]string{"a": "alice"}, now: time.Now}
	h, err := s.handler()
	if err != nil {
		t.Fatal(err)
	}
	admin := adminMux(db, metrics)
	for range 2 {
		r := httptest.NewRequest("POST", "/v1/work-items", strings.NewReader(`{"title":"t"}`))
		r.Header.Set("Authorization", "Bearer a")
		r.Header.Set("Idempotency-Key", "op-secret-77")
		h.ServeHTTP(httptest.NewRecorder(), r)
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
