// Package receiptadmin is the read-only JSON admin API of a receipts store,
// for operators and for `receiptctl --addr`: Handler serves it, and its JSON
// types (Receipt, List, Stats) are what receiptctl prints with --json.
//
// It lives outside package receipts because the engine knows no transport:
// the handler is built on the DB's read-only inspection methods (Inspect,
// Scan, Stats, Count, Now), so it works on every engine (Pebble, pgstore)
// unchanged, and the root package documents only the contract.
package receiptadmin

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"path"
	"strconv"

	"github.com/receiptstore/receipts"
)

// Handler returns a read-only HTTP handler that shows db's receipts as
// JSON, for operators and for `receiptctl --addr`. It answers GET and HEAD,
// and dispatches on the last element of the request path, so it works
// mounted under any prefix, with or without http.StripPrefix:
//
//	.../get?scope=S&id=I    one record in any state: Receipt (404 if none), with
//	                        the key's step journal (Receipt.Steps)
//	.../list?scope=S&state=pending|succeeded|failed&abandoned=true&limit=N
//	                        the records a Filter with those fields selects,
//	                        streamed: List
//	.../stats               Stats (with Count's record counts)
//
// Errors are {"error": "..."} with status 400 (bad input), 404 (no such
// record or endpoint), 405 (method), 500 (a corrupt record, I/O) or 503
// (the store is closed).
//
// The handler shows every scope's keys and results, and it does not call
// Options.BeforeReplay (it is an operator's view: DB.Inspect, DB.Scan). So, without an
// Authorize option, it answers requests from loopback only (127.0.0.0/8, ::1) and refuses
// every other one with 403 and an error that says why: a handler mounted on a public
// listener by mistake shows nothing. Give Authorize (BearerToken, or the service's own
// check) to serve it elsewhere (auth.go).
//
//	mux.Handle("/admin/receipts/", receiptadmin.Handler(db))
//	// receiptctl --addr http://127.0.0.1:8081/admin/receipts ls --abandoned
func Handler(db *receipts.DB, opts ...Option) http.Handler {
	h := &handler{db: db}
	for _, o := range opts {
		o(h)
	}
	return h
}

type handler struct {
	db        *receipts.DB
	authorize func(*http.Request) error // Authorize's; nil: loopback only
}

// maxListErrors bounds the errors one list answer carries.
const maxListErrors = 100

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if status, err := h.allowed(r); err != nil {
		if status == http.StatusUnauthorized {
			w.Header().Set("WWW-Authenticate", `Bearer realm="receiptadmin"`)
		}
		adminError(w, status, err)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		adminError(w, http.StatusMethodNotAllowed, errors.New("receiptadmin: the admin handler is read-only (GET)"))
		return
	}
	switch path.Base(r.URL.Path) {
	case "get":
		h.get(w, r)
	case "list":
		h.list(w, r)
	case "stats":
		h.stats(w, r)
	default:
		adminError(w, http.StatusNotFound, fmt.Errorf("receiptadmin: no admin endpoint %q (want get, list or stats)", r.URL.Path))
	}
}

func (h *handler) get(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	k := receipts.Key{Scope: q.Get("scope"), ID: q.Get("id")}
	rec, err := h.db.Inspect(r.Context(), k)
	if err != nil {
		adminError(w, adminStatus(err), err)
		return
	}
	now, err := h.db.Now(r.Context())
	if err != nil {
		adminError(w, adminStatus(err), err)
		return
	}
	a := NewReceipt(rec, now)
	steps, err := h.db.Steps(r.Context(), k)
	if err != nil && !errors.Is(err, receipts.ErrNotFound) { // gone since: shown without steps
		adminError(w, adminStatus(err), err)
		return
	}
	a.Steps = NewSteps(steps, a.Abandoned)
	writeJSON(w, a)
}

// parseFilter reads a Filter from the query parameters of the list
// endpoint: scope, state, abandoned and limit.
func parseFilter(q url.Values) (receipts.Filter, error) {
	var f receipts.Filter
	var err error
	f.Scope = q.Get("scope")
	if f.State, err = receipts.ParseState(q.Get("state")); err != nil {
		return f, err
	}
	if s := q.Get("abandoned"); s != "" {
		if f.Abandoned, err = strconv.ParseBool(s); err != nil {
			return f, fmt.Errorf("%w: abandoned=%q is not a boolean", receipts.ErrInvalidArgument, s)
		}
	}
	if s := q.Get("limit"); s != "" {
		if f.Limit, err = strconv.Atoi(s); err != nil {
			return f, fmt.Errorf("%w: limit=%q is not a number", receipts.ErrInvalidArgument, s)
		}
	}
	return f, f.Validate()
}

func (h *handler) list(w http.ResponseWriter, r *http.Request) {
	f, err := parseFilter(r.URL.Query())
	if err != nil {
		adminError(w, adminStatus(err), err)
		return
	}
	now, err := h.db.Now(r.Context()) // ErrClosed: fail before the answer starts
	if err != nil {
		adminError(w, adminStatus(err), err)
		return
	}

	w.Header().Set("Content-Type", "application/json")
	if r.Method == http.MethodHead {
		return
	}
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	fmt.Fprintf(bw, `{"now":%s,"receipts":[`, mustJSON(now))
	var errs []string
	dropped := 0
	n := 0
	for rec, err := range h.db.Scan(r.Context(), f) {
		if err != nil {
			if len(errs) < maxListErrors {
				errs = append(errs, err.Error())
			} else {
				dropped++
			}
			continue
		}
		if n > 0 {
			bw.WriteByte(',')
		}
		n++
		if err := enc.Encode(NewReceipt(rec, now)); err != nil {
			return // the client went away
		}
	}
	if dropped > 0 {
		errs = append(errs, fmt.Sprintf("receiptadmin: %d more errors", dropped))
	}
	if errs == nil {
		errs = []string{}
	}
	fmt.Fprintf(bw, `],"errors":%s}`+"\n", mustJSON(errs))
	_ = bw.Flush()
}

func (h *handler) stats(w http.ResponseWriter, r *http.Request) {
	now, err := h.db.Now(r.Context())
	if err != nil {
		adminError(w, adminStatus(err), err)
		return
	}
	c, err := h.db.Count(r.Context())
	if err != nil {
		adminError(w, adminStatus(err), err)
		return
	}
	writeJSON(w, NewStats(h.db.Stats(), c, now))
}

// adminStatus maps an engine error to an HTTP status.
func adminStatus(err error) int {
	switch {
	case errors.Is(err, receipts.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, receipts.ErrInvalidArgument):
		return http.StatusBadRequest
	case errors.Is(err, receipts.ErrClosed):
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

func adminError(w http.ResponseWriter, status int, err error) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(struct {
		Error string `json:"error"`
	}{err.Error()})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// mustJSON marshals values that cannot fail to marshal (times, strings).
func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}
