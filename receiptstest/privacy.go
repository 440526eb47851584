package receiptstest

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/keyring"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/stretchr/testify/require"
)

// Backup is a capability a Store may have: it copies a store as a backup of it would (Pebble:
// DB.Checkpoint; PostgreSQL: pg_dump), so that the Erasure tests can check that a copy
// taken before an erasure cannot decrypt the erased scope after it.
type Backup interface {
	// Backup copies db's store as it is now, and returns a function that opens the copy
	// with opts as a store of its own (closed when t ends), or the engine's error.
	Backup(t testing.TB, db *receipts.DB) (open func(opts receipts.Options) (*receipts.DB, error))
}

// Encryption (Options.Keyring): results are stored encrypted per scope, and every behaviour
// is the one without it. An engine that keeps no data keys refuses the option with
// receipts.ErrUnsupported, and these tests are skipped there, saying so.
var encryptionTests = []test{
	{"RoundTrip", testSealRoundTrip},
	{"BeforeReplaySeesNoResult", testSealBeforeReplay},
	{"SameBehaviour", testSealSameBehaviour},
	{"TurnedOnLater", testSealTurnedOn},
	{"WithoutTheKeyringNothingRuns", testSealNoKeyring},
	{"RewrapAfterRotation", testSealRewrap},
}

// Erasure (DB.EraseScope). An engine that cannot erase returns receipts.ErrUnsupported, and
// these tests are skipped there, saying so.
var erasureTests = []test{
	{"EveryAPIAnswersErased", testEraseEveryAPI},
	{"OtherScopesUntouched", testEraseOthers},
	{"Idempotent", testEraseIdempotent},
	{"SurvivesRestart", testEraseRestart},
	{"WindowEndsThenNewAction", testEraseWindowEnds},
	{"RacingClaims", testEraseRacing},
	{"BackupBeforeCannotDecrypt", testEraseBackup},
}

// newKeyring creates a key file (package keyring) in a temporary directory.
func newKeyring(t testing.TB) *keyring.File {
	t.Helper()
	kr, err := keyring.Create(filepath.Join(t.TempDir(), "receipts.keyring"))
	require.NoError(t, err)
	return kr
}

// sealEnv opens a store with a Keyring (and mod), skipping the test on an engine that keeps
// no data keys.
func sealEnv(t *testing.T, s Store, mod func(*receipts.Options)) (*env, *keyring.File) {
	t.Helper()
	kr := newKeyring(t)
	clock := NewClock(time.Time{})
	opts := receipts.Options{Retention: retention, LeaseTTL: leaseTTL, GCInterval: -1, Now: clock.Now, Keyring: kr}
	if mod != nil {
		mod(&opts)
	}
	db, err := s.Open(t, opts)
	if errors.Is(err, receipts.ErrUnsupported) {
		t.Skipf("this engine keeps no data keys (Open with a Keyring: %v)", err)
	}
	require.NoError(t, err, "Store.Open")
	e := &env{t: t, store: s, clock: clock, opts: opts, db: db}
	t.Cleanup(func() {
		if e.db != nil {
			require.NoError(t, e.db.Close())
		}
	})
	return e, kr
}

func resultOf(k receipts.Key) []byte { return []byte("the result of " + k.Scope + "/" + k.ID) }

// record commits k's result with Do (fn returns resultOf(k)).
func (e *env) record(k receipts.Key) {
	e.t.Helper()
	_, err := e.db.Do(bg, k, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) { return resultOf(k), nil })
	require.NoError(e.t, err, "Do %s", k)
}

// replays requires every way of reading k's receipt to give resultOf(k), running nothing.
func (e *env) replays(k receipts.Key) {
	e.t.Helper()
	r, err := e.db.Do(bg, k, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
		e.t.Errorf("Do ran fn again for %s", k)
		return nil, nil
	})
	require.NoError(e.t, err, "Do %s", k)
	require.Equal(e.t, string(resultOf(k)), string(r.Result), "Do %s", k)
	r = e.replay(k, "fp")
	require.Equal(e.t, string(resultOf(k)), string(r.Result), "Claim %s", k)
	r, err = e.db.Lookup(bg, k)
	require.NoError(e.t, err)
	require.Equal(e.t, string(resultOf(k)), string(r.Result), "Lookup %s", k)
	r, err = e.db.Inspect(bg, k)
	require.NoError(e.t, err)
	require.Equal(e.t, string(resultOf(k)), string(r.Result), "Inspect %s", k)
}

func testSealRoundTrip(t *testing.T, s Store) {
	e, _ := sealEnv(t, s, nil)
	ks := []receipts.Key{key("a", "1"), key("a", "2"), key("b", "1")}
	for _, k := range ks {
		e.record(k)
	}
	for _, k := range ks {
		e.replays(k)
	}
	n := 0
	for r, err := range e.db.Scan(bg, receipts.Filter{}) {
		require.NoError(t, err)
		require.Equal(t, string(resultOf(r.Key)), string(r.Result))
		n++
	}
	require.Equal(t, 3, n)
	e.reopen()
	for _, k := range ks {
		e.replays(k)
	}
	// CommitWith/Fail/Commit of a held lease, and an empty result
	l := e.claim(key("a", "held"), "fp")
	r, err := l.Commit(bg, nil)
	require.NoError(t, err)
	require.NotNil(t, r.Result)
	require.Empty(t, r.Result)
	r = e.replay(key("a", "held"), "fp")
	require.NotNil(t, r.Result)
	require.Empty(t, r.Result)
}

func testSealBeforeReplay(t *testing.T, s Store) {
	var seen []receipts.Receipt // as BeforeReplay saw them
	deny := false
	e, _ := sealEnv(t, s, func(o *receipts.Options) {
		o.BeforeReplay = func(_ context.Context, r *receipts.Receipt) error {
			seen = append(seen, *r)
			if deny {
				return errors.New("not allowed")
			}
			return nil
		}
	})
	k := key("a", "1")
	e.record(k)
	r := e.replay(k, "fp")
	require.Equal(t, string(resultOf(k)), string(r.Result))
	_, err := e.db.Lookup(bg, k)
	require.NoError(t, err)
	require.Len(t, seen, 2)
	deny = true
	_, _, err = e.db.Claim(bg, k, []byte("fp"))
	require.ErrorContains(t, err, "not allowed")
	_, err = e.db.Lookup(bg, k)
	require.ErrorContains(t, err, "not allowed")
	for _, r := range seen {
		require.Nil(t, r.Result, "BeforeReplay saw the result")
		require.Equal(t, receipts.Succeeded, r.State)
		require.Equal(t, []byte("fp"), r.Fingerprint)
	}
}

// testSealSameBehaviour: mismatch, failures, in-progress, abandonment and tombstones behave
// as without encryption.
func testSealSameBehaviour(t *testing.T, s Store) {
	e, _ := sealEnv(t, s, func(o *receipts.Options) { o.TombstoneWindow = time.Hour })
	k := key("a", "1")
	e.record(k)
	_, _, err := e.db.Claim(bg, k, []byte("other"))
	require.ErrorIs(t, err, receipts.ErrIntentMismatch)
	f := key("a", "failed")
	r, err := e.db.Do(bg, f, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
		return []byte("declined: card expired"), receipts.Permanent(errors.New("declined"))
	})
	require.ErrorIs(t, err, receipts.ErrFailed)
	require.Equal(t, "declined: card expired", string(r.Result))
	r, err = e.db.Do(bg, f, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
		t.Error("ran again")
		return nil, nil
	})
	require.ErrorIs(t, err, receipts.ErrFailed)
	require.Equal(t, "declined: card expired", string(r.Result))
	require.Equal(t, receipts.Failed, r.State)
	p := key("a", "pending")
	l := e.claim(p, "fp")
	e.inProgress(p, "fp")
	require.NoError(t, l.Abandon(bg))
	l = e.claim(p, "fp")
	require.True(t, l.Recovered())
	_, err = l.Commit(bg, resultOf(p))
	require.NoError(t, err)
	e.replays(p)
	e.clock.Advance(retention)
	_, _, err = e.db.Claim(bg, k, []byte("fp"))
	require.ErrorIs(t, err, receipts.ErrExpired, "a tombstone, encrypted or not")
}

func testSealTurnedOn(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	before := key("a", "before")
	e.record(before)
	kr := newKeyring(t)
	e.opts.Keyring = kr
	db, err := e.store.Reopen(t, e.db, e.opts)
	if errors.Is(err, receipts.ErrUnsupported) {
		e.db = nil
		t.Skipf("this engine keeps no data keys: %v", err)
	}
	require.NoError(t, err)
	e.db = db
	after := key("a", "after")
	e.record(after)
	e.replays(before)
	e.replays(after)
}

func testSealNoKeyring(t *testing.T, s Store) {
	e, _ := sealEnv(t, s, nil)
	k := key("a", "1")
	e.record(k)
	e.opts.Keyring = nil
	e.reopen()
	ran := false
	_, err := e.db.Do(bg, k, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
		ran = true
		return nil, nil
	})
	require.ErrorIs(t, err, receipts.ErrSealed)
	require.False(t, ran)
	_, err = e.db.Lookup(bg, k)
	require.ErrorIs(t, err, receipts.ErrSealed)
	_, _, err = e.db.Claim(bg, k, []byte("other"))
	require.ErrorIs(t, err, receipts.ErrIntentMismatch, "the fingerprint is in the clear")
	_, err = e.db.RewrapKeys(bg)
	require.ErrorIs(t, err, receipts.ErrUnsupported)
}

func testSealRewrap(t *testing.T, s Store) {
	e, kr := sealEnv(t, s, nil)
	ks := []receipts.Key{key("a", "1"), key("b", "1"), key("c", "1")}
	for _, k := range ks {
		e.record(k)
	}
	v, err := kr.Rotate(bg)
	require.NoError(t, err)
	n, err := e.db.RewrapKeys(bg)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	require.NoError(t, kr.Retire(bg, v-1))
	e.reopen()
	for _, k := range ks {
		e.replays(k)
	}
}

// eraseEnv opens a store with a Keyring, and erases nothing yet; it skips the test on an
// engine that cannot erase.
func eraseEnv(t *testing.T, s Store) (*env, *keyring.File) {
	t.Helper()
	e, kr := sealEnv(t, s, func(o *receipts.Options) { o.TombstoneWindow = 2 * time.Hour })
	if _, err := e.db.EraseScope(bg, "probe-of-erasure"); errors.Is(err, receipts.ErrUnsupported) {
		t.Skipf("this engine cannot erase: %v", err)
	}
	return e, kr
}

// erasedNow requires every way of reading or retrying k to answer ErrErased (with
// ErrExpired), running nothing.
func (e *env) erasedNow(k receipts.Key) {
	e.t.Helper()
	for _, fp := range []string{"fp", "another intent"} {
		l, r, err := e.db.Claim(bg, k, []byte(fp))
		require.ErrorIs(e.t, err, receipts.ErrErased, "claim %s", k)
		require.ErrorIs(e.t, err, receipts.ErrExpired, "claim %s", k)
		require.Nil(e.t, l)
		require.Nil(e.t, r)
		var ee *receipts.ErasedError
		require.ErrorAs(e.t, err, &ee)
		require.Equal(e.t, k, ee.Key)
	}
	_, err := e.db.Do(bg, k, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
		e.t.Errorf("Do ran fn in an erased scope (%s)", k)
		return nil, nil
	})
	require.ErrorIs(e.t, err, receipts.ErrErased, "Do %s", k)
	_, err = e.db.Lookup(bg, k)
	require.ErrorIs(e.t, err, receipts.ErrErased, "Lookup %s", k)
	require.ErrorIs(e.t, err, receipts.ErrNotFound, "Lookup %s", k)
	_, err = e.db.Inspect(bg, k)
	require.ErrorIs(e.t, err, receipts.ErrErased, "Inspect %s", k)
	for r, err := range e.db.Scan(bg, receipts.Filter{Scope: k.Scope}) {
		e.t.Fatalf("Scan of an erased scope: %v %v", r, err)
	}
	for tb, err := range e.db.Tombstones(bg, k.Scope, 0) {
		e.t.Fatalf("Tombstones of an erased scope: %v %v", tb, err)
	}
}

func testEraseEveryAPI(t *testing.T, s Store) {
	e, _ := eraseEnv(t, s)
	old := key("victim", "expired")
	e.record(old)
	e.clock.Advance(retention) // old is a tombstone now
	ks := []receipts.Key{key("victim", "1"), key("victim", "2")}
	for _, k := range ks {
		e.record(k)
	}
	held := e.claim(key("victim", "held"), "fp")
	ab := e.claim(key("victim", "abandoned"), "fp")
	require.NoError(t, ab.Abandon(bg))
	st, err := e.db.EraseScope(bg, "victim")
	require.NoError(t, err)
	require.GreaterOrEqual(t, st.Records, int64(4))
	require.True(t, st.KeyDestroyed, "a keyring.File destroys the key")
	require.Equal(t, e.db.ScopeID("victim"), st.ScopeID)
	now, err := e.db.Now(bg)
	require.NoError(t, err)
	require.True(t, now.Add(retention+2*time.Hour).Equal(st.Until), "Until %s, want %s", st.Until, now.Add(retention+2*time.Hour))
	for _, k := range append(ks, old, key("victim", "held"), key("victim", "abandoned"), key("victim", "never-used")) {
		e.erasedNow(k)
	}
	_, err = held.Commit(bg, []byte("too late"))
	require.ErrorIs(t, err, receipts.ErrLeaseLost)
	require.ErrorIs(t, held.Renew(bg), receipts.ErrLeaseLost)
	for r, err := range e.db.Scan(bg, receipts.Filter{}) {
		t.Fatalf("Scan after erasing the only scope: %v %v", r, err)
	}
	var ledger []receipts.EraseStats
	for x, err := range e.db.Erasures(bg) {
		require.NoError(t, err)
		ledger = append(ledger, x)
	}
	require.Len(t, ledger, 2) // the probe's and this one
	_, err = e.db.EraseScope(bg, "")
	require.ErrorIs(t, err, receipts.ErrInvalidKey)
}

func testEraseOthers(t *testing.T, s Store) {
	e, _ := eraseEnv(t, s)
	victim, others := key("victim", "1"), []receipts.Key{key("other", "1"), key("victim-2", "1"), key("victi", "m1")}
	e.record(victim)
	for _, k := range others {
		e.record(k)
	}
	_, err := e.db.EraseScope(bg, "victim")
	require.NoError(t, err)
	e.erasedNow(victim)
	for _, k := range others {
		e.replays(k)
	}
	e.record(key("other", "2")) // new actions in other scopes
	e.replays(key("other", "2"))
}

func testEraseIdempotent(t *testing.T, s Store) {
	e, _ := eraseEnv(t, s)
	e.record(key("victim", "1"))
	first, err := e.db.EraseScope(bg, "victim")
	require.NoError(t, err)
	e.clock.Advance(time.Minute)
	again, err := e.db.EraseScope(bg, "victim")
	require.NoError(t, err)
	require.True(t, first.At.Equal(again.At), "At %s, then %s", first.At, again.At)
	require.Equal(t, first.Records, again.Records)
	require.True(t, again.KeyDestroyed)
	e.erasedNow(key("victim", "1"))
}

func testEraseRestart(t *testing.T, s Store) {
	e, _ := eraseEnv(t, s)
	e.record(key("victim", "1"))
	_, err := e.db.EraseScope(bg, "victim")
	require.NoError(t, err)
	e.reopen()
	e.erasedNow(key("victim", "1"))
}

func testEraseWindowEnds(t *testing.T, s Store) {
	e, _ := eraseEnv(t, s)
	k := key("victim", "1")
	e.record(k)
	st, err := e.db.EraseScope(bg, "victim")
	require.NoError(t, err)
	e.clock.Set(st.Until.Add(-e.resolution()))
	e.erasedNow(k)
	e.clock.Set(st.Until)
	l := e.claim(k, "another intent") // a new action, with a new data key
	require.Equal(t, uint32(1), l.Attempt())
	_, err = l.Commit(bg, resultOf(k))
	require.NoError(t, err)
	r := e.replay(k, "another intent")
	require.Equal(t, string(resultOf(k)), string(r.Result))
	// and it can be erased again
	st2, err := e.db.EraseScope(bg, "victim")
	require.NoError(t, err)
	require.Equal(t, int64(2), st2.Records)
	e.erasedNow(k)
}

// testEraseRacing: claims, renewals and commits of the scope racing its erasure either land
// before it (and are erased) or find it: afterwards no record of it is left, and no call made
// after EraseScope returned runs an action. (A call made before may still run its action
// after: its claim landed before the erasure, and its commit writes nothing.)
func testEraseRacing(t *testing.T, s Store) {
	e, _ := eraseEnv(t, s)
	db := e.db
	var stop, erased atomic.Bool
	var late atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				k := key("victim", fmt.Sprintf("w%d-%d", w, i))
				after := erased.Load() // this call is made after EraseScope returned
				_, err := db.Do(bg, k, []byte("fp"), func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
					if after {
						late.Add(1)
					}
					if i%3 == 0 {
						if err := l.Renew(ctx); err != nil {
							return nil, receipts.NotPerformed(err)
						}
					}
					return resultOf(k), nil
				})
				if err != nil && !errors.Is(err, receipts.ErrErased) && !errors.Is(err, receipts.ErrLeaseLost) &&
					!errors.Is(err, receipts.ErrOutcomeUnknown) {
					errs <- err
					return
				}
			}
		})
	}
	time.Sleep(30 * time.Millisecond)
	_, err := db.EraseScope(bg, "victim")
	require.NoError(t, err)
	erased.Store(true)
	time.Sleep(30 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	close(errs)
	require.NoError(t, <-errs)
	require.Zero(t, late.Load(), "calls made after EraseScope returned ran their actions")
	for r, err := range db.Scan(bg, receipts.Filter{}) {
		t.Fatalf("a record of the erased scope survived: %v %v", r, err)
	}
	c, err := db.Count(bg)
	require.NoError(t, err)
	require.Zero(t, c.Pending+c.Succeeded+c.Failed)
}

func testEraseBackup(t *testing.T, s Store) {
	b, ok := s.(Backup)
	if !ok {
		t.Skip("this Store cannot take a backup (receiptstest.Backup)")
	}
	e, kr := eraseEnv(t, s)
	victim, other := key("victim", "1"), key("other", "1")
	e.record(victim)
	e.record(other)
	open := b.Backup(t, e.db)
	_, err := e.db.EraseScope(bg, "victim")
	require.NoError(t, err)
	opts := e.opts
	opts.Keyring = kr
	cp, err := open(opts)
	require.NoError(t, err)
	defer cp.Close()
	_, err = cp.Lookup(bg, victim) // the backup holds the record, not a readable result
	require.ErrorIs(t, err, receipts.ErrErased)
	require.NotContains(t, err.Error(), string(resultOf(victim)))
	r, err := cp.Lookup(bg, other)
	require.NoError(t, err)
	require.Equal(t, string(resultOf(other)), string(r.Result))
}

// Backup implements Backup with a Checkpoint of db, opened in place of the store.
func (s *PebbleStore) Backup(t testing.TB, db *receipts.DB) func(opts receipts.Options) (*receipts.DB, error) {
	s.mu.Lock()
	p := s.places[db]
	s.mu.Unlock()
	cp := pebblePlace{dir: filepath.Join(t.TempDir(), "checkpoint"), fs: p.fs}
	if p.fs != nil {
		cp.dir = p.dir + "-checkpoint"
	}
	require.NoError(t, pebblestore.Checkpoint(db, cp.dir))
	return func(opts receipts.Options) (*receipts.DB, error) { return s.open(t, cp, opts) }
}
