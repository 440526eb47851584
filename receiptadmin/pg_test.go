package receiptadmin_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/internal/pgtest"
	"github.com/receiptstore/receipts/pgstore"
	"github.com/receiptstore/receipts/receiptadmin"
	"github.com/receiptstore/receipts/receiptstest"
	"github.com/stretchr/testify/require"
)

// openPG opens a PostgreSQL store (a throwaway schema of the test server,
// skipped without one) with the options of newTestStore.
func openPG(t *testing.T) (*receipts.DB, *receiptstest.Clock) {
	t.Helper()
	s := newPGTestStore(t, nil)
	return s.db, s.clock
}

// newPGTestStore opens a PostgreSQL store on a fresh schema with the
// options of every test store, changed by mod.
func newPGTestStore(t *testing.T, mod func(*receipts.Options)) *testStore {
	t.Helper()
	leakCheck(t)
	dsn, schema := pgtest.Schema(t)
	s := &testStore{clock: receiptstest.NewClock(time.Time{})}
	s.db = openPGNode(t, dsn, schema, testOptions(s.clock, mod))
	return s
}

// openPGNode opens a node on schema with opts, with a pool of its own;
// both are closed when t ends (unless the test closed the node first).
func openPGNode(t *testing.T, dsn, schema string, opts receipts.Options) *receipts.DB {
	t.Helper()
	pool, err := pgxpool.New(bg, dsn)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	db, err := pgstore.Open(bg, pool, &pgstore.Options{Schema: schema, Options: opts})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	return db
}

// The handler serves a PostgreSQL store as it serves a Pebble one: the
// record counts, settings and counters in stats, and 503 once it is closed.
func TestHandlerOnPostgreSQL(t *testing.T) {
	db, clock := openPG(t)
	goldenFixture(t, db, clock)
	h := receiptadmin.Handler(db)
	var st receiptadmin.Stats
	require.Equal(t, http.StatusOK, adminGet(t, h, "GET", "/admin/receipts/stats", &st))
	require.Equal(t, []int64{2, 1, 3, 1, 0, 0}, []int64{st.Pending, st.Abandoned, st.Succeeded, st.Failed, st.Expired, st.Corrupt},
		"pending, abandoned, succeeded, failed, expired, corrupt")
	require.Equal(t, "1h0m0s", st.Retention)
	require.Equal(t, "15m0s", st.EpochWidth)
	require.Equal(t, 1, st.LiveEpochs)
	require.Positive(t, st.DiskBytes, "measured by the count the endpoint runs")
	require.Equal(t, uint64(6), st.Counters.Claims)
	require.Zero(t, st.ReplayCacheEntries)

	require.NoError(t, db.Close())
	var e adminErr
	require.Equal(t, http.StatusServiceUnavailable, adminGet(t, h, "GET", "/stats", &e))
	require.Equal(t, http.StatusServiceUnavailable, adminGet(t, h, "GET", "/list", &e))
	require.Equal(t, http.StatusServiceUnavailable, adminGet(t, h, "GET", "/get?scope=a&id=b", &e))
}

// Two nodes of a service on one schema: the handler on node B shows what
// node A wrote (a live claim, a receipt), and keeps serving when node A
// closes; a claim node A abandoned is listed as abandoned on node B.
func TestHandlerOnTwoPostgreSQLNodes(t *testing.T) {
	leakCheck(t)
	dsn, schema := pgtest.Schema(t)
	clock := receiptstest.NewClock(time.Time{})
	a := openPGNode(t, dsn, schema, testOptions(clock, nil))
	b := openPGNode(t, dsn, schema, testOptions(clock, nil))
	hb := receiptadmin.Handler(b)

	live, _, err := a.Claim(bg, key("acct_1", "op-live"), []byte("fp"))
	require.NoError(t, err)
	_, err = a.Do(bg, key("acct_1", "op-ok"), []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) { return []byte("ok"), nil })
	require.NoError(t, err)
	lost, _, err := a.Claim(bg, key("acct_2", "op-lost"), []byte("fp"))
	require.NoError(t, err)
	require.NoError(t, lost.Abandon(bg))

	var r receiptadmin.Receipt
	require.Equal(t, http.StatusOK, adminGet(t, hb, "GET", "/get?scope=acct_1&id=op-live", &r))
	require.Equal(t, "pending", r.State)
	require.False(t, r.Abandoned)
	require.Equal(t, live.Token(), r.Token)
	require.Equal(t, http.StatusOK, adminGet(t, hb, "GET", "/get?scope=acct_1&id=op-ok", &r))
	require.Equal(t, "succeeded", r.State)
	require.Equal(t, []byte("ok"), r.Result)
	var l receiptadmin.List
	require.Equal(t, http.StatusOK, adminGet(t, hb, "GET", "/list?abandoned=true", &l))
	require.Len(t, l.Receipts, 1)
	require.Equal(t, key("acct_2", "op-lost"), l.Receipts[0].Key())

	require.NoError(t, a.Close())
	var st receiptadmin.Stats
	require.Equal(t, http.StatusOK, adminGet(t, hb, "GET", "/stats", &st))
	require.Equal(t, []int64{2, 1, 1}, []int64{st.Pending, st.Abandoned, st.Succeeded}, "pending, abandoned, succeeded")
}
