package pgstore

import (
	"bytes"
	"testing"
	"time"

	"github.com/receiptstore/receipts/driver"
)

func TestClaimOutcomes(t *testing.T) {
	clk := newClock()
	e := newTestDB(t).open(engineOptions{Now: clk.Now, Retention: 24 * time.Hour})
	k := key("a")

	c := mustClaim(t, e.engine, req(k, "fp1"), driver.Claimed)
	if c.Record.Attempts != 1 || c.Record.Token == 0 || c.Record.State != driver.Pending {
		t.Fatalf("claimed record %+v", c.Record)
	}
	if !c.Now.Equal(clk.Now()) || !c.Record.LeaseExpiresAt.Equal(clk.Now().Add(30*time.Second)) {
		t.Fatalf("times: now %v lease %v", c.Now, c.Record.LeaseExpiresAt)
	}
	ip := mustClaim(t, e.engine, req(k, "fp1"), driver.InProgress)
	if ip.Record.Token != c.Record.Token || !ip.Record.LeaseExpiresAt.Equal(c.Record.LeaseExpiresAt) {
		t.Fatalf("in progress record %+v", ip.Record)
	}
	mustClaim(t, e.engine, req(k, "fp2"), driver.Mismatch)

	fin, err := e.Finish(bg, k, c.Record.Token, driver.Succeeded, []byte("result"))
	if err != nil {
		t.Fatal(err)
	}
	if fin.State != driver.Succeeded || string(fin.Result) != "result" || !fin.LeaseExpiresAt.IsZero() {
		t.Fatalf("finished %+v", fin)
	}
	rp := mustClaim(t, e.engine, req(k, "fp1"), driver.Replay)
	if string(rp.Record.Result) != "result" || rp.Record.Token != c.Record.Token || rp.Record.State != driver.Succeeded {
		t.Fatalf("replay %+v", rp.Record)
	}
	mustClaim(t, e.engine, req(k, "fp2"), driver.Mismatch)

	// an empty result is replayed as empty, not nil
	k2 := key("empty")
	c2 := mustClaim(t, e.engine, req(k2, "x"), driver.Claimed)
	if _, err := e.Finish(bg, k2, c2.Record.Token, driver.Failed, nil); err != nil {
		t.Fatal(err)
	}
	rp2 := mustClaim(t, e.engine, req(k2, "x"), driver.Replay)
	if rp2.Record.Result == nil || len(rp2.Record.Result) != 0 || rp2.Record.State != driver.Failed {
		t.Fatalf("empty result replay %+v", rp2.Record)
	}

	rec, found, _, err := e.Lookup(bg, k)
	if err != nil || !found || !bytes.Equal(rec.Result, []byte("result")) {
		t.Fatalf("lookup %+v %v %v", rec, found, err)
	}
	if _, found, _, err := e.Lookup(bg, key("none")); err != nil || found {
		t.Fatalf("lookup absent: %v %v", found, err)
	}
}

// A claim whose reply was lost is retried with its nonce and recognised as ours: the same
// lease comes back, not InProgress.
func TestClaimOwnNonceRetry(t *testing.T) {
	e := newTestDB(t).open(engineOptions{})
	k := key("lost")
	nonce := newNonce()
	first, err := e.claimOnce(bg, e.pool, req(k, "fp"), nonce)
	if err != nil || first.outcome != "claimed" {
		t.Fatalf("first: %+v %v", first, err)
	}
	again, err := e.claimOnce(bg, e.pool, req(k, "fp"), nonce)
	if err != nil || again.outcome != "own" || again.rec.Token != first.rec.Token {
		t.Fatalf("same nonce: %+v %v", again, err)
	}

	// Through Claim: the first reply is lost once, the internal retry finds its own claim.
	k2 := key("lost2")
	lose := 1
	e.testLoseReply = func() error {
		if lose > 0 {
			lose--
			return errLostReply
		}
		return nil
	}
	res := mustClaim(t, e.engine, req(k2, "fp"), driver.Claimed)
	e.testLoseReply = nil
	if lose != 0 || res.Record.Attempts != 1 {
		t.Fatalf("lose %d, record %+v", lose, res.Record)
	}
	// another caller is not us
	mustClaim(t, e.engine, req(k2, "fp"), driver.InProgress)
}

func TestClaimTakeoverAfterLeaseExpiry(t *testing.T) {
	clk := newClock()
	e := newTestDB(t).open(engineOptions{Now: clk.Now})
	k := key("t")
	c := mustClaim(t, e.engine, req(k, "fp"), driver.Claimed)
	clk.Advance(29 * time.Second)
	mustClaim(t, e.engine, req(k, "fp"), driver.InProgress)
	clk.Advance(time.Second) // lease ends exactly now: takeable
	to := mustClaim(t, e.engine, req(k, "fp"), driver.TookOver)
	if to.Record.Attempts != 2 || to.Record.Token <= c.Record.Token || !to.Record.CreatedAt.Equal(c.Record.CreatedAt) {
		t.Fatalf("took over %+v (first %+v)", to.Record, c.Record)
	}
	// the old holder is fenced out; a holder whose lease ran out but was not taken over is not
	if _, err := e.Finish(bg, k, c.Record.Token, driver.Succeeded, nil); !isLeaseLost(err) {
		t.Fatalf("stale finish: %v", err)
	}
	clk.Advance(time.Minute)
	if _, err := e.Finish(bg, k, to.Record.Token, driver.Succeeded, []byte("late")); err != nil {
		t.Fatalf("run-out but not taken over: %v", err)
	}
	mustClaim(t, e.engine, req(k, "fp"), driver.Replay)
}

func TestClaimAbandonThenTakeoverAtOnce(t *testing.T) {
	clk := newClock()
	e := newTestDB(t).open(engineOptions{Now: clk.Now})
	k := key("ab")
	c := mustClaim(t, e.engine, req(k, "fp"), driver.Claimed)
	if err := e.Abandon(bg, k, c.Record.Token); err != nil {
		t.Fatal(err)
	}
	// Abandoned: listed, and the next claim takes over at once (no clock advance)
	var listed []driver.Record
	for r, err := range e.Scan(bg, driver.Filter{Abandoned: true}) {
		if err != nil {
			t.Fatal(err)
		}
		listed = append(listed, r)
	}
	if len(listed) != 1 || listed[0].Key != k {
		t.Fatalf("abandoned scan: %+v", listed)
	}
	mustClaim(t, e.engine, req(k, "fp2"), driver.Mismatch)
	to := mustClaim(t, e.engine, req(k, "fp"), driver.TookOver)
	if to.Record.Attempts != 2 || to.Record.Token <= c.Record.Token {
		t.Fatalf("took over %+v", to.Record)
	}
}
