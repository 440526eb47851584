// DRAFT of the engine seam (issue 13), written so that the PostgreSQL engine can be built now and
// wired in once the root package consumes it. The final package will be
// github.com/receiptstore/receipts/driver (modelled on database/sql/driver): the root package
// (receipts) holds the contract — Key validation, Receipt, Lease, claim options and the wait loop,
// Lease.Run / Do's outcome policy, renewal, BeforeReplay, counters, Retry-After estimates — and calls
// an Engine for everything that touches storage. Names may still change in the seam step; the
// semantics below are the contract.
package driver

import (
	"context"
	"errors"
	"iter"
	"time"
)

// ErrLeaseLost: the token is stale (another attempt took over, or the record is gone/expired).
// Engines return it (wrapped or not) from every fenced write; the root maps it to receipts.ErrLeaseLost.
var ErrLeaseLost = errors.New("driver: lease lost")

// ErrCorrupt marks stored bytes that cannot be decoded; never reported as "absent".
var ErrCorrupt = errors.New("driver: corrupt record")

// State of a record.
type State uint8

const (
	Pending   State = 1
	Succeeded State = 2
	Failed    State = 3
)

// Key is {Scope, ID}, already validated by the root (non-empty, <= 255 bytes each).
type Key struct{ Scope, ID string }

// Record is a stored record as the engine sees it. All times are by the ENGINE's clock
// (Pebble: Options.Now with a never-backwards high-water mark; PostgreSQL: the database clock,
// or Options.Now when a test injects one).
type Record struct {
	Key            Key
	Fingerprint    []byte // 1..64 bytes
	State          State
	Result         []byte // nil while Pending; non-nil (maybe empty) once finished
	Attempts       uint32 // 1, +1 per takeover
	Token          uint64 // store-wide unique, larger than every token handed out before it
	CreatedAt      time.Time
	UpdatedAt      time.Time // last write; the record is visible while now < UpdatedAt + Retention
	LeaseExpiresAt time.Time // Pending only: the lease is live while now < LeaseExpiresAt
	ExpiresAt      time.Time // UpdatedAt + Retention
}

// Outcome of a claim.
type Outcome uint8

const (
	Claimed    Outcome = iota + 1 // a new record: Record is the claim (Attempt 1); the caller holds the lease
	TookOver                      // an abandoned/expired-lease Pending record was taken over: new token, Attempts+1, Recovered
	Replay                        // a finished record (Succeeded/Failed): Record holds it, result included; nothing written
	Mismatch                      // the visible record has another fingerprint (any state); nothing written
	InProgress                    // another holder's lease is live; Record holds it (LeaseExpiresAt, UpdatedAt); nothing written
	Expired                       // (phase 2, tombstones) the key was used, its receipt is past retention
)

// ClaimRequest asks for one atomic claim decision (pure rules: internal/machine.Claim).
type ClaimRequest struct {
	Key         Key
	Fingerprint []byte
	LeaseTTL    time.Duration // lease length for this claim (> 0, < Retention)
	NoSync      bool          // Pebble DoBatch only: the claim need not be synced (PostgreSQL ignores it)
}

// ClaimResult is what the engine decided, and its clock at the decision.
type ClaimResult struct {
	Outcome Outcome
	Record  Record
	Now     time.Time
}

// Filter selects records for Scan (the root validates it).
type Filter struct {
	Scope     string // "" = all scopes
	State     State  // 0 = any
	Abandoned bool   // Pending with the lease run out
	Limit     int    // 0 = no limit
}

// GCStats is what one retention pass did.
type GCStats struct {
	At            time.Time
	EpochsDropped int // epochs (Pebble) or partitions (PostgreSQL) dropped
	BytesFreed    uint64
	Writes        int // writes issued: O(epochs), never O(records)
	Duration      time.Duration
}

// Engine is what a storage engine supplies. Every method is safe for concurrent use, honours ctx,
// and exposes nothing that is not durable (DESIGN rule 1; Pebble DoBatch's unsynced claim aside).
// Fenced writes take the holder's token and return ErrLeaseLost (writing nothing) if the visible
// record is not Pending with that token. Fencing is by token, not by time: a holder whose lease ran
// out but that nobody took over may still renew/commit.
type Engine interface {
	// Name is the engine's name for logs and metrics ("pebble", "postgres").
	Name() string
	// Now is the engine's clock (never runs backwards).
	Now(ctx context.Context) (time.Time, error)
	// Claim decides atomically, for exactly one winner among concurrent claimers on every node.
	Claim(ctx context.Context, req ClaimRequest) (ClaimResult, error)
	// Lookup returns the visible record of k (any state), found=false if none.
	Lookup(ctx context.Context, k Key) (rec Record, found bool, now time.Time, err error)
	// Renew extends the lease to now + ttl.
	Renew(ctx context.Context, k Key, token uint64, ttl time.Duration) (Record, error)
	// Finish records Succeeded or Failed with result (synced/committed before it returns).
	Finish(ctx context.Context, k Key, token uint64, state State, result []byte) (Record, error)
	// Release: no effect happened. If the record has Attempts == 1 and was never taken over
	// (recovered == false), the record is deleted (the next claim starts afresh). If recovered is
	// true (this lease took over an unknown outcome), the record is KEPT as an abandoned claim
	// (Pending, lease ended now, same fingerprint and attempts) so the next claim is Recovered too.
	Release(ctx context.Context, k Key, token uint64, recovered bool) error
	// Forget deletes the record (fenced): the caller reconciled and no earlier effect happened.
	Forget(ctx context.Context, k Key, token uint64) error
	// Abandon ends the lease now, keeping the claim: the next claim takes over (Recovered).
	Abandon(ctx context.Context, k Key, token uint64) error
	// Watch returns a channel that is signalled (closed or sent to) after a later
	// Finish/Release/Abandon/Forget of k by ANY node commits; done unregisters. Wake-ups are hints:
	// the waiter re-reads (it calls Claim again). The root registers a watch, re-claims once, and
	// only then waits (so a change between its read and its registration is not missed), bounded by
	// the holder's LeaseExpiresAt, a re-check period and ctx.
	Watch(k Key) (c <-chan struct{}, done func())
	// Scan iterates visible records matching f (operator use), durable only.
	Scan(ctx context.Context, f Filter) iter.Seq2[Record, error]
	// GC reclaims space of records past retention by dropping whole epochs/partitions.
	GC(ctx context.Context) (GCStats, error)
	// Secret is a per-store random secret (created with the store, stable forever): ProviderKey is
	// HMAC-SHA256(secret, key) computed by the root.
	Secret() []byte
	// Close releases the engine's resources (background goroutines, listener connections).
	Close() error
}
