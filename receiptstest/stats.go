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
