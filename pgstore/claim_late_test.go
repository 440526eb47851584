package pgstore

import (
	"testing"
	"time"

	"github.com/receiptstore/receipts/driver"
)

// A grant whose reply comes back late (here: the claim's reply is held back, as a slow or
// restarting server would) is renewed before Claim hands it out, so the caller starts its
// effect with a whole lease ahead. Before, the lease handed out had only what was left of
// the TTL from the moment the claim decided.
func TestLateGrantIsRenewed(t *testing.T) {
	e := newTestDB(t).open(engineOptions{}) // the database's clock
	const ttl = 600 * time.Millisecond
	late := true
	e.testLoseReply = func() error {
		if late {
			late = false
			time.Sleep(ttl / 2)
		}
		return nil
	}
	r := req(key("late"), "fp")
	r.LeaseTTL = ttl
	res := mustClaim(t, e.engine, r, driver.Claimed)
	e.testLoseReply = nil
	if late {
		t.Fatal("the reply was not held back")
	}
	if left := time.Until(res.Record.LeaseExpiresAt); left < ttl*3/4 {
		t.Fatalf("lease handed out with %s left of %s", left, ttl)
	}

	// A prompt grant is not renewed (its lease is what the claim wrote).
	r2 := req(key("prompt"), "fp")
	r2.LeaseTTL = ttl
	res2 := mustClaim(t, e.engine, r2, driver.Claimed)
	if !res2.Record.LeaseExpiresAt.Equal(res2.Record.UpdatedAt.Add(ttl)) {
		t.Fatalf("prompt grant: lease %s, updated %s", res2.Record.LeaseExpiresAt, res2.Record.UpdatedAt)
	}
}
