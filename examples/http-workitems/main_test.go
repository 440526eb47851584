package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/receiptstore/receipts"
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
