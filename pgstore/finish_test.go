package pgstore

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/receiptstore/receipts/driver"
)

// Finish writes to the one partition where its lease's record was last written (finishIn),
// and decides as the parent's statement does: a lease whose row moved on (a Finish in a later
// epoch, a renewal in a later epoch, a takeover) is still finished, or still lost, through the
// parent; with tombstones on, no marker is written either way (GC writes them); and a reply
// lost after the aimed statement applied is recognised.
func TestFinishInOnePartition(t *testing.T) {
	for _, tc := range []struct {
		name  string
		tombs time.Duration
	}{{"tombstones", 0}, {"no-tombstones", -1}} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newClock()
			d := newTestDB(t)
			const width = 15 * time.Minute
			a := d.open(engineOptions{Now: clk.Now, Retention: time.Hour, EpochWidth: width, TombstoneWindow: tc.tombs})
			count := func(fam string, ep int64, k driver.Key, extra string, args ...any) (n int64) {
				t.Helper()
				sql := `SELECT count(*) FROM ` + a.q.schema + `.` + pgx.Identifier{partName(fam, ep)}.Sanitize() +
					` WHERE scope = $1 AND id = $2` + extra
				if err := a.pool.QueryRow(bg, sql, append([]any{[]byte(k.Scope), []byte(k.ID)}, args...)...).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			}
			// finish finishes k's lease and checks where the record and its marker are, and
			// whether the aimed statement wrote it.
			finish := func(k driver.Key, token uint64, result string, aimed bool) driver.Record {
				t.Helper()
				hits := a.finishInHits.Load()
				fin, err := a.Finish(bg, k, token, driver.Succeeded, []byte(result))
				if err != nil {
					t.Fatal(err)
				}
				if got := a.finishInHits.Load() - hits; got != map[bool]uint64{true: 1, false: 0}[aimed] {
					t.Fatalf("%s: %d finishes by the aimed statement, want aimed=%v", k.ID, got, aimed)
				}
				ep := a.epochOf(fin.UpdatedAt)
				if fin.State != driver.Succeeded || string(fin.Result) != result || fin.Token != token || count(famRecords, ep, k, ` AND state = 2`) != 1 {
					t.Fatalf("%s: finished %+v, not in partition %d", k.ID, fin, ep)
				}
				if tc.tombs >= 0 && count(famMarkers, a.markerEpoch(ep), k, ``) != 0 {
					t.Fatalf("%s: the finish wrote a marker in markers partition %d", k.ID, a.markerEpoch(ep))
				}
				if rp := mustClaim(t, a.engine, req(k, "fp"), driver.Replay); string(rp.Record.Result) != result {
					t.Fatalf("%s: replay %+v", k.ID, rp.Record)
				}
				return fin
			}
			toBoundary := func(before time.Duration) { // the clock to `before` ahead of the next epoch
				now := clk.Now().UnixMicro()
				next := (now/width.Microseconds() + 1) * width.Microseconds()
				clk.Advance(time.Duration(next-now)*time.Microsecond - before)
			}

			// in the claim's epoch: the aimed statement
			k := key("same-epoch")
			c := mustClaim(t, a.engine, req(k, "fp"), driver.Claimed)
			finish(k, c.Record.Token, "one", true)

			// the finish runs in the next epoch: the aimed statement matches nothing (the row
			// would leave its partition), the parent's moves it
			toBoundary(time.Second)
			k = key("next-epoch")
			c = mustClaim(t, a.engine, req(k, "fp"), driver.Claimed)
			clk.Advance(2 * time.Second)
			if fin := finish(k, c.Record.Token, "two", false); a.epochOf(fin.UpdatedAt) != a.epochOf(c.Record.UpdatedAt)+1 {
				t.Fatalf("the test's finish did not run in the next epoch")
			}

			// a renewal in the next epoch moves the row, and Finish aims at its new partition
			toBoundary(time.Second)
			k = key("renewed")
			c = mustClaim(t, a.engine, req(k, "fp"), driver.Claimed)
			clk.Advance(2 * time.Second)
			if _, err := a.Renew(bg, k, c.Record.Token, 30*time.Second); err != nil {
				t.Fatal(err)
			}
			finish(k, c.Record.Token, "three", true)

			// a lease taken over: the old holder's Finish is lost through both statements, and
			// nothing changes; the new holder's is aimed
			k = key("taken-over")
			c = mustClaim(t, a.engine, req(k, "fp"), driver.Claimed)
			clk.Advance(31 * time.Second)
			c2 := mustClaim(t, a.engine, req(k, "fp"), driver.TookOver)
			a.leases.put(c.Record.Token, a.epochOf(c2.Record.UpdatedAt)) // as if remembered where the row now is
			hits := a.finishInHits.Load()
			if _, err := a.Finish(bg, k, c.Record.Token, driver.Succeeded, []byte("old")); !errors.Is(err, driver.ErrLeaseLost) {
				t.Fatalf("finish of a lease taken over: %v", err)
			}
			if a.finishInHits.Load() != hits {
				t.Fatal("the aimed statement finished a lease taken over")
			}
			if cur, _, _, err := a.Lookup(bg, k); err != nil || cur.State != driver.Pending || cur.Token != c2.Record.Token {
				t.Fatalf("after the lost finish: %+v %v", cur, err)
			}
			finish(k, c2.Record.Token, "four", true)

			// the aimed statement's reply is lost after it applied: recognised as this finish
			k = key("lost-reply")
			c = mustClaim(t, a.engine, req(k, "fp"), driver.Claimed)
			lose := 1
			a.testLoseReply = func() error {
				if lose > 0 {
					lose--
					return errLostReply
				}
				return nil
			}
			finish(k, c.Record.Token, "five", true) // the aimed statement again: no row, and the verifying read finds this finish
			a.testLoseReply = nil
			if lose != 0 {
				t.Fatal("no reply was lost")
			}

			// a remembered epoch that is no longer live: the parent's statement, no error
			k = key("dead-epoch")
			c = mustClaim(t, a.engine, req(k, "fp"), driver.Claimed)
			a.leases.put(c.Record.Token, a.oldest()-2)
			finish(k, c.Record.Token, "six", false)
		})
	}
}
