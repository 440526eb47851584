package receiptsprom_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/internal/pgtest"
	"github.com/receiptstore/receipts/observe"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/receiptstore/receipts/pgstore"
	"github.com/receiptstore/receipts/receiptsprom"
	"github.com/receiptstore/receipts/receiptstest"
)

// TestMain checks for leaked goroutines and stops the PostgreSQL cluster the
// pgstore tests start.
func TestMain(m *testing.M) { pgtest.Main(pgtest.LeakChecked(m)) }

var bg = context.Background()

// store opens one engine's store for the tests, observed by c (a Collector, or one given every replay as events).
type store func(t *testing.T, c observe.Observer, clock *receiptstest.Clock) *receipts.DB

func pebbleStore(t *testing.T, c observe.Observer, clock *receiptstest.Clock) *receipts.DB {
	db, err := pebblestore.Open(filepath.Join(t.TempDir(), "db"), &pebblestore.Options{
		Options: receipts.Options{
			Retention:  time.Hour,
			LeaseTTL:   30 * time.Second,
			GCInterval: -1,
			Now:        clock.Now,
			Observer:   c,
		},
		Pebble: &pebble.Options{FS: vfs.Default},
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func pgStore(t *testing.T, c observe.Observer, clock *receiptstest.Clock) *receipts.DB {
	dsn, schema := pgtest.Schema(t)
	pool, err := pgxpool.New(bg, dsn)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	db, err := pgstore.Open(bg, pool, &pgstore.Options{
		Options: receipts.Options{Retention: time.Hour, LeaseTTL: 30 * time.Second, GCInterval: -1, Now: clock.Now, Observer: c},
		Schema:  schema,
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func engines(t *testing.T, fn func(t *testing.T, open store)) {
	t.Run("pebble", func(t *testing.T) { fn(t, pebbleStore) })
	t.Run("postgres", func(t *testing.T) {
		pgtest.DSN(t) // skips (or fails, with CI=true) without a server
		fn(t, pgStore)
	})
}

// Every metric moves as documented under a scripted workload.
func TestMetricsFollowTheWorkload(t *testing.T) {
	engines(t, func(t *testing.T, open store) {
		c := receiptsprom.New(&receiptsprom.Options{ScanEvery: time.Nanosecond})
		clock := receiptstest.NewClock(time.Time{})
		db := open(t, c, clock)
		c.Watch(db)
		reg := prometheus.NewPedanticRegistry()
		require.NoError(t, reg.Register(c))
		eng := db.Driver().Name()
		pay := observe.WithOperationClass(bg, "pay")
		k := func(id string) receipts.Key { return receipts.Key{Scope: "tenant-a1", ID: id} }

		claims := func(class, outcome string) float64 {
			return testutil.ToFloat64(metric(t, reg, "receipts_claims_total", map[string]string{"engine": eng, "class": class, "outcome": outcome}))
		}
		finishes := func(class, result string) float64 {
			return testutil.ToFloat64(metric(t, reg, "receipts_finishes_total", map[string]string{"engine": eng, "class": class, "result": result}))
		}
		gauge := func(name string) float64 {
			return testutil.ToFloat64(metric(t, reg, name, map[string]string{"engine": eng}))
		}

		// A first call, in progress, its commit, two replays, a mismatch.
		l, _, err := db.Claim(pay, k("1"), []byte("fp"))
		require.NoError(t, err)
		require.Equal(t, 1.0, gauge("receipts_leases_held"))
		_, _, err = db.Claim(pay, k("1"), []byte("fp"))
		require.ErrorIs(t, err, receipts.ErrInProgress)
		_, err = l.Commit(bg, []byte("ok"))
		require.NoError(t, err)
		require.Equal(t, 0.0, gauge("receipts_leases_held"))
		for range 2 {
			_, r, err := db.Claim(pay, k("1"), []byte("fp"))
			require.NoError(t, err)
			require.NotNil(t, r)
		}
		_, _, err = db.Claim(pay, k("1"), []byte("other"))
		require.ErrorIs(t, err, receipts.ErrIntentMismatch)
		require.Equal(t, 1.0, claims("pay", "claimed"))
		require.Equal(t, 1.0, claims("pay", "in_progress"))
		require.Equal(t, 2.0, claims("pay", "replayed"))
		require.Equal(t, 1.0, claims("pay", "mismatch"))
		require.Equal(t, 1.0, finishes("pay", "succeeded"))

		// A wait that times out, an abandoned claim, a takeover, a lost lease.
		held, _, err := db.Claim(bg, k("2"), []byte("fp"))
		require.NoError(t, err)
		_, _, err = db.Claim(bg, k("2"), []byte("fp"), receipts.WaitAtMost(200*time.Millisecond))
		require.ErrorIs(t, err, receipts.ErrInProgress)
		require.Equal(t, uint64(1), histCount(t, reg, "receipts_wait_duration_seconds", map[string]string{"engine": eng, "class": "", "result": "in_progress"}))
		require.Equal(t, 0.0, gauge("receipts_abandoned_claims"))
		clock.Advance(31 * time.Second)
		require.Equal(t, 1.0, gauge("receipts_abandoned_claims"), "the lease ran out: an outcome to reconcile")
		nl, _, err := db.Claim(bg, k("2"), []byte("fp"))
		require.NoError(t, err)
		require.True(t, nl.Recovered())
		_, err = held.Commit(bg, []byte("late"))
		require.ErrorIs(t, err, receipts.ErrLeaseLost)
		require.NoError(t, nl.Abandon(bg))
		require.Equal(t, 1.0, claims("", "took_over"))
		require.Equal(t, 1.0, finishes("", "lease_lost"))
		require.Equal(t, 1.0, finishes("", "abandoned"))
		require.Equal(t, 0.0, gauge("receipts_leases_held"))
		require.Equal(t, 1.0, gauge("receipts_abandoned_claims"))

		// Do: failed and released.
		_, err = db.Do(pay, k("3"), []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
			return nil, receipts.Permanent(errors.New("declined"))
		})
		require.ErrorIs(t, err, receipts.ErrFailed)
		_, err = db.Do(pay, k("4"), []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
			return nil, receipts.NotPerformed(errors.New("bad input"))
		})
		require.Error(t, err)
		require.Equal(t, 1.0, finishes("pay", "failed"))
		require.Equal(t, 1.0, finishes("pay", "released"))
		require.Equal(t, uint64(3), histCount(t, reg, "receipts_operation_duration_seconds", map[string]string{"engine": eng, "class": "pay", "op": "attempt"}))
		require.Equal(t, uint64(7), histCount(t, reg, "receipts_operation_duration_seconds", map[string]string{"engine": eng, "class": "pay", "op": "claim"}))

		// GC: nothing, then everything.
		_, err = db.GC(bg)
		require.NoError(t, err)
		clock.Advance(3 * time.Hour)
		st, err := db.GC(bg)
		require.NoError(t, err)
		require.Positive(t, st.EpochsDropped)
		require.Equal(t, 2.0, testutil.ToFloat64(metric(t, reg, "receipts_gc_runs_total", map[string]string{"engine": eng, "result": "ok"})))
		require.Equal(t, float64(st.EpochsDropped), gauge("receipts_gc_epochs_dropped_total"))
		require.InDelta(t, float64(time.Now().Unix()), gauge("receipts_gc_last_run_timestamp_seconds"), 60)
		require.Equal(t, 0.0, gauge("receipts_abandoned_claims"))

		// The engine's own figures.
		names := familyNames(t, reg)
		prefix := "receipts_" + eng + "_"
		n := 0
		for _, name := range names {
			if strings.HasPrefix(name, prefix) {
				n++
			}
		}
		require.Positive(t, n, "engine metrics %s* in %v", prefix, names)

		// A closed store leaves the scrape.
		require.NoError(t, db.Close())
		for _, name := range familyNames(t, reg) {
			require.False(t, strings.HasPrefix(name, prefix) || name == "receipts_waiters", name)
		}
		problems, err := testutil.GatherAndLint(reg)
		require.NoError(t, err)
		require.Empty(t, problems, "promlint")
	})
}

// receipts_waiters counts claims waiting now.
func TestWaitersGauge(t *testing.T) {
	c := receiptsprom.New(nil)
	clock := receiptstest.NewClock(time.Time{})
	db := pebbleStore(t, c, clock)
	c.Watch(db)
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	k := receipts.Key{Scope: "s", ID: "w"}
	l, _, err := db.Claim(bg, k, []byte("fp"))
	require.NoError(t, err)
	done := make(chan error, 3)
	for range 3 {
		go func() {
			_, _, err := db.Claim(bg, k, []byte("fp"), receipts.WaitForResult())
			done <- err
		}()
	}
	waiters := func() float64 {
		return testutil.ToFloat64(metric(t, reg, "receipts_waiters", map[string]string{"engine": "pebble"}))
	}
	for waiters() != 3 {
		time.Sleep(time.Millisecond)
	}
	_, err = l.Commit(bg, []byte("ok"))
	require.NoError(t, err)
	for range 3 {
		require.NoError(t, <-done)
	}
	require.Equal(t, 0.0, waiters())
}

// No label ever carries a scope or an ID, whatever the keys.
func FuzzScrapeHasNoKeys(f *testing.F) {
	f.Add("tenant", "order-1", "refund")
	f.Add("a", "b", "")
	f.Add("scope with spaces", "id\"quoted\"", "cls")
	c := receiptsprom.New(&receiptsprom.Options{ScanEvery: -1})
	clock := receiptstest.NewClock(time.Time{})
	db, err := pebblestore.Open("db", &pebblestore.Options{Options: receipts.Options{GCInterval: -1, Now: clock.Now, Observer: c}, Pebble: &pebble.Options{FS: vfs.NewMem()}})
	require.NoError(f, err)
	defer db.Close()
	c.Watch(db)
	reg := prometheus.NewPedanticRegistry()
	require.NoError(f, reg.Register(c))
	f.Fuzz(func(t *testing.T, scope, id, class string) {
		if len(scope) < 4 || len(id) < 4 {
			t.Skip("too short to be told from other text")
		}
		k := receipts.Key{Scope: scope, ID: id}
		ctx := bg
		if class != "" && len(class) < 16 && !strings.Contains(scope, class) && !strings.Contains(id, class) {
			ctx = observe.WithOperationClass(bg, class)
		}
		l, _, err := db.Claim(ctx, k, []byte("fp"))
		if err != nil {
			require.ErrorIs(t, err, receipts.ErrInvalidKey)
		} else if l != nil {
			_, err = l.Commit(bg, []byte(scope+id))
			require.NoError(t, err)
			_, _, err = db.Claim(ctx, k, []byte("fp2"))
			require.ErrorIs(t, err, receipts.ErrIntentMismatch)
		}
		mfs, err := reg.Gather()
		require.NoError(t, err)
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				for _, lp := range m.GetLabel() {
					v := lp.GetValue()
					if v == "" {
						continue
					}
					require.NotContains(t, v, scope, "label %s", lp.GetName())
					require.NotContains(t, v, id, "label %s", lp.GetName())
					require.NotContains(t, []string{scope, id}, v)
				}
			}
		}
	})
}

// metric returns the collector for one series of name, failing if absent.
func metric(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if matches(m.GetLabel(), labels) {
				var v float64
				switch {
				case m.GetCounter() != nil:
					v = m.GetCounter().GetValue()
				case m.GetGauge() != nil:
					v = m.GetGauge().GetValue()
				}
				return constGauge(v)
			}
		}
	}
	return constGauge(0) // a series not yet created reads as zero
}

func histCount(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if matches(m.GetLabel(), labels) {
				return m.GetHistogram().GetSampleCount()
			}
		}
	}
	return 0
}

func familyNames(t *testing.T, reg *prometheus.Registry) []string {
	mfs, err := reg.Gather()
	require.NoError(t, err)
	var out []string
	for _, mf := range mfs {
		out = append(out, mf.GetName())
	}
	return out
}

func matches(lps []*dto.LabelPair, want map[string]string) bool {
	if len(lps) != len(want) {
		return false
	}
	for _, lp := range lps {
		if v, ok := want[lp.GetName()]; !ok || v != lp.GetValue() {
			return false
		}
	}
	return true
}

func constGauge(v float64) prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "x", Help: "x"})
	g.Set(v)
	return g
}
