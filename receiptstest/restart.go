package receiptstest

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/receiptstore/receipts"
	"github.com/stretchr/testify/require"
)

var tokenTests = []test{
	{"UniqueAndIncreasing", testTokensIncreasing},
}

var restartTests = []test{
	{"ReceiptsSurvive", testRestartReceiptsSurvive},
	{"PendingClaimIsTakenOverAfterItsLease", testRestartPendingClaim},
}

// Tokens are unique store-wide and larger than every token before them:
// across keys, releases, takeovers, commits, GC of the records that held
// them, and restarts.
func testTokensIncreasing(t *testing.T, s Store) {
	e := newEnv(t, s, noTombstones) // keys are reused right after retention
	seen := map[uint64]bool{}
	last := uint64(0)
	check := func(tok uint64, what string) {
		t.Helper()
		require.False(t, seen[tok], "%s: token %d reused", what, tok)
		require.Greater(t, tok, last, "%s: token %d not above %d", what, tok, last)
		seen[tok], last = true, tok
	}
	for i := range 300 {
		k := key("a", fmt.Sprintf("k%d", i%7))
		l, r, err := e.db.Claim(bg, k, []byte("fp"))
		require.NoError(t, err)
		if r != nil { // finished earlier: let the receipt expire
			e.clock.Advance(retention)
			l = e.claim(k, "fp")
			require.Equal(t, uint32(1), l.Attempt())
		}
		check(l.Token(), fmt.Sprintf("claim %d", i))
		switch i % 5 {
		case 0:
			require.NoError(t, l.Release(bg))
		case 1:
			require.NoError(t, l.Abandon(bg))
		case 2:
			got, err := l.Commit(bg, []byte("x"))
			require.NoError(t, err)
			require.Equal(t, l.Token(), got.Token)
		case 3:
			e.clock.Advance(leaseTTL) // left to run out: the next claim takes over
		case 4:
			require.NoError(t, l.Renew(bg))
			_, err := l.Fail(bg, []byte("no"))
			require.NoError(t, err)
		}
		switch {
		case i%50 == 49:
			e.reopen()
		case i%60 == 59:
			// Everything expires and is collected: the records that held
			// the tokens are gone, the counter is not.
			e.clock.Advance(3 * retention)
			e.gc()
			e.wantCounts(counts{})
		}
	}
	require.Greater(t, len(seen), 200)
}

// A committed receipt, a Failed one and an abandoned claim survive a
// restart, the receipts replayed identically.
func testRestartReceiptsSurvive(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	committed, failed, abandoned := key("a", "committed"), key("a", "failed"), key("a", "abandoned")
	rc, err := e.db.Do(bg, committed, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
		return []byte("item 1"), nil
	})
	require.NoError(t, err)
	rf, err := e.db.Do(bg, failed, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
		return []byte("declined"), receipts.Permanent(errors.New("declined"))
	})
	require.ErrorIs(t, err, receipts.ErrFailed)
	var pk string
	_, err = e.db.Do(bg, abandoned, []byte("fp"), func(_ context.Context, l *receipts.Lease) ([]byte, error) {
		pk = l.ProviderKey()
		return nil, errors.New("timeout")
	})
	require.Error(t, err)

	e.reopen()
	sameReceipt(t, rc, e.replay(committed, "fp"))
	sameReceipt(t, rf, e.replay(failed, "fp"))
	sameReceipt(t, rc, e.lookup(committed))
	_, _, err = e.db.Claim(bg, committed, []byte("other"))
	require.ErrorIs(t, err, receipts.ErrIntentMismatch)
	e.wantCounts(counts{Succeeded: 1, Failed: 1, Pending: 1, Abandoned: 1})
	l := e.claim(abandoned, "fp")
	require.True(t, l.Recovered())
	require.Equal(t, uint32(2), l.Attempt())
	require.Equal(t, pk, l.ProviderKey(), "stable across restarts")

	e.reopen() // twice
	sameReceipt(t, rc, e.replay(committed, "fp"))
}

// A holder from before the restart keeps its lease until it runs out; then
// the next caller takes over, Recovered, with a larger token and the same
// provider key. A waiter waits it out.
func testRestartPendingClaim(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	pending, waited := key("a", "pending"), key("a", "waited")
	l := e.claim(pending, "fp")
	pk, tok := l.ProviderKey(), l.Token()
	lw := e.claim(waited, "fp")
	before := e.lookup(pending)

	e.reopen()
	sameReceipt(t, before, e.visible(pending, receipts.Pending))
	e.inProgress(pending, "fp")
	e.clock.Advance(leaseTTL - 1)
	e.inProgress(pending, "fp")
	e.clock.Advance(1)
	l2 := e.claim(pending, "fp")
	require.True(t, l2.Recovered())
	require.Equal(t, uint32(2), l2.Attempt())
	require.Equal(t, pk, l2.ProviderKey(), "stable across attempts and restarts")
	require.Greater(t, l2.Token(), tok)
	_, err := l.Commit(bg, []byte("from before the restart"))
	require.Error(t, err, "the old process's lease is gone")

	// A holder from before a restart is waited out until its lease expires
	// (waited's lease ran out with pending's: claim a fresh one first).
	l3 := e.claim(waited, "fp")
	require.True(t, l3.Recovered())
	require.Greater(t, l3.Token(), lw.Token())
	e.reopen()
	out := make(chan result, 1)
	e.claimAsync(bg, waited, "fp", out, receipts.WaitForResult())
	letWaitersWait()
	e.clock.Advance(leaseTTL)
	o := recv(t, out, "the waiter")
	require.NoError(t, o.err)
	require.NotNil(t, o.l)
	require.True(t, o.l.Recovered())
	require.Equal(t, uint32(3), o.l.Attempt())
}
