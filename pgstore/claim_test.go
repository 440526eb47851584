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

// The fresh claim is a plain INSERT (queries.fresh, no ON CONFLICT): a row of the key that its
// snapshot does not see makes it fail with a unique violation, and the claim is re-sent, as
// one that returned no row. Here the row comes from a transaction that does not take the
// key's lock and commits while the claim's INSERT waits on it; the re-sent claim sees it and
// answers as the claim statement does (another caller's live lease: InProgress). Without the
// re-send the claim fails with the unique violation.
func TestClaimFreshConflictResends(t *testing.T) {
	d := newTestDB(t)
	e := d.open(engineOptions{})
	k := key("conflict")
	tx, err := e.pool.Begin(bg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(bg) }()
	if _, err := tx.Exec(bg, `INSERT INTO `+e.q.schema+`.records (scope, id, epoch, state, fp, token, attempts, nonce,
       created_at, updated_at, lease_expires_at)
SELECT $1, $2, floor(extract(epoch FROM n) * 1000000 / $3::bigint)::bigint, 1, 'fp', nextval('`+e.q.schema+`.token_seq'), 1, 'other',
       n, n, n + interval '1 hour' FROM (SELECT clock_timestamp() AS n) s`, []byte(k.Scope), []byte(k.ID), e.width); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		res driver.ClaimResult
		err error
	}
	done := make(chan answer, 1)
	go func() {
		res, err := e.Claim(bg, req(k, "fp"))
		done <- answer{res, err}
	}()
	// the claim's INSERT waits on tx's row (a transaction id lock) before tx commits
	for deadline := time.Now().Add(10 * time.Second); ; {
		var waiting bool
		if err := e.pool.QueryRow(bg, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'transactionid' AND NOT granted)`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the claim never waited on the uncommitted row")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := tx.Commit(bg); err != nil {
		t.Fatal(err)
	}
	a := <-done
	if a.err != nil || a.res.Outcome != driver.InProgress {
		t.Fatalf("claim after a conflicting insert: %v %v, want InProgress", a.res.Outcome, a.err)
	}
}
