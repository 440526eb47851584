package receiptstest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/stretchr/testify/require"
)

// Store makes the stores the kit tests. An engine implements it in its own
// tests; every method may call t.Fatal (the kit calls them on the test's
// goroutine).
type Store interface {
	// Open opens a new, empty store with opts and returns it, or the error
	// the engine's open returned (the kit checks that options that cannot
	// work are refused with receipts.ErrInvalidOptions). The kit sets
	// opts.Now to its own Clock and uses only fields every engine accepts
	// (Retention, LeaseTTL, GCInterval, Now, BeforeReplay); the engine adds
	// its own (a file system, a connection pool, a schema). Arrange for the
	// store to be closed and its resources freed when t ends
	// (t.Cleanup); the kit may close it first, and Close is idempotent.
	Open(t testing.TB, opts receipts.Options) (*receipts.DB, error)
	// Reopen closes db (if it is not closed yet) and opens the same store
	// again with opts, as a restart of the process would, and returns it or
	// the engine's error. It is called only with a db that Open or Reopen
	// returned; if it fails, that db may be passed to Reopen again.
	Reopen(t testing.TB, db *receipts.DB, opts receipts.Options) (*receipts.DB, error)
}

// Resolution is a capability a Store may have: its engine keeps times at a
// resolution coarser than the nanosecond of time.Time (PostgreSQL's
// timestamptz keeps microseconds), which Resolution returns. Stored times
// are then whole multiples of it, and the engine decides at the injected
// time truncated to it (the same decisions, every stored time being a whole
// multiple). The few tests that compare a stored time with the kit's clock
// exactly after moving it by less than that move it by a multiple instead.
// A Store without it keeps nanoseconds (Pebble).
type Resolution interface {
	Resolution() time.Duration
}

// A test of the kit.
type test struct {
	name string
	fn   func(t *testing.T, s Store)
}

// topics is every contract test, grouped by topic (the first level of
// subtest names).
func topics() []struct {
	name  string
	tests []test
} {
	return []struct {
		name  string
		tests []test
	}{
		{"Claim", claimTests},
		{"Orphans", orphanTests},
		{"Lease", leaseTests},
		{"LeaseFor", leaseForTests},
		{"TakeOver", takeOverTests},
		{"Reconciler", reconcilerTests},
		{"Wait", waitTests},
		{"Do", doTests},
		{"Steps", stepTests},
		{"Lookup", lookupTests},
		{"BeforeReplay", beforeReplayTests},
		{"Retention", retentionTests},
		{"Tombstones", tombstoneTests},
		{"Tokens", tokenTests},
		{"Restart", restartTests},
		{"BadInput", badInputTests},
		{"Close", closeTests},
		{"Scan", scanTests},
		{"Stats", statsTests},
		{"Corrupt", corruptTests},
		{"Check", checkTests},
		{"Concurrency", concurrencyTests},
		{"Isolation", isolationTests},
		{"Pebble", pebbleTests},
		{"Observe", observeTests},
		{"Encryption", encryptionTests},
		{"Erasure", erasureTests},
		{"HashKeys", hashKeysTests},
	}
}

// Run runs every contract test against s, as subtests named
// Topic/Behaviour (for example "Lease/StaleHolderWritesNothing"): select
// some with go test -run 'Conformance/Lease/'. Tests of Pebble-only methods
// (Lease.CommitWith, DB.DoBatch, DB.Pebble) are skipped on an engine whose
// DB.Pebble returns nil.
func Run(t *testing.T, s Store) {
	for _, tp := range topics() {
		t.Run(tp.name, func(t *testing.T) {
			for _, tc := range tp.tests {
				t.Run(tc.name, func(t *testing.T) { tc.fn(t, s) })
			}
		})
	}
}

// The options every test starts from: Retention 1h, LeaseTTL 30s, no
// background GC (tests call GC themselves).
const (
	retention = time.Hour
	leaseTTL  = 30 * time.Second
)

var bg = context.Background()

// noTombstones turns tombstones off, for tests of what happens right after
// retention (the Tombstones topic tests them).
func noTombstones(o *receipts.Options) { o.TombstoneWindow = -1 }

// window is the tombstone window in force (0 with tombstones off).
func (e *env) window() time.Duration { return max(e.db.Options().TombstoneWindow, 0) }

func key(scope, id string) receipts.Key { return receipts.Key{Scope: scope, ID: id} }

// env is one store under test with its clock.
type env struct {
	t     *testing.T
	store Store
	clock *Clock
	opts  receipts.Options
	db    *receipts.DB
}

// newEnv opens a new store with the kit's options, changed by mod if not nil.
func newEnv(t *testing.T, s Store, mod func(*receipts.Options)) *env {
	t.Helper()
	e := &env{t: t, store: s, clock: NewClock(time.Time{})}
	e.opts = receipts.Options{Retention: retention, LeaseTTL: leaseTTL, GCInterval: -1}
	if mod != nil {
		mod(&e.opts)
	}
	e.opts.Now = e.clock.Now
	db, err := s.Open(t, e.opts)
	require.NoError(t, err, "Store.Open")
	require.NotNil(t, db, "Store.Open")
	e.db = db
	t.Cleanup(func() {
		if e.db != nil {
			require.NoError(t, e.db.Close())
		}
	})
	return e
}

// reopen restarts the store with e.opts.
func (e *env) reopen() {
	e.t.Helper()
	db, err := e.store.Reopen(e.t, e.db, e.opts)
	require.NoError(e.t, err, "Store.Reopen")
	require.NotNil(e.t, db, "Store.Reopen")
	e.db = db
}

// resolution is the resolution of the engine's stored times (see Resolution).
func (e *env) resolution() time.Duration {
	if r, ok := e.store.(Resolution); ok && r.Resolution() > 0 {
		return r.Resolution()
	}
	return time.Nanosecond
}

// isPebble reports whether the engine serves the Pebble-only methods.
func (e *env) isPebble() bool { return pebblestore.DB(e.db) != nil }

// claim claims k and requires a lease (and no receipt).
func (e *env) claim(k receipts.Key, fp string, opts ...receipts.ClaimOption) *receipts.Lease {
	e.t.Helper()
	l, r, err := e.db.Claim(bg, k, []byte(fp), opts...)
	require.NoError(e.t, err, "claim %s", k)
	require.Nil(e.t, r, "claim %s: a receipt with the lease", k)
	require.NotNil(e.t, l, "claim %s: neither lease nor receipt", k)
	return l
}

// replay claims k and requires a receipt (and no lease).
func (e *env) replay(k receipts.Key, fp string, opts ...receipts.ClaimOption) *receipts.Receipt {
	e.t.Helper()
	l, r, err := e.db.Claim(bg, k, []byte(fp), opts...)
	require.NoError(e.t, err, "claim %s", k)
	require.Nil(e.t, l, "claim %s: a lease with the receipt", k)
	require.NotNil(e.t, r, "claim %s: neither lease nor receipt", k)
	return r
}

// inProgress claims k and requires *InProgressError.
func (e *env) inProgress(k receipts.Key, fp string) *receipts.InProgressError {
	e.t.Helper()
	l, r, err := e.db.Claim(bg, k, []byte(fp))
	require.ErrorIs(e.t, err, receipts.ErrInProgress, "claim %s", k)
	require.Nil(e.t, l)
	require.Nil(e.t, r)
	var ip *receipts.InProgressError
	require.ErrorAs(e.t, err, &ip)
	require.Equal(e.t, k, ip.Key)
	require.Positive(e.t, ip.RetryAfter)
	require.LessOrEqual(e.t, ip.RetryAfter, e.db.Options().LeaseTTL)
	return ip
}

// commit claims k and commits result at the current time.
func (e *env) commit(k receipts.Key, fp, result string) *receipts.Receipt {
	e.t.Helper()
	r, err := e.claim(k, fp).Commit(bg, []byte(result))
	require.NoError(e.t, err, "commit %s", k)
	return r
}

// lookup requires k to be visible to Lookup and returns its record.
func (e *env) lookup(k receipts.Key) *receipts.Receipt {
	e.t.Helper()
	r, err := e.db.Lookup(bg, k)
	require.NoError(e.t, err, "lookup %s", k)
	require.NotNil(e.t, r)
	require.Equal(e.t, k, r.Key)
	return r
}

// visible requires k to be visible in state to Lookup and to Scan.
func (e *env) visible(k receipts.Key, state receipts.State) *receipts.Receipt {
	e.t.Helper()
	r := e.lookup(k)
	require.Equal(e.t, state, r.State, "%s", k)
	require.True(e.t, e.scanHas(k), "Scan should list %s", k)
	return r
}

// gone requires k to be invisible to Lookup and Scan.
func (e *env) gone(k receipts.Key) {
	e.t.Helper()
	r, err := e.db.Lookup(bg, k)
	require.ErrorIs(e.t, err, receipts.ErrNotFound, "%s should be gone", k)
	require.Nil(e.t, r)
	require.False(e.t, e.scanHas(k), "Scan should not list %s", k)
}

func (e *env) scanHas(k receipts.Key) bool {
	e.t.Helper()
	found := false
	for r, err := range e.db.Scan(bg, receipts.Filter{Scope: k.Scope}) {
		require.NoError(e.t, err)
		if r.Key == k {
			found = true
		}
	}
	return found
}

// gc runs GC and returns its figures.
func (e *env) gc() receipts.GCStats {
	e.t.Helper()
	st, err := e.db.GC(bg)
	require.NoError(e.t, err)
	return st
}

// counts is the visible records by state.
type counts struct{ Pending, Abandoned, Succeeded, Failed int64 }

// wantCounts requires the store's visible records to be c, counted by Scan
// and by Count.
func (e *env) wantCounts(c counts) {
	e.t.Helper()
	var got counts
	now := e.clock.Now()
	for r, err := range e.db.Scan(bg, receipts.Filter{}) {
		require.NoError(e.t, err)
		switch r.State {
		case receipts.Pending:
			got.Pending++
			if r.Abandoned(now) {
				got.Abandoned++
			}
		case receipts.Succeeded:
			got.Succeeded++
		case receipts.Failed:
			got.Failed++
		}
	}
	require.Equal(e.t, c, got, "records counted by Scan")
	n := e.count()
	require.Equal(e.t, c, counts{n.Pending, n.Abandoned, n.Succeeded, n.Failed}, "records counted by Count")
}

// count is the store's Count.
func (e *env) count() receipts.Counts {
	e.t.Helper()
	n, err := e.db.Count(bg)
	require.NoError(e.t, err, "Count")
	return n
}

// check is the store's Check, nil if the engine does not support it.
func (e *env) check() *receipts.CheckReport {
	e.t.Helper()
	rep, err := e.db.Check(bg)
	if errors.Is(err, receipts.ErrUnsupported) {
		return nil
	}
	require.NoError(e.t, err, "Check")
	require.NotNil(e.t, rep)
	return rep
}

// wantCheckOK requires Check (where the engine supports it) to find
// nothing wrong.
func (e *env) wantCheckOK() {
	e.t.Helper()
	if rep := e.check(); rep != nil {
		require.True(e.t, rep.OK(), "Check found problems in a sound store: %+v", rep.Problems)
	}
}

// expired is how many records are past retention but not collected yet
// (Counts.Expired; see wantCounts).
func (e *env) expired() int64 { return e.count().Expired }

// sameReceipt requires got to be the receipt want: every field, times
// compared as instants.
func sameReceipt(t testing.TB, want, got *receipts.Receipt) {
	t.Helper()
	require.NotNil(t, got)
	require.Equal(t, want.Key, got.Key)
	require.Equal(t, want.Fingerprint, got.Fingerprint)
	require.Equal(t, want.State, got.State)
	require.Equal(t, want.Result, got.Result)
	require.Equal(t, want.Attempts, got.Attempts)
	require.Equal(t, want.Token, got.Token)
	for _, p := range []struct {
		name string
		w, g time.Time
	}{
		{"CreatedAt", want.CreatedAt, got.CreatedAt},
		{"UpdatedAt", want.UpdatedAt, got.UpdatedAt},
		{"ExpiresAt", want.ExpiresAt, got.ExpiresAt},
		{"LeaseExpiresAt", want.LeaseExpiresAt, got.LeaseExpiresAt},
	} {
		require.True(t, p.w.Equal(p.g), "%s: want %s, got %s", p.name, p.w, p.g)
	}
}

// mustNotRun is a Do fn for calls that must be replays.
func mustNotRun(t testing.TB) func(context.Context, *receipts.Lease) ([]byte, error) {
	return func(context.Context, *receipts.Lease) ([]byte, error) {
		t.Error("fn must not run")
		return nil, errors.New("fn must not run")
	}
}

// result is what a Claim or Do in another goroutine returned.
type result struct {
	l   *receipts.Lease
	r   *receipts.Receipt
	err error
}

// bounded returns a context that ends after a generous bound, for a test whose calls
// could wait on the kit's fake clock: a store that never ended a lease would leave a Do
// waiting for it for good, and the test binary's timeout would then name no cause. With
// it, the call returns the in-progress error and "context deadline exceeded", in the
// test that broke. A bound on a hang, never a wait for correctness.
func bounded(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// recv receives from ch, failing the test after a generous bound instead of
// hanging (a bound on a hang, never a wait for correctness).
func recv[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(30 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}
