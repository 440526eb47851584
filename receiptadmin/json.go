package receiptadmin

import (
	"encoding/hex"
	"time"
	"unicode/utf8"

	"github.com/receiptstore/receipts"
)

// Receipt is the JSON form of a receipts.Receipt, as Handler serves it and
// `receiptctl` prints it (`get --json`, `ls --json`, `export`).
type Receipt struct {
	Scope string `json:"scope"`
	ID    string `json:"id"`
	// ScopeBase64 and IDBase64 hold the exact bytes of Scope and ID when
	// they are not valid UTF-8, which a JSON string cannot carry (Scope and
	// ID then hold a lossy rendering). Key returns the exact key.
	ScopeBase64 []byte `json:"scope_base64,omitempty"`
	IDBase64    []byte `json:"id_base64,omitempty"`
	// State is "pending", "succeeded" or "failed" (receipts.ParseState
	// reads it).
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
	// Steps is the key's step journal (receipts.DB.Steps), in order, for a key whose
	// action took steps (Lease.Step); absent otherwise, and in lists (the get endpoint
	// and `receiptctl get` fill it).
	Steps []Step `json:"steps,omitempty"`
}

// Step is the JSON form of one receipts.StepRecord of a key's step journal.
type Step struct {
	// Index is the step's position in the action, from 0.
	Index int `json:"index"`
	// Name is the step's name, as the action calls it (Lease.Step).
	Name string `json:"name"`
	// State is "succeeded" or "failed" once the step is recorded, "pending" while it has
	// started without an outcome.
	State string `json:"state"`
	// Uncertain marks the pending step of an abandoned claim: it started, its holder is
	// gone, and whether its effect happened is unknown. The next attempt runs it again,
	// Recovered, with the same ProviderKey, unless an operator settles it first
	// (`receiptctl reconcile SCOPE ID --step NAME`). At most one step is uncertain.
	Uncertain bool `json:"uncertain,omitempty"`
	// Fingerprint is the step's fingerprint, in hex ("" for none).
	Fingerprint string `json:"fingerprint"`
	// Result is the step's recorded result, base64 in JSON; null while pending.
	Result []byte `json:"result"`
	// At is when the step was recorded (for a pending step: when it started).
	At time.Time `json:"at"`
	// ProviderKey is the idempotency key the step forwarded to its provider
	// (receipts.Step.ProviderKey): ask the provider about it to settle the step.
	ProviderKey string `json:"provider_key"`
}

// NewSteps returns the JSON form of a key's step journal; abandoned says whether the key's
// claim is abandoned (Receipt.Abandoned), which makes its pending step Uncertain. It
// returns nil for no steps.
func NewSteps(steps []receipts.StepRecord, abandoned bool) []Step {
	if len(steps) == 0 {
		return nil
	}
	out := make([]Step, len(steps))
	for i, s := range steps {
		out[i] = Step{
			Index:       s.Index,
			Name:        s.Name,
			State:       s.State.String(),
			Uncertain:   abandoned && s.State == receipts.Pending,
			Fingerprint: hex.EncodeToString(s.Fingerprint),
			Result:      s.Result,
			At:          utc(s.At),
			ProviderKey: s.ProviderKey,
		}
	}
	return out
}

// UncertainStep returns the step of a's journal whose outcome is unknown, nil if none.
func (a *Receipt) UncertainStep() *Step {
	for i := range a.Steps {
		if a.Steps[i].Uncertain {
			return &a.Steps[i]
		}
	}
	return nil
}

// NewReceipt returns the JSON form of r, read at now (which decides
// Abandoned). Times are in UTC.
func NewReceipt(r *receipts.Receipt, now time.Time) Receipt {
	a := Receipt{
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
func (a *Receipt) Key() receipts.Key {
	k := receipts.Key{Scope: a.Scope, ID: a.ID}
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

// List is the JSON answer of Handler's list endpoint. It is
// written as it is read from the store, in this field order, so a client can
// stream it. Errors lists records that could not be read (corrupt ones) and
// an error that ended the scan early, if any.
type List struct {
	Now      time.Time `json:"now"`
	Receipts []Receipt `json:"receipts"`
	Errors   []string  `json:"errors"`
}

// Stats is the JSON form of receipts.Stats and receipts.Counts together.
// Durations are Go duration strings ("24h0m0s", read them with
// time.ParseDuration).
type Stats struct {
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
	// Waiters is the number of claims waiting now for another caller's
	// attempt (added after the format the golden files were first taken
	// from; older clients ignore it).
	Waiters int64 `json:"waiters"`
	// LastGC is nil if no garbage collection ran since the store was opened.
	LastGC *GCStats `json:"last_gc,omitempty"`
	// Counters count calls since the store was opened.
	Counters Counters `json:"counters"`
}

// Counters is the JSON form of receipts.Stats' counters.
type Counters struct {
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

// GCStats is the JSON form of receipts.GCStats.
type GCStats struct {
	At            time.Time `json:"at"`
	EpochsDropped int       `json:"epochs_dropped"`
	BytesFreed    uint64    `json:"bytes_freed"`
	Writes        int       `json:"writes"`
	Compacted     bool      `json:"compacted"`
	Duration      string    `json:"duration"`
}

// NewStats returns the JSON form of s and c, taken at now.
func NewStats(s receipts.Stats, c receipts.Counts, now time.Time) Stats {
	a := Stats{
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
		Waiters:            s.Waiters,
		Counters: Counters{
			Claims: s.Claims, Replays: s.Replays, Takeovers: s.Takeovers,
			Commits: s.Commits, Fails: s.Fails, Releases: s.Releases,
			Abandons: s.Abandons, Conflicts: s.Conflicts, Mismatches: s.Mismatches,
			ReplayCacheHits: s.ReplayCacheHits,
		},
	}
	if !s.LastGC.At.IsZero() {
		g := NewGCStats(s.LastGC)
		a.LastGC = &g
	}
	return a
}

// NewGCStats returns the JSON form of g.
func NewGCStats(g receipts.GCStats) GCStats {
	return GCStats{
		At:            utc(g.At),
		EpochsDropped: g.EpochsDropped,
		BytesFreed:    g.BytesFreed,
		Writes:        g.Writes,
		Compacted:     g.Compacted,
		Duration:      g.Duration.String(),
	}
}
