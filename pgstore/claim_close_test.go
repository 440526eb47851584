package pgstore

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/receiptstore/receipts/driver"
)

// A first claim commits in the round trip that decides it (claimGated's oneTrip), before the
// closing gate is read. Whichever check Close begins at (flip: the number of Closing calls that
// still answer false), and also when that batch's reply is lost and the retry finds the claim
// as its own: a Claim that answers a lease never saw Closing report true, and one that answers
// ErrClosed left no record behind. Without the undo (undoFresh) a refused claim stays Pending;
// without the gate after the commit, a lease is handed out after Close began.
func TestClaimOneTripClosingRace(t *testing.T) {
	d := newTestDB(t)
	var calls, flipAt atomic.Int64
	var saidTrue atomic.Bool
	flipAt.Store(1 << 62)
	closing := func() bool {
		if calls.Add(1) > flipAt.Load() {
			saidTrue.Store(true)
			return true
		}
		return false
	}
	e := d.open(engineOptions{Closing: closing})
	refused := 0
	for _, loseFirst := range []bool{false, true} {
		for flip := int64(0); flip <= 6; flip++ {
			k := key(fmt.Sprintf("race-%v-%d", loseFirst, flip))
			lose := 0
			if loseFirst {
				lose = 1
			}
			e.testLoseReply = func() error {
				if lose > 0 {
					lose--
					return errLostReply
				}
				return nil
			}
			calls.Store(0)
			saidTrue.Store(false)
			flipAt.Store(flip)
			res, err := e.Claim(bg, req(k, "fp"))
			flipAt.Store(1 << 62)
			e.testLoseReply = nil
			_, found, _, lerr := e.Lookup(bg, k)
			if lerr != nil {
				t.Fatal(lerr)
			}
			switch {
			case err == nil:
				if res.Outcome != driver.Claimed || saidTrue.Load() {
					t.Fatalf("%s: %v after Closing reported true: %v", k, res.Outcome, saidTrue.Load())
				}
				if !found {
					t.Fatalf("%s: a lease with no record", k)
				}
			case errors.Is(err, driver.ErrClosed):
				refused++
				if found {
					t.Fatalf("%s: refused claim left a record", k)
				}
			default:
				t.Fatalf("%s: %v", k, err)
			}
		}
	}
	if refused == 0 {
		t.Fatal("no claim was refused")
	}

	// Close begins while the one-trip batch's reply is lost: the batch committed the claim, the
	// retry finds it as its own (nonce) and must not hand it out, nor leave it behind.
	var began atomic.Bool
	c := d.open(engineOptions{Closing: began.Load})
	k := key("race-lost-reply")
	c.testLoseReply = func() error {
		if began.CompareAndSwap(false, true) {
			return errLostReply
		}
		return nil
	}
	if res, err := c.Claim(bg, req(k, "fp")); !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("claim whose reply was lost as Close began: %+v %v", res, err)
	}
	c.testLoseReply = nil
	if _, found, _, err := c.Lookup(bg, k); err != nil || found {
		t.Fatalf("refused claim left a record: %v %v", found, err)
	}
}
