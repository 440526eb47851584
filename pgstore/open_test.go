package pgstore

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/driver"
)

// openDB opens a *receipts.DB on d's schema with pgstore.Open (o.Schema is filled in), on a
// pool of its own: another node. Both are closed when the test ends.
func (d *testDB) openDB(o Options) (*receipts.DB, *pgxpool.Pool) {
	d.t.Helper()
	db, pool, err := d.tryOpenDB(o)
	if err != nil {
		d.t.Fatal(err)
	}
	return db, pool
}

func (d *testDB) tryOpenDB(o Options) (*receipts.DB, *pgxpool.Pool, error) {
	d.t.Helper()
	pool, err := pgxpool.NewWithConfig(bg, d.poolConfig(0))
	if err != nil {
		d.t.Fatal(err)
	}
	o.Schema = d.schema
	db, err := Open(bg, pool, &o)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	d.t.Cleanup(func() {
		_ = db.Close()
		pool.Close()
	})
	return db, pool, nil
}

// Open serves the receipts contract: the DB reports the engine's settings (the stored epoch
// width), a claim, commit and replay go through, Stats counts what is stored, and a second
// node on the same schema sees the receipt.
func TestOpenServesTheContract(t *testing.T) {
	leakCheck(t)
	testOpenServesTheContract(t, newTestDB(t))
}

func testOpenServesTheContract(t *testing.T, d *testDB) {
	clk := newClock()
	a, _ := d.openDB(Options{Options: receipts.Options{Now: clk.Now, Retention: 8 * time.Hour, EpochWidth: time.Hour}})
	b, _ := d.openDB(Options{Options: receipts.Options{Now: clk.Now, Retention: 8 * time.Hour, EpochWidth: 2 * time.Hour}})
	if w := b.Options().EpochWidth; w != time.Hour {
		t.Fatalf("second node's epoch width %s, want the stored 1h", w)
	}
	k := receipts.Key{Scope: "s", ID: "open"}
	l, r, err := a.Claim(bg, k, []byte("fp"))
	if err != nil || r != nil {
		t.Fatalf("claim: %v %v", r, err)
	}
	if _, err := l.Commit(bg, []byte("ok")); err != nil {
		t.Fatal(err)
	}
	_, r, err = b.Claim(bg, k, []byte("fp"))
	if err != nil || r == nil || string(r.Result) != "ok" {
		t.Fatalf("replay on the other node: %+v %v", r, err)
	}
	l2, _, err := b.Claim(bg, receipts.Key{Scope: "s", ID: "pending"}, []byte("fp"))
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Minute) // the lease has run out: abandoned
	if s := a.Stats(); s.DiskBytes != 0 {
		t.Fatalf("stats before the first Count: %+v (DiskBytes is what Count measured)", s)
	}
	c := countOf(t, a)
	if c.Succeeded != 1 || c.Pending != 1 || c.Abandoned != 1 || c.LiveEpochs != 1 {
		t.Fatalf("counts: %+v", c)
	}
	s := a.Stats()
	if s.DiskBytes == 0 || s.EpochWidth != time.Hour || s.Commits != 1 {
		t.Fatalf("stats: %+v", s)
	}
	clk.Advance(9 * time.Hour)
	if c := countOf(t, a); c.Expired != 2 || c.Succeeded != 0 || c.Pending != 0 {
		t.Fatalf("counts after retention: %+v", c)
	}
	_ = l2
}

// Options that cannot work are refused, and so is a bad schema name; nothing is created.
func TestOpenRefusesBadOptions(t *testing.T) {
	d := newTestDB(t)
	for name, o := range map[string]Options{
		"LeaseTTL": {Options: receipts.Options{LeaseTTL: 2 * time.Hour, Retention: time.Hour}},
	} {
		if _, _, err := d.tryOpenDB(o); !errors.Is(err, receipts.ErrInvalidOptions) {
			t.Errorf("%s: %v", name, err)
		}
	}
	pool, err := pgxpool.New(bg, d.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := Open(bg, pool, &Options{Schema: "Bad-Name"}); !errors.Is(err, receipts.ErrInvalidOptions) {
		t.Errorf("bad schema name: %v", err)
	}
	if _, err := Open(bg, nil, nil); !errors.Is(err, receipts.ErrInvalidOptions) {
		t.Errorf("nil pool: %v", err)
	}
	// A TombstoneWindow of more epochs than a lookup may probe is refused before the
	// schema is created.
	if _, _, err := d.tryOpenDB(Options{Options: receipts.Options{Retention: time.Hour,
		TombstoneWindow: receipts.MaxTombstoneEpochs*time.Hour/4 + 1}}); !errors.Is(err, receipts.ErrInvalidOptions) {
		t.Errorf("TombstoneWindow: %v", err)
	}
	var n int
	if err := pool.QueryRow(bg, `SELECT count(*) FROM pg_namespace WHERE nspname = $1`, d.schema).Scan(&n); err != nil || n != 0 {
		t.Fatalf("schema created by a refused open: %d %v", n, err)
	}
}

// An existing schema whose stored epoch width is too narrow for a longer Retention given now
// is refused with ErrInvalidOptions (Config.CheckWidth) and left as it is: before the check,
// the open went through and recorded the new Retention in meta.
func TestOpenChecksStoredWidth(t *testing.T) {
	d := newTestDB(t)
	db, pool := d.openDB(Options{Options: receipts.Options{Retention: time.Hour, EpochWidth: 4 * time.Second}})
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	// 4s is narrower than 24h/1024
	_, _, err := d.tryOpenDB(Options{Options: receipts.Options{Retention: 24 * time.Hour}})
	if !errors.Is(err, receipts.ErrInvalidOptions) {
		t.Fatalf("open with a longer Retention over a narrow stored width: %v", err)
	}
	var ret int64
	if err := pool.QueryRow(bg, `SELECT retention_us FROM `+buildQueries(d.schema, false, false, 1).schema+`.meta`).Scan(&ret); err != nil || ret != time.Hour.Microseconds() {
		t.Fatalf("meta changed by a refused open: retention %d µs, %v", ret, err)
	}
}

// Once Config.Closing reports true the engine hands out no lease (driver.ErrClosed), in Claim and
// in DoTx's claim alike; fenced writes of a lease already held go on.
func TestClaimAfterClosingBegan(t *testing.T) {
	d := newTestDB(t)
	var closing atomic.Bool
	e := d.open(engineOptions{Closing: closing.Load})
	held := mustClaim(t, e.engine, req(key("held"), "fp"), driver.Claimed)
	closing.Store(true)
	if _, err := e.Claim(bg, req(key("new"), "fp")); !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("claim after Closing: %v", err)
	}
	if _, _, err := e.claimTx(bg, req(key("new"), "fp"), newNonce()); !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("claim in a transaction after Closing: %v", err)
	}
	if _, found, _, err := e.Lookup(bg, key("new")); err != nil || found {
		t.Fatalf("a claim was written: %v %v", found, err)
	}
	if _, err := e.Finish(bg, key("held"), held.Record.Token, driver.Succeeded, []byte("ok")); err != nil {
		t.Fatalf("commit of a held lease after Closing: %v", err)
	}
}

// A claim that was admitted before Close began but decided after (Closing reports false when
// the claim starts and true once its statement has answered) writes nothing and answers
// ErrClosed, in Claim and in DoTx's claim alike (issue 12 item 5). The gate is asked after the
// claim's time was taken: a claim is refused if Close began at any point before it would be
// handed out.
func TestClaimDecidedAfterClosingBegan(t *testing.T) {
	d := newTestDB(t)
	var calls atomic.Int64
	flipAt := int64(1 << 62)
	// false until flipAt calls have been made, true from then on
	closing := func() bool { return calls.Add(1) > atomic.LoadInt64(&flipAt) }
	e := d.open(engineOptions{Closing: closing})
	mustClaim(t, e.engine, req(key("before"), "fp"), driver.Claimed)

	for _, k := range []driver.Key{key("fresh"), key("taken-over")} {
		if k == key("taken-over") {
			l := mustClaim(t, e.engine, req(k, "fp"), driver.Claimed)
			if err := e.Abandon(bg, k, l.Record.Token); err != nil {
				t.Fatal(err)
			}
		}
		before, _, _, err := e.Lookup(bg, k)
		if err != nil {
			t.Fatal(err)
		}
		calls.Store(0)
		atomic.StoreInt64(&flipAt, 1) // the check before the statement passes, the one after it does not
		if _, err := e.Claim(bg, req(k, "fp")); !errors.Is(err, driver.ErrClosed) {
			t.Fatalf("%s: claim decided after Close began: %v", k, err)
		}
		calls.Store(0)
		if _, _, err := e.claimTx(bg, req(k, "fp"), newNonce()); !errors.Is(err, driver.ErrClosed) {
			t.Fatalf("%s: claim in a transaction decided after Close began: %v", k, err)
		}
		atomic.StoreInt64(&flipAt, 1<<62)
		after, found, _, err := e.Lookup(bg, k)
		if err != nil || (k == key("fresh") && found) || after.Token != before.Token || after.Attempts != before.Attempts {
			t.Fatalf("%s: a refused claim wrote: before %+v, after %+v (found %v, %v)", k, before, after, found, err)
		}
	}
}

// Retention and LeaseTTL left zero take the values the schema records (as on Pebble), so a
// node started without them, or receiptctl, sees what the service sees; given ones are
// recorded. Before meta recorded LeaseTTL, a reopen with zero options ran on the defaults.
func TestOpenUsesRecordedSettings(t *testing.T) {
	d := newTestDB(t)
	first, pool := d.openDB(Options{Options: receipts.Options{Retention: 8 * time.Hour, LeaseTTL: time.Minute}})
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	db, _ := d.openDB(Options{})
	if o := db.Options(); o.Retention != 8*time.Hour || o.LeaseTTL != time.Minute || o.EpochWidth != 2*time.Hour {
		t.Fatalf("reopened with zero options: Retention %s LeaseTTL %s EpochWidth %s", o.Retention, o.LeaseTTL, o.EpochWidth)
	}
	if s := db.Stats(); s.Retention != 8*time.Hour || s.LeaseTTL != time.Minute {
		t.Fatalf("stats: %+v", s)
	}
	_ = db.Close()
	db, _ = d.openDB(Options{Options: receipts.Options{LeaseTTL: 2 * time.Minute}})
	if o := db.Options(); o.Retention != 8*time.Hour || o.LeaseTTL != 2*time.Minute {
		t.Fatalf("reopened with LeaseTTL 2m: %s %s", o.Retention, o.LeaseTTL)
	}
	var ret, ttl int64
	if err := pool.QueryRow(bg, `SELECT retention_us, lease_ttl_us FROM `+buildQueries(d.schema, false, false, 1).schema+`.meta`).Scan(&ret, &ttl); err != nil ||
		ret != (8*time.Hour).Microseconds() || ttl != (2*time.Minute).Microseconds() {
		t.Fatalf("meta: %d %d %v", ret, ttl, err)
	}
	// a recorded LeaseTTL that the Retention given now does not allow is refused
	if _, _, err := d.tryOpenDB(Options{Options: receipts.Options{Retention: time.Minute}}); !errors.Is(err, receipts.ErrInvalidOptions) {
		t.Fatalf("Retention 1m over a recorded LeaseTTL of 2m: %v", err)
	}
}

// countOf is db.Count, which must not fail.
func countOf(t testing.TB, db *receipts.DB) receipts.Counts {
	t.Helper()
	c, err := db.Count(bg)
	if err != nil {
		t.Fatalf("Count: %v", err)
	}
	return c
}
