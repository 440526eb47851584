package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/encoding"
	"github.com/receiptstore/receipts/observe"
	"github.com/receiptstore/receipts/receipthttp"
)

// WorkItem is the resource this service creates.
type WorkItem struct {
	ID        string    `json:"id"`
	Title     string    `json:"title"`
	Assignee  string    `json:"assignee,omitempty"`
	CreatedBy string    `json:"created_by"`
	CreatedAt time.Time `json:"created_at"`
}

// createRequest is the body of POST /v1/work-items.
type createRequest struct {
	Title    string `json:"title"`
	Assignee string `json:"assignee,omitempty"`
}

// service holds the work items in the receipts store's own database
// (items), so that each commits with its receipt.
type service struct {
	db     *receipts.DB
	items  items
	tokens map[string]string // bearer token -> caller
	delay  time.Duration     // artificial work time, to try concurrent duplicates
	now    func() time.Time
}

// handler returns the service's routes. POST is wrapped by the idempotency
// middleware; GETs are plain reads.
func (s *service) handler() (http.Handler, error) {
	idempotent, err := receipthttp.New(s.db, receipthttp.Config{
		Scope:       s.caller,
		Required:    true,
		Fingerprint: jsonFingerprint,
		Wait:        0, // duplicates in flight get 409 + Retry-After
	})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/work-items", withClass("create_work_item", idempotent(http.HandlerFunc(s.create))))
	mux.HandleFunc("GET /v1/work-items", s.list)
	mux.HandleFunc("GET /v1/work-items/{id}", s.get)
	return mux, nil
}

// caller authenticates a request by its bearer token: it is the scope that
// owns the request's idempotency keys.
func (s *service) caller(r *http.Request) (string, error) {
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if who, known := s.tokens[token]; ok && known {
		return who, nil
	}
	return "", errors.New("unknown or missing bearer token")
}

// jsonFingerprint makes the intent the JSON value, not its bytes: the same
// object with other spacing or key order is the same request.
func jsonFingerprint(r *http.Request, body []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("the body is not JSON: %w", err)
	}
	return encoding.Fingerprint([]any{r.Method, r.URL.Path, v})
}

// create runs once per idempotency key. Its write is staged with
// Attempt.Stage, so the item and the receipt of this response are
// committed together (one synced Pebble batch, or one PostgreSQL
// transaction): a crash keeps both or neither.
func (s *service) create(w http.ResponseWriter, r *http.Request) {
	who, _ := s.caller(r) // the middleware has already authenticated r
	attempt, _ := receipthttp.AttemptFrom(r.Context())

	var req createRequest
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		problem(w, http.StatusBadRequest, "Invalid body", err.Error())
		return
	}
	if req.Title == "" || len(req.Title) > 200 || !utf8.ValidString(req.Title) {
		problem(w, http.StatusBadRequest, "Invalid title", "title must be 1-200 bytes of UTF-8")
		return
	}
	if s.delay > 0 {
		select {
		case <-time.After(s.delay):
		case <-r.Context().Done(): // only if the lease is lost; a client leaving does not cancel it
			problem(w, http.StatusServiceUnavailable, "Interrupted", r.Context().Err().Error())
			return
		}
	}

	// The ID comes from the operation's ProviderKey: every attempt of one
	// operation names the same item, so a recovered attempt can look for
	// an item an earlier attempt made. (With Stage the item commits
	// only with its receipt, so it finds none here; an effect outside this
	// store, such as a payment, would be reconciled this way.)
	id := "wi_" + attempt.ProviderKey[3:19]
	if attempt.Recovered {
		if item, err := s.items.get(r.Context(), who, id); err == nil {
			writeJSON(w, http.StatusCreated, "/v1/work-items/"+id, item)
			return
		}
	}
	item := WorkItem{ID: id, Title: req.Title, Assignee: req.Assignee, CreatedBy: who, CreatedAt: s.now().UTC().Truncate(time.Microsecond)}
	put, err := s.items.put(who, item)
	if err != nil {
		problem(w, http.StatusInternalServerError, "Encoding failed", err.Error())
		return
	}
	attempt.Stage(put)
	writeJSON(w, http.StatusCreated, "/v1/work-items/"+id, item)
}

func (s *service) list(w http.ResponseWriter, r *http.Request) {
	who, err := s.caller(r)
	if err != nil {
		problem(w, http.StatusUnauthorized, "Unauthorized", err.Error())
		return
	}
	items, err := s.items.list(r.Context(), who)
	if err != nil {
		problem(w, http.StatusInternalServerError, "Read failed", err.Error())
		return
	}
	writeJSON(w, http.StatusOK, "", map[string]any{"items": items})
}

func (s *service) get(w http.ResponseWriter, r *http.Request) {
	who, err := s.caller(r)
	if err != nil {
		problem(w, http.StatusUnauthorized, "Unauthorized", err.Error())
		return
	}
	item, err := s.items.get(r.Context(), who, r.PathValue("id"))
	switch {
	case errors.Is(err, errNoItem):
		problem(w, http.StatusNotFound, "No such work item", "")
	case err != nil:
		problem(w, http.StatusInternalServerError, "Read failed", err.Error())
	default:
		writeJSON(w, http.StatusOK, "", item)
	}
}

func writeJSON(w http.ResponseWriter, status int, location string, v any) {
	w.Header().Set("Content-Type", "application/json")
	if location != "" {
		w.Header().Set("Location", location)
	}
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func problem(w http.ResponseWriter, status int, title, detail string) {
	receipthttp.WriteProblem(w, nil, &receipthttp.Problem{Type: "about:blank", Title: title, Status: status, Detail: detail})
}

// withClass names the operation class of h's requests (receipts_* metrics
// carry it as the class label).
func withClass(class string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(observe.WithOperationClass(r.Context(), class)))
	})
}
