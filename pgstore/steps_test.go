package pgstore

import (
	"testing"
	"time"

	"github.com/receiptstore/receipts/driver"
)

// A schema of format 3 (no journal column) is brought to format 4 by Open: the column is
// added, a claim's journal is written and read back, a takeover carries it, and Release of a
// claim with a journal keeps it, abandoned.
func TestJournalMigrationAndRelease(t *testing.T) {
	clk := newClock()
	d := newTestDB(t)
	o := tombOpts(clk.Now)
	old := d.open(o)
	s := old.q.schema
	_ = old.Close()
	for _, st := range []string{
		`ALTER TABLE ` + s + `.records DROP COLUMN journal`,
		`UPDATE ` + s + `.meta SET format = 3`,
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
	k := key("j")
	res := mustClaim(t, e.engine, req(k, "fp"), driver.Claimed)
	tok := res.Record.Token
	if _, err := e.Journal(bg, k, tok, []byte("journal-1"), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Journal(bg, k, tok+1000, []byte("other"), nil); err == nil {
		t.Fatal("a journal written with another token")
	}
	rec, found, _, err := e.Lookup(bg, k)
	if err != nil || !found || string(rec.Journal) != "journal-1" {
		t.Fatalf("Lookup: %q %v %v", rec.Journal, found, err)
	}
	if err := e.Release(bg, k, tok, true); err != nil { // the root asks a claim with a journal to be kept
		t.Fatal(err)
	}
	clk.Advance(time.Second)
	res = mustClaim(t, e.engine, req(k, "fp"), driver.TookOver)
	if string(res.Record.Journal) != "journal-1" {
		t.Fatalf("the takeover carries journal %q", res.Record.Journal)
	}
	if _, err := e.Finish(bg, k, res.Record.Token, driver.Succeeded, []byte("r")); err != nil {
		t.Fatal(err)
	}
	if rec, _, _, err := e.Lookup(bg, k); err != nil || string(rec.Journal) != "journal-1" {
		t.Fatalf("after Finish: journal %q (%v)", rec.Journal, err)
	}
}
