package pgstore

import (
	"errors"
	"testing"
	"time"

	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/receiptstest"
)

// TestEpochHintBoundsFencedWrites: a lease's fenced writes search from the epoch before its
// record's (epochhint.go). Across epochs, with the clock moving on between the claim, a
// renewal (which moves the record to a newer partition) and the commit, each write finds
// the record; the bound follows the renewal; a lease whose write ended it is forgotten; a
// token the engine never handed out searches from the oldest live epoch. Under the
// pgepochhint mutation (the search starts above the record's epoch) the holder loses its own
// claim, and this test fails.
func TestEpochHintBoundsFencedWrites(t *testing.T) {
	const width = 15 * time.Minute
	clk := receiptstest.NewClock(time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC))
	d := newTestDB(t)
	e := d.open(engineOptions{Retention: 4 * time.Hour, EpochWidth: width, Now: clk.Now}).engine

	k := key("hinted")
	r := req(k, "fp")
	r.LeaseTTL = time.Hour
	res := mustClaim(t, e, r, driver.Claimed)
	tok := res.Record.Token
	ep := e.epochOf(res.Record.UpdatedAt)
	if got := e.epochs.low(tok, e.oldest()); got != max(e.oldest(), ep-1) {
		t.Fatalf("bound after the claim: %d, want %d (epoch %d, oldest %d)", got, max(e.oldest(), ep-1), ep, e.oldest())
	}
	if e.oldest() >= ep-1 {
		t.Fatalf("the test needs live epochs below the claim's: oldest %d, claim's %d", e.oldest(), ep)
	}

	clk.Advance(2 * width) // two epochs on: the renewal moves the record
	rec, err := e.Renew(bg, k, tok, time.Hour)
	if err != nil {
		t.Fatalf("renew: %v", err)
	}
	ep2 := e.epochOf(rec.UpdatedAt)
	if ep2 < ep+2 {
		t.Fatalf("the renewal wrote epoch %d, want %d or later", ep2, ep+2)
	}
	if got := e.epochs.low(tok, e.oldest()); got != ep2-1 {
		t.Fatalf("bound after the renewal: %d, want %d", got, ep2-1)
	}

	clk.Advance(width)
	if _, err := e.Finish(bg, k, tok, driver.Succeeded, []byte("r")); err != nil {
		t.Fatalf("finish after the renewal: %v", err)
	}
	if n := e.epochs.len(); n != 0 {
		t.Fatalf("%d tokens remembered after the lease ended", n)
	}
	if got, found, _, err := e.Lookup(bg, k); err != nil || !found || string(got.Result) != "r" {
		t.Fatalf("lookup: %+v, %v, %v", got, found, err)
	}

	// A second lease, finished without a renewal two epochs after its claim.
	k2 := key("hinted2")
	r2 := req(k2, "fp")
	r2.LeaseTTL = time.Hour
	res = mustClaim(t, e, r2, driver.Claimed)
	clk.Advance(2 * width)
	if _, err := e.Finish(bg, k2, res.Record.Token, driver.Succeeded, []byte("r2")); err != nil {
		t.Fatalf("finish two epochs after the claim: %v", err)
	}

	// A stale token: the lease is lost, and nothing is remembered for it.
	if _, err := e.Finish(bg, k2, res.Record.Token, driver.Succeeded, []byte("again")); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("second finish: %v, want ErrLeaseLost", err)
	}
	if got := e.epochs.low(12345, e.oldest()); got != e.oldest() {
		t.Fatalf("unknown token's bound %d, want the oldest live epoch %d", got, e.oldest())
	}
	if n := e.epochs.len(); n != 0 {
		t.Fatalf("%d tokens remembered", n)
	}
}

// TestEpochHintBounded: the hint holds at most epochHintCap tokens.
func TestEpochHintBounded(t *testing.T) {
	var h epochHint
	for tok := uint64(1); tok <= epochHintCap+100; tok++ {
		h.set(tok, 7)
	}
	if n := h.len(); n != epochHintCap {
		t.Fatalf("%d tokens, want %d", n, epochHintCap)
	}
	if got := h.low(epochHintCap+100, 3); got != 6 {
		t.Fatalf("low %d, want 6", got)
	}
	if got := h.low(epochHintCap+100, 9); got != 9 {
		t.Fatalf("low %d, want the oldest 9", got)
	}
}
