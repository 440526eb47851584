package receipts

import (
	"bufio"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"time"
	"unicode/utf8"
)

// AdminHandler returns a read-only HTTP handler that shows db's receipts as
// JSON, for operators and for `receiptctl --addr`. It answers GET and HEAD,
// and dispatches on the last element of the request path, so it works
// mounted under any prefix, with or without http.StripPrefix:
//
//	.../get?scope=S&id=I    one record in any state: AdminReceipt (404 if none)
//	.../list?scope=S&state=pending|succeeded|failed&abandoned=true&limit=N
//	                        the records a Filter with those fields selects,
//	                        streamed: AdminList
//	.../stats               AdminStats
//
// Errors are {"error": "..."} with status 400 (bad input), 404 (no such
// record or endpoint), 405 (method), 500 (a corrupt record, I/O) or 503
// (the store is closed).
//
// The handler shows every scope's keys and results, and it does not call
// Options.BeforeReplay (it is an operator's view, like Scan): mount it on an
// admin-only listener or behind the service's authentication.
//
//	mux.Handle("/admin/receipts/", receipts.AdminHandler(db))
//	// receiptctl --addr http://127.0.0.1:8081/admin/receipts ls --abandoned
func AdminHandler(db *DB) http.Handler { return &adminHandler{db: db} }

type adminHandler struct{ db *DB }

// AdminReceipt is the JSON form of a Receipt, as AdminHandler serves it and
// `receiptctl` prints it (`get --json`, `ls --json`, `export`).
type AdminReceipt struct {
	Scope string `json:"scope"`
	ID    string `json:"id"`
	// ScopeBase64 and IDBase64 hold the exact bytes of Scope and ID when
	// they are not valid UTF-8, which a JSON string cannot carry (Scope and
	// ID then hold a lossy rendering). Key returns the exact key.
	ScopeBase64 []byte `json:"scope_base64,omitempty"`
	IDBase64    []byte `json:"id_base64,omitempty"`
	// State is "pending", "succeeded" or "failed" (ParseState reads it).
	State string `json:"state"`
	// Abandoned marks a pending claim whose lease had run out when the
	// record was read: its outcome is unknown and must be reconciled.
	Abandoned bool `json:"abandoned,omitempty"`
	// Fingerprint is the intent's digest, in hex.
	Fingerprint string `json:"fingerprint"`
	// Result is the stored result, base64 in JSON; null while pending.
	Result         []byte    `json:"result"`
	Attempts       uint32    `json:"attempts"`
	Token          uint64    `json:"token"`
	CreatedAt      time.Time `json:"created_at"`
	UpdatedAt      time.Time `json:"updated_at"`
	ExpiresAt      time.Time `json:"expires_at"`
	LeaseExpiresAt time.Time `json:"lease_expires_at,omitzero"`
}

// NewAdminReceipt returns the JSON form of r, read at now (which decides
// Abandoned). Times are in UTC.
func NewAdminReceipt(r *Receipt, now time.Time) AdminReceipt {
	a := AdminReceipt{
		Scope:          r.Key.Scope,
		ID:             r.Key.ID,
		State:          r.State.String(),
		Abandoned:      r.Abandoned(now),
		Fingerprint:    hex.EncodeToString(r.Fingerprint),
		Result:         r.Result,
		Attempts:       r.Attempts,
		Token:          r.Token,
		CreatedAt:      utc(r.CreatedAt),
		UpdatedAt:      utc(r.UpdatedAt),
		ExpiresAt:      utc(r.ExpiresAt),
		LeaseExpiresAt: utc(r.LeaseExpiresAt),
	}
	if !utf8.ValidString(r.Key.Scope) {
		a.ScopeBase64 = []byte(r.Key.Scope)
	}
	if !utf8.ValidString(r.Key.ID) {
		a.IDBase64 = []byte(r.Key.ID)
	}
	return a
}

// Key returns the record's exact key (from the base64 forms when present).
func (a *AdminReceipt) Key() Key {
	k := Key{Scope: a.Scope, ID: a.ID}
	if a.ScopeBase64 != nil {
		k.Scope = string(a.ScopeBase64)
	}
	if a.IDBase64 != nil {
		k.ID = string(a.IDBase64)
	}
	return k
}

func utc(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	return t.UTC()
}

// AdminList is the JSON answer of AdminHandler's list endpoint. It is
// written as it is read from the store, in this field order, so a client can
// stream it. Errors lists records that could not be read (corrupt ones) and
// an error that ended the scan early, if any.
type AdminList struct {
	Now      time.Time      `json:"now"`
	Receipts []AdminReceipt `json:"receipts"`
	Errors   []string       `json:"errors"`
}

// AdminStats is the JSON form of Stats. Durations are Go duration strings
// ("24h0m0s", read them with time.ParseDuration).
type AdminStats struct {
	Now        time.Time `json:"now"`
	Retention  string    `json:"retention"`
	LeaseTTL   string    `json:"lease_ttl"`
	EpochWidth string    `json:"epoch_width"`
	LiveEpochs int       `json:"live_epochs"`
	Pending    int64     `json:"pending"`
	Abandoned  int64     `json:"abandoned"`
	Succeeded  int64     `json:"succeeded"`
	Failed     int64     `json:"failed"`
	Expired    int64     `json:"expired"`
	Corrupt    int64     `json:"corrupt"`
	DiskBytes  uint64    `json:"disk_bytes"`
	// ReplayCacheEntries and ReplayCacheBytes: what the replay cache holds.
	ReplayCacheEntries int   `json:"replay_cache_entries"`
	ReplayCacheBytes   int64 `json:"replay_cache_bytes"`
	// LastGC is nil if no garbage collection ran since the store was opened.
	LastGC *AdminGCStats `json:"last_gc,omitempty"`
	// Counters count calls since the store was opened.
	Counters AdminCounters `json:"counters"`
}

// AdminCounters is the JSON form of Stats' counters.
type AdminCounters struct {
	Claims     uint64 `json:"claims"`
	Replays    uint64 `json:"replays"`
	Takeovers  uint64 `json:"takeovers"`
	Commits    uint64 `json:"commits"`
	Fails      uint64 `json:"fails"`
	Releases   uint64 `json:"releases"`
	Abandons   uint64 `json:"abandons"`
	Conflicts  uint64 `json:"conflicts"`
	Mismatches uint64 `json:"mismatches"`
	// ReplayCacheHits counts calls answered from the replay cache.
	ReplayCacheHits uint64 `json:"replay_cache_hits"`
}

// AdminGCStats is the JSON form of GCStats.
type AdminGCStats struct {
	At            time.Time `json:"at"`
	EpochsDropped int       `json:"epochs_dropped"`
	BytesFreed    uint64    `json:"bytes_freed"`
	Writes        int       `json:"writes"`
	Compacted     bool      `json:"compacted"`
	Duration      string    `json:"duration"`
}

// NewAdminStats returns the JSON form of s and c, taken at now.
func NewAdminStats(s Stats, c Counts, now time.Time) AdminStats {
	a := AdminStats{
		Now:        utc(now),
		Retention:  s.Retention.String(),
		LeaseTTL:   s.LeaseTTL.String(),
		EpochWidth: s.EpochWidth.String(),
		LiveEpochs: c.LiveEpochs,
		Pending:    c.Pending,
		Abandoned:  c.Abandoned,
		Succeeded:  c.Succeeded,
		Failed:     c.Failed,
		Expired:    c.Expired,
		Corrupt:    c.Corrupt,
		DiskBytes:  s.DiskBytes,

		ReplayCacheEntries: s.ReplayCacheEntries,
		ReplayCacheBytes:   s.ReplayCacheBytes,
		Counters: AdminCounters{
			Claims: s.Claims, Replays: s.Replays, Takeovers: s.Takeovers,
			Commits: s.Commits, Fails: s.Fails, Releases: s.Releases,
			Abandons: s.Abandons, Conflicts: s.Conflicts, Mismatches: s.Mismatches,
			ReplayCacheHits: s.ReplayCacheHits,
		},
	}
	if !s.LastGC.At.IsZero() {
		g := NewAdminGCStats(s.LastGC)
		a.LastGC = &g
	}
	return a
}

// NewAdminGCStats returns the JSON form of g.
func NewAdminGCStats(g GCStats) AdminGCStats {
	return AdminGCStats{
		At:            utc(g.At),
		EpochsDropped: g.EpochsDropped,
		BytesFreed:    g.BytesFreed,
		Writes:        g.Writes,
		Compacted:     g.Compacted,
		Duration:      g.Duration.String(),
	}
}

// maxListErrors bounds the errors one list answer carries.
const maxListErrors = 100

func (h *adminHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		adminError(w, http.StatusMethodNotAllowed, errors.New("receipts: admin handler is read-only (GET)"))
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
		adminError(w, http.StatusNotFound, fmt.Errorf("receipts: no admin endpoint %q (want get, list or stats)", r.URL.Path))
	}
}

func (h *adminHandler) get(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	k := Key{Scope: q.Get("scope"), ID: q.Get("id")}
	rec, err := h.db.inspect(r.Context(), k)
	if err != nil {
		adminError(w, adminStatus(err), err)
		return
	}
	now, err := h.db.now(r.Context())
	if err != nil {
		adminError(w, adminStatus(err), err)
		return
	}
	writeJSON(w, NewAdminReceipt(rec, now))
}

// parseFilter reads a Filter from the query parameters of the list
// endpoint: scope, state, abandoned and limit.
func parseFilter(q url.Values) (Filter, error) {
	var f Filter
	var err error
	f.Scope = q.Get("scope")
	if f.State, err = ParseState(q.Get("state")); err != nil {
		return f, err
	}
	if s := q.Get("abandoned"); s != "" {
		if f.Abandoned, err = strconv.ParseBool(s); err != nil {
			return f, fmt.Errorf("%w: abandoned=%q is not a boolean", ErrInvalidArgument, s)
		}
	}
	if s := q.Get("limit"); s != "" {
		if f.Limit, err = strconv.Atoi(s); err != nil {
			return f, fmt.Errorf("%w: limit=%q is not a number", ErrInvalidArgument, s)
		}
	}
	return f, f.validate()
}

func (h *adminHandler) list(w http.ResponseWriter, r *http.Request) {
	f, err := parseFilter(r.URL.Query())
	if err != nil {
		adminError(w, adminStatus(err), err)
		return
	}
	if err := h.db.enter(); err != nil { // fail before the answer starts
		adminError(w, adminStatus(err), err)
		return
	}
	now, err := h.db.now(r.Context())
	h.db.exit()
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
		if err := enc.Encode(NewAdminReceipt(rec, now)); err != nil {
			return // the client went away
		}
	}
	if dropped > 0 {
		errs = append(errs, fmt.Sprintf("receipts: %d more errors", dropped))
	}
	if errs == nil {
		errs = []string{}
	}
	fmt.Fprintf(bw, `],"errors":%s}`+"\n", mustJSON(errs))
	_ = bw.Flush()
}

func (h *adminHandler) stats(w http.ResponseWriter, r *http.Request) {
	if err := h.db.enter(); err != nil {
		adminError(w, adminStatus(err), err)
		return
	}
	now, err := h.db.now(r.Context())
	h.db.exit()
	if err != nil {
		adminError(w, adminStatus(err), err)
		return
	}
	c, err := h.db.Count(r.Context())
	if err != nil {
		adminError(w, adminStatus(err), err)
		return
	}
	writeJSON(w, NewAdminStats(h.db.Stats(), c, now))
}

// adminStatus maps an engine error to an HTTP status.
func adminStatus(err error) int {
	switch {
	case errors.Is(err, ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, ErrInvalidArgument):
		return http.StatusBadRequest
	case errors.Is(err, ErrClosed):
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
