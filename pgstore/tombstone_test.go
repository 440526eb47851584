package pgstore

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/internal/pgtest"
)

// tombOpts are the engine options of the tombstone tests: Retention 4h in epochs of 1h,
// tombstones for 12h after it.
func tombOpts(clk func() time.Time) engineOptions {
	return engineOptions{Now: clk, Retention: 4 * time.Hour, EpochWidth: time.Hour, TombstoneWindow: 12 * time.Hour}
}

// finishKey claims and finishes k (Succeeded, result r).
func finishKey(t *testing.T, e *engine, k driver.Key, r string) driver.Record {
	t.Helper()
	c := mustClaim(t, e, req(k, "fp"), driver.Claimed)
	rec, err := e.Finish(bg, k, c.Record.Token, driver.Succeeded, []byte(r))
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// markerCount is the number of markers rows (all partitions).
func (n *node) markerCount(t *testing.T) int {
	t.Helper()
	var c int
	if err := n.pool.QueryRow(bg, `SELECT count(*) FROM `+n.q.schema+`.markers`).Scan(&c); err != nil {
		t.Fatal(err)
	}
	return c
}

// A format-1 schema (before tombstones) is migrated to format 2 by Open: meta records the
// window, records get the reserved meta column, the markers family gets a partition beside
// every records partition, and, with tombstones on, every record its marker, so a receipt
// written before the upgrade is protected past its retention too. With tombstones off, the
// migration writes no marker.
func TestTombstoneMigrateFormat1(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprintf("tombstones=%v", on), func(t *testing.T) {
			clk := newClock()
			d := newTestDB(t)
			o := tombOpts(clk.Now)
			o.TombstoneWindow = -1
			old := d.open(o)
			k := key("before-upgrade")
			rec := finishKey(t, old.engine, k, "paid")
			mustClaim(t, old.engine, req(key("pending"), "fp"), driver.Claimed)
			_ = old.Close()
			// back to format 1, as a version before tombstones wrote it
			for _, s := range []string{
				`DROP TABLE ` + old.q.schema + `.markers`,
				`ALTER TABLE ` + old.q.schema + `.records DROP COLUMN meta`,
				`ALTER TABLE ` + old.q.schema + `.meta DROP COLUMN tombstone_window_us`,
				`UPDATE ` + old.q.schema + `.meta SET format = 1`,
			} {
				if _, err := old.pool.Exec(bg, s); err != nil {
					t.Fatal(err)
				}
			}
			o.TombstoneWindow = 0 // the default: 7 × Retention for a store that records none
			if !on {
				o.TombstoneWindow = -1
			}
			e := d.open(o)
			var format int
			var win *int64
			if err := e.pool.QueryRow(bg, `SELECT format, tombstone_window_us FROM `+e.q.schema+`.meta`).Scan(&format, &win); err != nil {
				t.Fatal(err)
			}
			wantWin := int64(-1)
			if on {
				wantWin = (7 * 4 * time.Hour).Microseconds()
			}
			if format != formatVersion || win == nil || *win != wantWin {
				t.Fatalf("after the migration: format %d, window %v (want %d, %d)", format, win, formatVersion, wantWin)
			}
			if _, err := e.pool.Exec(bg, `SELECT meta FROM `+e.q.schema+`.records LIMIT 1`); err != nil {
				t.Fatalf("records.meta: %v", err)
			}
			want := 0
			if on {
				want = 2 // the finished record and the pending claim
			}
			if n := e.markerCount(t); n != want {
				t.Fatalf("%d markers after the migration, want %d", n, want)
			}
			mustClaim(t, e.engine, req(k, "fp"), driver.Replay)
			clk.Set(rec.ExpiresAt)
			if on {
				res := mustClaim(t, e.engine, req(k, "another"), driver.Expired)
				if !res.Record.UpdatedAt.Equal(rec.UpdatedAt) {
					t.Fatalf("tombstone of %v: used at %v, want %v", k, res.Record.UpdatedAt, rec.UpdatedAt)
				}
				mustClaim(t, e.engine, req(key("pending"), "fp"), driver.Expired)
			} else {
				mustClaim(t, e.engine, req(k, "another"), driver.Claimed)
			}
		})
	}
}

// GC writes the markers of a records partition it drops (one INSERT … SELECT: as many markers
// as receipts, the same statements for 10,000 and 100,000), and drops markers by whole
// partitions once Retention + TombstoneWindow has passed: the same statements and about the
// same WAL for 10,000 and for 100,000 expired receipts (a row-by-row purge would write WAL for
// every marker). It also reports the bytes a marker takes and what the copy cost.
func TestTombstoneGCByPartition(t *testing.T) {
	type pass struct {
		writes, dropped int
		wal             int64
	}
	run := func(n int) pass {
		clk := newClock()
		e := newTestDB(t).open(tombOpts(clk.Now))
		cur := e.epochOf(clk.Now())
		// n finished receipts in the current epoch, as the engine writes them (no marker;
		// the rows come in bulk)
		if _, err := e.pool.Exec(bg, `INSERT INTO `+e.q.schema+`.records
SELECT 's'::bytea, ('m' || g)::bytea, $1::bigint, 2, 'fp', nextval('`+e.q.schema+`.token_seq'), 1, 'n', $2::timestamptz, $2::timestamptz, NULL, 'x'
  FROM generate_series(1, $3::int) g`, cur, clk.Now(), n); err != nil {
			t.Fatal(err)
		}
		// past retention: the records go, GC writes their markers first
		clk.Advance(4*time.Hour + time.Hour)
		var walBefore, walAfter int64
		if err := e.pool.QueryRow(bg, `SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn`).Scan(&walBefore); err != nil {
			t.Fatal(err)
		}
		st, err := e.GC(bg)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.pool.QueryRow(bg, `SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn`).Scan(&walAfter); err != nil {
			t.Fatal(err)
		}
		if st.EpochsDropped == 0 || st.TombstoneEpochsDropped != 0 || st.MarkersWritten != n {
			t.Fatalf("GC past retention: %+v, want %d markers written", st, n)
		}
		var bytes int64
		if err := e.pool.QueryRow(bg, `SELECT pg_total_relation_size($1::regclass)`, e.o.Schema+"."+partName(famMarkers, e.markerEpoch(cur))).Scan(&bytes); err != nil {
			t.Fatal(err)
		}
		t.Logf("%d markers: %d bytes in their partition (%.0f bytes per marker, index included); GC past retention wrote them in %v with %d bytes of WAL (%.0f per receipt), %d statements",
			n, bytes, float64(bytes)/float64(n), st.Duration, walAfter-walBefore, float64(walAfter-walBefore)/float64(n), st.Writes)
		mustClaim(t, e.engine, req(key("m1"), "fp"), driver.Expired)
		mustClaim(t, e.engine, req(key(fmt.Sprintf("m%d", n)), "other"), driver.Expired)
		// past the window (and the end of the markers partition, which spans several
		// epochs): the markers' partition goes in one DETACH and one DROP
		clk.Advance(12*time.Hour + time.Duration(e.mwidth)*time.Microsecond)
		var before int64
		if err := e.pool.QueryRow(bg, `SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn`).Scan(&before); err != nil {
			t.Fatal(err)
		}
		st, err = e.GC(bg)
		if err != nil {
			t.Fatal(err)
		}
		var after int64
		if err := e.pool.QueryRow(bg, `SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn`).Scan(&after); err != nil {
			t.Fatal(err)
		}
		if st.TombstoneEpochsDropped == 0 {
			t.Fatalf("GC past the window dropped no markers partition: %+v", st)
		}
		if n := e.markerCount(t); n != 0 {
			t.Fatalf("%d markers left past the window", n)
		}
		mustClaim(t, e.engine, req(key("m1"), "fp"), driver.Claimed) // a new action now
		t.Logf("%d expired receipts: GC past the window %+v, %d bytes of WAL", n, st, after-before)
		return pass{st.Writes, st.EpochsDropped + st.TombstoneEpochsDropped, after - before}
	}
	small, large := run(10000), run(100000)
	if large.writes != small.writes || large.dropped != small.dropped {
		t.Fatalf("GC statements grow with the markers: %+v at 10,000, %+v at 100,000", small, large)
	}
	if large.wal > 2*small.wal+128<<10 {
		t.Fatalf("GC's WAL grows with the markers: %d bytes at 10,000, %d at 100,000", small.wal, large.wal)
	}
}

// A tombstone survives a crash of the server (pg_ctl restart -m immediate): the marker was
// committed with the receipt.
func TestTombstoneSurvivesServerRestart(t *testing.T) {
	clk := newClock()
	d := newTestDB(t)
	e := d.open(tombOpts(clk.Now))
	k := key("paid")
	rec := finishKey(t, e.engine, k, "ok")
	if err := pgtest.Restart(t); errors.Is(err, pgtest.ErrExternal) {
		t.Skip(err)
	} else if err != nil {
		t.Fatal(err)
	}
	clk.Set(rec.ExpiresAt.Add(time.Minute))
	res := mustClaim(t, e.engine, req(k, "fp"), driver.Expired)
	if !res.Record.ExpiresAt.Equal(rec.ExpiresAt) {
		t.Fatalf("tombstone expired at %v, want %v", res.Record.ExpiresAt, rec.ExpiresAt)
	}
	tb, found, err := e.Tombstone(bg, k)
	if err != nil || !found || !tb.Until.Equal(rec.ExpiresAt.Add(12*time.Hour)) {
		t.Fatalf("Tombstone: %+v %v %v", tb, found, err)
	}
}

// Every claim path checks the markers: the gated first claim (the fresh insert), the claim
// statement (a key with an expired record still in a live partition, and one whose records
// partition GC has dropped), and DoTx's claim in the caller's transaction; none of them
// writes anything for a tombstoned key.
func TestTombstoneEveryClaimPath(t *testing.T) {
	clk := newClock()
	e := newTestDB(t).open(tombOpts(clk.Now))
	k, crashed := key("k"), key("crashed")
	rec := finishKey(t, e.engine, k, "ok")
	// a claim whose holder died: never finished, never renewed (only the claim's marker)
	mustClaim(t, e.engine, req(crashed, "fp"), driver.Claimed)
	clk.Set(rec.ExpiresAt) // expired, its record still in a live partition
	mustClaim(t, e.engine, req(k, "fp"), driver.Expired)
	tx, res, err := e.claimTx(bg, req(k, "other"), newNonce())
	if err != nil || tx != nil || res.Outcome != driver.Expired {
		t.Fatalf("claimTx of a tombstoned key: %v %+v %v", tx, res, err)
	}
	clk.Advance(2 * time.Hour) // its records partition is dead now
	if st, err := e.GC(bg); err != nil || st.EpochsDropped == 0 {
		t.Fatalf("GC: %+v %v", st, err)
	}
	var recs int
	if err := e.pool.QueryRow(bg, `SELECT count(*) FROM `+e.q.schema+`.records`).Scan(&recs); err != nil || recs != 0 {
		t.Fatalf("records left: %d %v", recs, err)
	}
	row, got, err := e.claimFresh(bg, e.pool, req(k, "fp"), newNonce(), true)
	if err != nil || got != freshNone {
		t.Fatalf("the fresh insert claimed a tombstoned key: %+v %v %v", row, got, err)
	}
	mustClaim(t, e.engine, req(k, "fp"), driver.Expired)
	mustClaim(t, e.engine, req(crashed, "fp"), driver.Expired)
	if err := e.pool.QueryRow(bg, `SELECT count(*) FROM `+e.q.schema+`.records`).Scan(&recs); err != nil || recs != 0 {
		t.Fatalf("a tombstoned claim wrote %d records (%v)", recs, err)
	}
	// the window ends exactly at the last write + Retention + TombstoneWindow
	clk.Set(rec.UpdatedAt.Add(16*time.Hour - time.Microsecond))
	mustClaim(t, e.engine, req(k, "fp"), driver.Expired)
	clk.Set(rec.UpdatedAt.Add(16 * time.Hour))
	mustClaim(t, e.engine, req(k, "fp"), driver.Claimed)
}

// No write writes a marker: a record past Retention is its own tombstone, from its last
// write, as long as its partition stands (below the live partitions too: the claim, the fresh
// insert, Tombstone and ScanTombstones all find it there), and GC, before it drops the
// partition, writes its marker holding that last write (a renew into the next markers
// partition and a finish later), so the tombstone runs from the finish either way.
func TestTombstoneRecordIsItsOwnTombstone(t *testing.T) {
	clk := newClock()
	e := newTestDB(t).open(tombOpts(clk.Now))
	k := key("renewed")
	markers := func() (n int, newest *time.Time) {
		t.Helper()
		if err := e.pool.QueryRow(bg, `SELECT count(*), max(used_at) FROM `+e.q.schema+`.markers`).Scan(&n, &newest); err != nil {
			t.Fatal(err)
		}
		return n, newest
	}
	c := mustClaim(t, e.engine, req(k, "fp"), driver.Claimed)
	// markers partitions span 4 epochs here ((4h + 12h) / (4 × 1h)): renew into the next one
	rec := c.Record
	var err error
	for i := 0; i < 2; i++ {
		clk.Advance(3 * time.Hour)
		if rec, err = e.Renew(bg, k, c.Record.Token, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	if e.markerEpoch(floorDiv(rec.UpdatedAt.UnixMicro(), e.width)) == e.markerEpoch(floorDiv(c.Record.UpdatedAt.UnixMicro(), e.width)) {
		t.Fatal("the renews stayed in the claim's markers partition")
	}
	clk.Advance(time.Minute)
	if rec, err = e.Finish(bg, k, c.Record.Token, driver.Succeeded, []byte("ok")); err != nil {
		t.Fatal(err)
	}
	if n, _ := markers(); n != 0 {
		t.Fatalf("the claim, renews and finish wrote %d markers", n)
	}
	// past retention, its records partition below the live ones but not dropped yet
	clk.Set(rec.ExpiresAt.Add(3 * time.Hour))
	if ep := floorDiv(rec.UpdatedAt.UnixMicro(), e.width); ep >= e.oldest() {
		t.Fatalf("the record's epoch %d is still live (oldest %d)", ep, e.oldest())
	}
	check := func(when string) {
		t.Helper()
		res := mustClaim(t, e.engine, req(k, "other"), driver.Expired)
		if !res.Record.ExpiresAt.Equal(rec.ExpiresAt) {
			t.Fatalf("%s: tombstone of a record that expired at %v: %v", when, rec.ExpiresAt, res.Record.ExpiresAt)
		}
		if row, got, err := e.claimFresh(bg, e.pool, req(k, "fp"), newNonce(), true); err != nil || got != freshNone {
			t.Fatalf("%s: the fresh insert claimed a tombstoned key: %+v %v %v", when, row, got, err)
		}
		if tb, found, err := e.Tombstone(bg, k); err != nil || !found || !tb.UsedAt.Equal(rec.UpdatedAt) {
			t.Fatalf("%s: Tombstone: %+v %v %v", when, tb, found, err)
		}
		var listed []driver.Tombstone
		for tb, err := range e.ScanTombstones(bg, "", 0) {
			if err != nil {
				t.Fatal(err)
			}
			listed = append(listed, tb)
		}
		if len(listed) != 1 || listed[0].Key != k || !listed[0].UsedAt.Equal(rec.UpdatedAt) {
			t.Fatalf("%s: ScanTombstones: %+v", when, listed)
		}
	}
	check("before GC")
	st, err := e.GC(bg)
	if err != nil || st.EpochsDropped == 0 || st.MarkersWritten != 1 {
		t.Fatalf("GC: %+v %v", st, err)
	}
	if n, newest := markers(); n != 1 || newest == nil || !newest.Equal(rec.UpdatedAt) {
		t.Fatalf("after GC: %d markers, newest %v, want 1 at %v", n, newest, rec.UpdatedAt)
	}
	check("after GC")
	clk.Set(rec.UpdatedAt.Add(16*time.Hour - time.Microsecond))
	mustClaim(t, e.engine, req(k, "fp"), driver.Expired)
	clk.Set(rec.UpdatedAt.Add(16 * time.Hour))
	mustClaim(t, e.engine, req(k, "fp"), driver.Claimed)
}

// A crash of the server between GC's copy of a partition's markers and its DETACH leaves
// both: a late retry is refused after the restart, and after the GC pass that drops the
// partition (and another dead partition, whose markers that pass copies itself); a key
// released by its first attempt has neither, and is free.
func TestTombstoneGCCrashBetweenCopyAndDrop(t *testing.T) {
	clk := newClock()
	d := newTestDB(t)
	e := d.open(tombOpts(clk.Now))
	k, later, released := key("paid"), key("paid-later"), key("released")
	rec := finishKey(t, e.engine, k, "ok")
	c := mustClaim(t, e.engine, req(released, "fp"), driver.Claimed)
	if err := e.Release(bg, released, c.Record.Token, false); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Hour)
	recLater := finishKey(t, e.engine, later, "ok")
	clk.Set(recLater.ExpiresAt.Add(3 * time.Hour)) // both records partitions are dead now
	parts, err := e.partitions(bg)
	if err != nil {
		t.Fatal(err)
	}
	ep := floorDiv(rec.UpdatedAt.UnixMicro(), e.width)
	copied := false
	for _, p := range parts {
		if p.family == famRecords && p.epoch == ep {
			n, err := e.copyMarkers(bg, p, e.o.Retention+e.o.TombstoneWindow)
			if err != nil || n != 1 {
				t.Fatalf("copy of %s's markers: %d %v", p.name, n, err)
			}
			copied = true
		}
	}
	if !copied {
		t.Fatalf("no records partition of epoch %d in %+v", ep, parts)
	}
	if err := pgtest.Restart(t); errors.Is(err, pgtest.ErrExternal) {
		t.Skip(err)
	} else if err != nil {
		t.Fatal(err)
	}
	refused := func(when string) {
		t.Helper()
		for _, c := range []struct {
			k   driver.Key
			rec driver.Record
		}{{k, rec}, {later, recLater}} {
			for _, fp := range []string{"fp", "other"} {
				if res := mustClaim(t, e.engine, req(c.k, fp), driver.Expired); !res.Record.ExpiresAt.Equal(c.rec.ExpiresAt) {
					t.Fatalf("%s: %v: tombstone expired at %v, want %v", when, c.k, res.Record.ExpiresAt, c.rec.ExpiresAt)
				}
			}
		}
	}
	refused("after the crash")
	st, err := e.GC(bg)
	if err != nil || st.EpochsDropped == 0 {
		t.Fatalf("GC: %+v %v", st, err)
	}
	var recs int
	if err := e.pool.QueryRow(bg, `SELECT count(*) FROM `+e.q.schema+`.records`).Scan(&recs); err != nil || recs != 0 {
		t.Fatalf("records left: %d %v", recs, err)
	}
	refused("after GC dropped the partition")
	if n := e.markerCount(t); n != 2 {
		t.Fatalf("%d markers, want the two paid keys'", n)
	}
	mustClaim(t, e.engine, req(released, "fp"), driver.Claimed)
}

// A format-2 store (whose writes wrote a marker beside every record) is opened as format 3,
// with nothing else changed, and its markers stay in force: a key whose records partition a
// format-2 GC dropped is still refused from its marker, and a key with both its expired
// record and its marker is listed once by ScanTombstones.
func TestTombstoneFormat2Markers(t *testing.T) {
	clk := newClock()
	d := newTestDB(t)
	o := tombOpts(clk.Now)
	old := d.open(o)
	gone, both := key("gone"), key("both")
	recGone := finishKey(t, old.engine, gone, "a")
	recBoth := finishKey(t, old.engine, both, "b")
	s := old.q.schema
	_ = old.Close()
	// as format 2 left them: a marker beside every record, and gone's record dropped by GC
	for _, st := range []string{
		`INSERT INTO ` + s + `.markers SELECT scope, id, ` + markerEpochSQL("epoch", old.mwidth/old.width) + `, updated_at FROM ` + s + `.records`,
		`DELETE FROM ` + s + `.records WHERE id = 'gone'`,
		`UPDATE ` + s + `.meta SET format = 2`,
	} {
		if _, err := old.pool.Exec(bg, st); err != nil {
			t.Fatal(err)
		}
	}
	e := d.open(o)
	var format int
	if err := e.pool.QueryRow(bg, `SELECT format FROM `+s+`.meta`).Scan(&format); err != nil || format != formatVersion {
		t.Fatalf("format %d after the open (%v), want %d", format, err, formatVersion)
	}
	if n := e.markerCount(t); n != 2 {
		t.Fatalf("%d markers after the open, want 2", n)
	}
	clk.Set(recBoth.ExpiresAt.Add(time.Minute))
	for _, c := range []struct {
		k   driver.Key
		rec driver.Record
	}{{gone, recGone}, {both, recBoth}} {
		if res := mustClaim(t, e.engine, req(c.k, "other"), driver.Expired); !res.Record.UpdatedAt.Equal(c.rec.UpdatedAt) {
			t.Fatalf("%v: tombstone used at %v, want %v", c.k, res.Record.UpdatedAt, c.rec.UpdatedAt)
		}
	}
	n := 0
	for tb, err := range e.ScanTombstones(bg, "", 0) {
		if err != nil {
			t.Fatal(err)
		}
		n++
		if tb.Key != gone && tb.Key != both {
			t.Fatalf("listed %+v", tb)
		}
	}
	if n != 2 {
		t.Fatalf("ScanTombstones listed %d tombstones, want 2 (one per key)", n)
	}
}
