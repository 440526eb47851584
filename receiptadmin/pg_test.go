package receiptadmin_test

import (
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
	leakCheck(t)
	dsn, schema := pgtest.Schema(t)
	pool, err := pgxpool.New(bg, dsn)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	clock := receiptstest.NewClock(time.Time{})
	db, err := pgstore.Open(bg, pool, &pgstore.Options{Schema: schema, Options: receipts.Options{
		Retention: time.Hour, LeaseTTL: 30 * time.Second, EpochWidth: 15 * time.Minute, GCInterval: -1, Now: clock.Now,
	}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	return db, clock
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
