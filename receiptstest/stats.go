package receiptstest

import (
	"context"
	"errors"
	"testing"

	"github.com/receiptstore/receipts"
	"github.com/stretchr/testify/require"
)

var statsTests = []test{
	{"Counters", testStatsCounters},
	{"Count", testCount},
}

// Count counts the visible records by state (Abandoned within Pending) and
// those past retention; it honours ctx and returns ErrClosed after Close.
// Stats reads no record: it answers with the settings and counters, after
// Close too.
func testCount(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	e.wantCounts(counts{})
	e.commit(key("a", "ok"), "fp", "r")
	l := e.claim(key("a", "failed"), "fp")
	_, err := l.Fail(bg, []byte("no"))
	require.NoError(t, err)
	e.claim(key("b", "held"), "fp")
	e.wantCounts(counts{Pending: 1, Succeeded: 1, Failed: 1})
	e.clock.Advance(leaseTTL)
	e.wantCounts(counts{Pending: 1, Abandoned: 1, Succeeded: 1, Failed: 1})
	c := e.count()
	require.Positive(t, c.LiveEpochs)
	require.Zero(t, c.Expired+c.Corrupt)

	ctx, cancel := context.WithCancel(bg)
	cancel()
	_, err = e.db.Count(ctx)
	require.ErrorIs(t, err, context.Canceled, "Count with a cancelled ctx")

	require.NoError(t, e.db.Close())
	_, err = e.db.Count(bg)
	require.ErrorIs(t, err, receipts.ErrClosed, "Count after Close")
	st := e.db.Stats()
	require.Equal(t, e.db.Options().Retention, st.Retention)
	require.EqualValues(t, 3, st.Claims)
}

// Stats counts calls since Open: claims (a lease handed out, takeovers
// included), replays (Claim and Do, not Lookup), takeovers, commits, fails,
// releases, abandons, conflicts (once per call, however long it waits) and
// mismatches; a restart starts them again.
func testStatsCounters(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	fp := []byte("fp")
	a, b, c := key("a", "a"), key("a", "b"), key("a", "c")

	la := e.claim(a, "fp")                      // claim
	e.inProgress(a, "fp")                       // conflict
	_, _, err := e.db.Claim(bg, a, []byte("x")) // mismatch
	require.ErrorIs(t, err, receipts.ErrIntentMismatch)
	_, err = la.Commit(bg, []byte("r")) // commit
	require.NoError(t, err)
	e.replay(a, "fp")                          // replay
	_, err = e.db.Do(bg, a, fp, mustNotRun(t)) // replay
	require.NoError(t, err)
	e.lookup(a) // not a replay

	lb := e.claim(b, "fp")             // claim
	require.NoError(t, lb.Abandon(bg)) // abandon
	lb = e.claim(b, "fp")              // claim, takeover
	_, err = lb.Fail(bg, []byte("no")) // fail
	require.NoError(t, err)

	_, err = e.db.Do(bg, c, fp, func(context.Context, *receipts.Lease) ([]byte, error) { // claim, release
		return nil, receipts.NotPerformed(errors.New("not now"))
	})
	require.Error(t, err)

	st := e.db.Stats()
	got := []uint64{st.Claims, st.Replays, st.Takeovers, st.Commits, st.Fails, st.Releases, st.Abandons, st.Conflicts, st.Mismatches}
	require.Equal(t, []uint64{4, 2, 1, 1, 1, 1, 1, 1, 1}, got,
		"Claims, Replays, Takeovers, Commits, Fails, Releases, Abandons, Conflicts, Mismatches")

	e.reopen()
	st = e.db.Stats()
	require.Zero(t, st.Claims+st.Replays+st.Takeovers+st.Commits+st.Fails+st.Releases+st.Abandons+st.Conflicts+st.Mismatches)
}
