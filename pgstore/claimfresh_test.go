package pgstore

import (
	"testing"
	"time"

	"github.com/receiptstore/receipts/driver"
)

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
