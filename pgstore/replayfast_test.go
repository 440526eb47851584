package pgstore

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/receiptstore/receipts/driver"
)

// holdKey takes, in a transaction of its own session, the key's advisory lock and a row lock
// on its record (if any): what a claim of the key waits for or skips. The transaction ends
// with the returned func (also when t ends).
func holdKey(t *testing.T, n *node, k driver.Key) func() {
	t.Helper()
	conn, err := pgx.Connect(bg, n.dsn)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(bg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(bg, n.q.lock, lockClass, lockID(keyHash(k))); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(bg, `SELECT 1 FROM `+n.q.schema+`.records WHERE scope = $1 AND id = $2 FOR UPDATE`,
		[]byte(k.Scope), []byte(k.ID)); err != nil {
		t.Fatal(err)
	}
	done := false
	release := func() {
		if !done {
			done = true
			_ = tx.Rollback(bg)
			_ = conn.Close(bg)
		}
	}
	t.Cleanup(release)
	return release
}

// blocked reports whether claim c of k waits (on the lock holdKey took) for the whole of a
// short deadline. The lock is held throughout, so a claim that needs it can never succeed.
func blocked(c func(ctx context.Context) error) bool {
	ctx, cancel := context.WithTimeout(bg, 300*time.Millisecond)
	defer cancel()
	return errors.Is(c(ctx), context.DeadlineExceeded)
}

// claimWithin is mustClaim with a deadline: a claim that waits for a lock the test holds fails.
func claimWithin(t *testing.T, e *engine, r driver.ClaimRequest, want driver.Outcome) driver.ClaimResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(bg, 10*time.Second)
	defer cancel()
	res, err := e.Claim(ctx, r)
	if err != nil || res.Outcome != want {
		t.Fatalf("claim %v: %v %v, want %v", r.Key, res.Outcome, err, want)
	}
	return res
}

// A retry of a finished operation is answered from one plain read: while another session holds
// the key's advisory lock and its row lock (so the claim path would wait), Claim and DoTx's
// claim still answer Replay and Mismatch (nothing is written: a write of the row would wait
// for its lock too). Everything else goes down the claim path: a Pending record, a record past
// retention (exactly at the boundary too), a claim once Close has begun.
func TestReplayFast(t *testing.T) {
	clk := newClock()
	d := newTestDB(t)
	const retention = time.Hour
	e := d.open(engineOptions{Now: clk.Now, Retention: retention, TombstoneWindow: -1}) // an expired key is claimed again
	k := driver.Key{Scope: "replayfast", ID: t.Name()}                                  // advisory locks are not per schema
	c := mustClaim(t, e.engine, req(k, "fp"), driver.Claimed)
	fin, err := e.Finish(bg, k, c.Record.Token, driver.Succeeded, []byte("result"))
	if err != nil {
		t.Fatal(err)
	}

	release := holdKey(t, e, k)
	hits := e.replayFastHits.Load()
	rp := claimWithin(t, e.engine, req(k, "fp"), driver.Replay)
	if string(rp.Record.Result) != "result" || rp.Record.Token != c.Record.Token || !rp.Record.UpdatedAt.Equal(fin.UpdatedAt) ||
		!rp.Now.Equal(clk.Now()) || !rp.Record.ExpiresAt.Equal(fin.UpdatedAt.Add(retention)) {
		t.Fatalf("replay %+v now %v", rp.Record, rp.Now)
	}
	claimWithin(t, e.engine, req(k, "other"), driver.Mismatch)
	ctx, cancel := context.WithTimeout(bg, 10*time.Second)
	defer cancel()
	tx, res, err := e.claimTx(ctx, req(k, "fp"), newNonce())
	if err != nil || tx != nil || res.Outcome != driver.Replay {
		t.Fatalf("claimTx of a finished record: %v %v %v", tx, res.Outcome, err)
	}
	if got := e.replayFastHits.Load() - hits; got != 3 {
		t.Fatalf("%d claims answered by the fast path, want 3", got)
	}
	// the same claims without the fast path need the lock (the test can tell)
	slow := d.open(engineOptions{Now: clk.Now, Retention: retention, TombstoneWindow: -1})
	slow.testNoReplayFast = true
	if !blocked(func(ctx context.Context) error { _, err := slow.Claim(ctx, req(k, "fp")); return err }) {
		t.Fatal("the claim path did not wait for the key's lock: the test cannot tell the paths apart")
	}

	// past retention, exactly at the boundary: not answered from the read; the claim path
	// waits for the lock, then resets the record
	clk.Advance(fin.UpdatedAt.Add(retention).Sub(clk.Now()))
	hits = e.replayFastHits.Load()
	if !blocked(func(ctx context.Context) error { _, err := e.Claim(ctx, req(k, "fp")); return err }) {
		t.Fatal("a claim of an expired record did not take the claim path")
	}
	if !blocked(func(ctx context.Context) error { _, _, err := e.claimTx(ctx, req(k, "fp"), newNonce()); return err }) {
		t.Fatal("a claimTx of an expired record did not take the claim path")
	}
	release()
	c2 := mustClaim(t, e.engine, req(k, "fp"), driver.Claimed)
	if c2.Record.Attempts != 1 || c2.Record.Token <= c.Record.Token {
		t.Fatalf("claim of an expired record %+v", c2.Record)
	}

	// Pending: the claim path answers (in progress, mismatch)
	mustClaim(t, e.engine, req(k, "fp"), driver.InProgress)
	mustClaim(t, e.engine, req(k, "other"), driver.Mismatch)
	if got := e.replayFastHits.Load() - hits; got != 0 {
		t.Fatalf("%d claims of expired or pending records answered by the fast path", got)
	}

	// Failed receipts replay too; once Close has begun the claim path refuses as before
	if _, err := e.Finish(bg, k, c2.Record.Token, driver.Failed, nil); err != nil {
		t.Fatal(err)
	}
	rf := mustClaim(t, e.engine, req(k, "fp"), driver.Replay)
	if rf.Record.State != driver.Failed || rf.Record.Result == nil || len(rf.Record.Result) != 0 {
		t.Fatalf("failed replay %+v", rf.Record)
	}
	var closing atomic.Bool
	ce := d.open(engineOptions{Now: clk.Now, Retention: retention, Closing: closing.Load})
	closing.Store(true)
	hits = ce.replayFastHits.Load()
	if _, err := ce.Claim(bg, req(k, "fp")); !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("replay after Closing: %v", err)
	}
	if ce.replayFastHits.Load() != hits {
		t.Fatal("a claim after Closing was answered by the fast path")
	}
}

// A node that never saw a key finished (no hint) sends the claim batch first, and its fresh
// statement returns the key's record: a finished, visible record is answered from that read
// with what the claim statement would answer (Replay, Mismatch for another fingerprint, the
// same record and time as the fast path's), and everything else goes on to the claim
// statement: a Pending record (in progress), a record past retention exactly at the boundary
// (claimed afresh), a Failed receipt (replayed).
func TestReplayFromClaimBatch(t *testing.T) {
	clk := newClock()
	d := newTestDB(t)
	const retention = time.Hour
	o := engineOptions{Now: clk.Now, Retention: retention, TombstoneWindow: -1}
	e := d.open(o)
	k := key(t.Name())
	c := mustClaim(t, e.engine, req(k, "fp"), driver.Claimed)
	fin, err := e.Finish(bg, k, c.Record.Token, driver.Succeeded, []byte("result"))
	if err != nil {
		t.Fatal(err)
	}
	fresh := func() *node { // a node with no hint: its claims start with the claim batch
		n := d.open(o)
		n.testNoReplayFast = true
		return n
	}
	f := fresh()
	rp := mustClaim(t, f.engine, req(k, "fp"), driver.Replay)
	if string(rp.Record.Result) != "result" || rp.Record.Token != c.Record.Token || rp.Record.State != driver.Succeeded ||
		!rp.Record.UpdatedAt.Equal(fin.UpdatedAt) || !rp.Now.Equal(clk.Now()) || !rp.Record.ExpiresAt.Equal(fin.UpdatedAt.Add(retention)) ||
		string(rp.Record.Fingerprint) != "fp" || rp.Record.Attempts != 1 {
		t.Fatalf("replay %+v now %v", rp.Record, rp.Now)
	}
	if f.replayFastHits.Load() != 0 {
		t.Fatal("the test's node took the fast path")
	}
	if m := mustClaim(t, fresh().engine, req(k, "other"), driver.Mismatch); string(m.Record.Result) != "result" {
		t.Fatalf("mismatch %+v", m.Record)
	}

	// past retention, exactly at the boundary: claimed afresh, not replayed
	clk.Advance(fin.UpdatedAt.Add(retention).Sub(clk.Now()))
	c2 := mustClaim(t, fresh().engine, req(k, "fp"), driver.Claimed)
	if c2.Record.Attempts != 1 || c2.Record.Token <= c.Record.Token {
		t.Fatalf("claim of an expired record %+v", c2.Record)
	}
	// Pending: the claim statement answers
	mustClaim(t, fresh().engine, req(k, "fp"), driver.InProgress)
	mustClaim(t, fresh().engine, req(k, "other"), driver.Mismatch)
	// Failed receipts replay too
	if _, err := e.Finish(bg, k, c2.Record.Token, driver.Failed, nil); err != nil {
		t.Fatal(err)
	}
	rf := mustClaim(t, fresh().engine, req(k, "fp"), driver.Replay)
	if rf.Record.State != driver.Failed || rf.Record.Result == nil || len(rf.Record.Result) != 0 || rf.Record.Token != c2.Record.Token {
		t.Fatalf("failed replay %+v", rf.Record)
	}
}
