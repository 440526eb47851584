package receipts_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/internal/keys"
	"github.com/receiptstore/receipts/internal/testkit"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/stretchr/testify/require"
)

// The replay cache (Options.ReplayCacheSize) on the real engine: it answers
// retries of finished operations exactly as an uncached read would.

func commit(t *testing.T, db *receipts.DB, k receipts.Key, fp, result []byte) {
	t.Helper()
	_, err := db.Do(bg, k, fp, func(context.Context, *receipts.Lease) ([]byte, error) { return result, nil })
	require.NoError(t, err)
}

func noCall(t *testing.T) func(context.Context, *receipts.Lease) ([]byte, error) {
	return func(context.Context, *receipts.Lease) ([]byte, error) {
		t.Errorf("fn ran on a retry of a finished operation")
		return nil, nil
	}
}

func TestReplayCacheAnswersRetries(t *testing.T) {
	s := newTestStore(t, nil)
	db := s.db
	k, fp := key("tenant", "op-1"), []byte("fp")
	commit(t, db, k, fp, []byte("result"))
	st := db.Stats()
	require.Equal(t, 1, st.ReplayCacheEntries, "a commit is cached")
	require.Positive(t, st.ReplayCacheBytes)
	hits := st.ReplayCacheHits

	r, err := db.Do(bg, k, fp, noCall(t))
	require.NoError(t, err)
	require.Equal(t, "result", string(r.Result))
	require.Equal(t, receipts.Succeeded, r.State)
	// The receipt is the caller's own: changing it changes no later replay.
	r.Result[0], r.Fingerprint[0] = 'X', 'X'

	l, r2, err := db.Claim(bg, k, fp)
	require.NoError(t, err)
	require.Nil(t, l)
	require.Equal(t, "result", string(r2.Result))
	require.Equal(t, "fp", string(r2.Fingerprint))
	r3, err := db.Lookup(bg, k)
	require.NoError(t, err)
	require.Equal(t, r2, r3)

	_, _, err = db.Claim(bg, k, []byte("other intent"))
	require.ErrorIs(t, err, receipts.ErrIntentMismatch)

	st = db.Stats()
	require.Equal(t, hits+4, st.ReplayCacheHits, "Do, Claim, Lookup and the mismatch answered from the cache")
	require.EqualValues(t, 2, st.Replays, "Do and Claim (a Lookup is not a replay)")
	require.EqualValues(t, 1, st.Mismatches)

	// The same receipt as an uncached store gives, field for field.
	s.reopen()
	r4, err := s.db.Lookup(bg, k)
	require.NoError(t, err)
	require.Equal(t, r3, r4)
	require.Zero(t, s.db.Stats().ReplayCacheHits, "a reopened store starts with an empty cache")
	r5, err := s.db.Lookup(bg, k)
	require.NoError(t, err)
	require.Equal(t, r4, r5)
	require.EqualValues(t, 1, s.db.Stats().ReplayCacheHits, "the first uncached read fills the cache")
}

func TestReplayCacheFailedAndEmptyResults(t *testing.T) {
	s := newTestStore(t, nil)
	db := s.db
	fk, ek := key("t", "failed"), key("t", "empty")
	_, err := db.Do(bg, fk, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
		return []byte("declined"), receipts.Permanent(errors.New("card declined"))
	})
	require.Error(t, err)
	commit(t, db, ek, []byte("fp"), nil)
	for range 2 {
		r, err := db.Do(bg, fk, []byte("fp"), noCall(t))
		require.ErrorIs(t, err, receipts.ErrFailed)
		require.Equal(t, receipts.Failed, r.State)
		r, err = db.Do(bg, ek, []byte("fp"), noCall(t))
		require.NoError(t, err)
		require.NotNil(t, r.Result, "a committed result is never nil")
		require.Empty(t, r.Result)
	}
	require.EqualValues(t, 4, db.Stats().ReplayCacheHits)
}

func TestReplayCacheExpiry(t *testing.T) {
	s := newTestStore(t, nil)
	db := s.db
	k, fp := key("tenant", "op"), []byte("fp")
	commit(t, db, k, fp, []byte("r1"))
	s.clock.Advance(time.Hour - time.Nanosecond) // still visible
	r, err := db.Do(bg, k, fp, noCall(t))
	require.NoError(t, err)
	require.Equal(t, "r1", string(r.Result))
	require.EqualValues(t, 1, db.Stats().ReplayCacheHits)

	s.clock.Advance(time.Nanosecond) // expired: a tombstone, not a replay from the cache
	_, _, err = db.Claim(bg, k, fp)
	require.ErrorIs(t, err, receipts.ErrExpired, "an expired receipt must not be replayed from the cache")
	s.clock.Advance(db.Options().TombstoneWindow) // the tombstone ended: a new operation
	l, r, err := db.Claim(bg, k, fp)
	require.NoError(t, err)
	require.Nil(t, r)
	require.NotNil(t, l, "an expired receipt must not be replayed from the cache")
	require.EqualValues(t, 1, l.Attempt())
	_, err = l.Commit(bg, []byte("r2"))
	require.NoError(t, err)
	r, err = db.Do(bg, k, fp, noCall(t))
	require.NoError(t, err)
	require.Equal(t, "r2", string(r.Result))
}

func TestReplayCacheAcrossEpochs(t *testing.T) {
	s := newTestStore(t, nil) // Retention 1h, epochs of 15 min
	db := s.db
	k, fp := key("tenant", "op"), []byte("fp")
	commit(t, db, k, fp, []byte("r"))
	s.clock.Advance(20 * time.Minute) // a newer epoch, the receipt still visible
	for range 2 {
		r, err := db.Do(bg, k, fp, noCall(t))
		require.NoError(t, err)
		require.Equal(t, "r", string(r.Result))
	}
	require.EqualValues(t, 2, db.Stats().ReplayCacheHits)

	// Garbage in the current epoch hides the cached record exactly as it
	// hides it from an uncached read: corrupt, never a replay.
	epoch := uint64(s.clock.Now().UnixNano() / int64(15*time.Minute))
	require.NoError(t, pebblestore.DB(db).Set(keys.AppendRecord(nil, epoch, k.Scope, k.ID), []byte("garbage"), pebble.Sync))
	_, err := db.Do(bg, k, fp, noCall(t))
	require.ErrorIs(t, err, receipts.ErrCorrupt)
	_, err = db.Lookup(bg, k)
	require.ErrorIs(t, err, receipts.ErrCorrupt)
	_, _, err = db.Claim(bg, k, []byte("other"))
	require.ErrorIs(t, err, receipts.ErrCorrupt, "not a mismatch from the cache")
}

func TestReplayCacheSeesEveryChangeOnDisk(t *testing.T) {
	// Whatever replaces the cached bytes (a flipped bit, another valid
	// record) is read as an uncached read would read it.
	s := newTestStore(t, nil)
	db := s.db
	k, fp := key("tenant", "op"), []byte("fp")
	commit(t, db, k, fp, []byte("result"))
	rk := (&corruptStore{db: db}).recordKey(t, k)
	orig := (&corruptStore{db: db}).raw(t, rk)
	for i := range orig {
		bad := append([]byte{}, orig...)
		bad[i] ^= 0x01
		require.NoError(t, pebblestore.DB(db).Set(rk, bad, pebble.Sync))
		_, err := db.Do(bg, k, fp, noCall(t))
		require.ErrorIs(t, err, receipts.ErrCorrupt, "byte %d flipped", i)
	}
	// Another valid record under the key (as a restore could write): the
	// cached one is not used.
	other := receipts.Key{Scope: "tenant", ID: "other"}
	commit(t, db, other, fp, []byte("other result"))
	ork := (&corruptStore{db: db}).recordKey(t, other)
	require.NoError(t, pebblestore.DB(db).Set(rk, (&corruptStore{db: db}).raw(t, ork), pebble.Sync))
	r, err := db.Do(bg, k, fp, noCall(t))
	require.NoError(t, err)
	require.Equal(t, "other result", string(r.Result))
	require.NoError(t, pebblestore.DB(db).Set(rk, orig, pebble.Sync))
	r, err = db.Do(bg, k, fp, noCall(t))
	require.NoError(t, err)
	require.Equal(t, "result", string(r.Result))
}

func TestReplayCacheGC(t *testing.T) {
	s := newTestStore(t, nil)
	db := s.db
	for i := range 50 {
		commit(t, db, key("tenant", fmt.Sprint(i)), []byte("fp"), []byte("r"))
	}
	require.Equal(t, 50, db.Stats().ReplayCacheEntries)
	s.clock.Advance(2*time.Hour + db.Options().TombstoneWindow) // past the tombstones too
	_, err := db.GC(bg)
	require.NoError(t, err)
	require.Zero(t, db.Stats().ReplayCacheEntries, "GC drops expired entries")
	l, _, err := db.Claim(bg, key("tenant", "7"), []byte("fp"))
	require.NoError(t, err)
	require.NotNil(t, l)
}

func TestReplayCacheDisabledAndTiny(t *testing.T) {
	for _, size := range []int64{-1, 512} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			s := newTestStore(t, func(o *pebblestore.Options) { o.ReplayCacheSize = size })
			db := s.db
			for i := range 20 {
				commit(t, db, key("tenant", fmt.Sprint(i)), []byte("fp"), []byte(fmt.Sprint("r", i)))
			}
			for round := range 3 {
				for i := range 20 {
					r, err := db.Do(bg, key("tenant", fmt.Sprint(i)), []byte("fp"), noCall(t))
					require.NoError(t, err, "round %d key %d", round, i)
					require.Equal(t, fmt.Sprint("r", i), string(r.Result))
				}
			}
			st := db.Stats()
			require.EqualValues(t, 60, st.Replays)
			if size < 0 {
				require.Zero(t, st.ReplayCacheHits)
				require.Zero(t, st.ReplayCacheEntries)
			} else {
				require.LessOrEqual(t, st.ReplayCacheEntries, 8, "a 512-byte cache holds one set of eight")
			}
		})
	}
}

// TestReplayFromMemoryAllocatesOnce: a replay of a small receipt answered
// from the replay cache's memory allocates once (the caller's Receipt with
// its own copy of the fingerprint and result), and the copy is the
// caller's: changing it changes no later replay (fails under the nocopy
// mutation).
func TestReplayFromMemoryAllocatesOnce(t *testing.T) {
	s := newTestStore(t, nil)
	k, fp := key("tenant", "op-1"), []byte("fp")
	commit(t, s.db, k, fp, []byte("result"))
	for range 3 {
		_, r, err := s.db.Claim(bg, k, fp)
		require.NoError(t, err)
		require.Equal(t, "result", string(r.Result))
		require.Equal(t, "fp", string(r.Fingerprint))
		r.Result[0], r.Fingerprint[0] = 'X', 'X'
	}
	if testkit.RaceEnabled {
		t.Skip("allocations are not counted under the race detector")
	}
	allocs := testing.AllocsPerRun(100, func() {
		if _, _, err := s.db.Claim(bg, k, fp); err != nil {
			t.Fatal(err)
		}
	})
	require.LessOrEqual(t, allocs, 1.0)
}
