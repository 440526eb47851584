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

// The fast path's read goes to the one partition where this node saw the key's record finished
// (lookupIn), and still answers what the parent's read would: after another node has claimed
// the key afresh past retention and finished it again in a later epoch, the old partition
// (still live) holds no row of the key and the parent's read answers the new receipt; a hint
// naming an epoch that is no longer live goes to the parent without reading it.
func TestReplayFastOnePartition(t *testing.T) {
	clk := newClock()
	d := newTestDB(t)
	const retention = time.Hour
	o := engineOptions{Now: clk.Now, Retention: retention, EpochWidth: 15 * time.Minute, TombstoneWindow: -1}
	a, b := d.open(o), d.open(o)
	k := key(t.Name())
	c := mustClaim(t, a.engine, req(k, "fp"), driver.Claimed)
	fin, err := a.Finish(bg, k, c.Record.Token, driver.Succeeded, []byte("first"))
	if err != nil {
		t.Fatal(err)
	}
	ep, seen := a.hint.get(keyHash(k))
	if !seen || ep != a.epochOf(fin.UpdatedAt) {
		t.Fatalf("hint %d %v, want epoch %d", ep, seen, a.epochOf(fin.UpdatedAt))
	}
	rowsIn := func(ep int64) (n int64) {
		t.Helper()
		if err := a.pool.QueryRow(bg, `SELECT count(*) FROM `+a.q.schema+`.`+pgx.Identifier{partName(famRecords, ep)}.Sanitize()+
			` WHERE scope = $1 AND id = $2`, []byte(k.Scope), []byte(k.ID)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := rowsIn(ep); n != 1 {
		t.Fatalf("the record is not in the partition of epochOf(UpdatedAt): %d rows", n)
	}
	in, fast := a.lookupInHits.Load(), a.replayFastHits.Load()
	rp := mustClaim(t, a.engine, req(k, "fp"), driver.Replay)
	if string(rp.Record.Result) != "first" || !rp.Record.UpdatedAt.Equal(fin.UpdatedAt) || !rp.Now.Equal(clk.Now()) {
		t.Fatalf("replay %+v now %v", rp.Record, rp.Now)
	}
	mustClaim(t, a.engine, req(k, "other"), driver.Mismatch)
	if a.lookupInHits.Load()-in != 2 || a.replayFastHits.Load()-fast != 2 {
		t.Fatalf("%d reads of one partition, %d fast answers, want 2 and 2", a.lookupInHits.Load()-in, a.replayFastHits.Load()-fast)
	}

	// just past retention, the first epoch still live: node b claims the key afresh (the row
	// moves to the epoch of now) and finishes it
	clk.Advance(fin.UpdatedAt.Add(retention).Sub(clk.Now()) + time.Microsecond)
	c2 := mustClaim(t, b.engine, req(k, "fp"), driver.Claimed)
	fin2, err := b.Finish(bg, k, c2.Record.Token, driver.Succeeded, []byte("second"))
	if err != nil {
		t.Fatal(err)
	}
	ep2 := b.epochOf(fin2.UpdatedAt)
	if ep2 == ep || ep < a.oldest() || rowsIn(ep) != 0 || rowsIn(ep2) != 1 {
		t.Fatalf("the test's record did not move from live epoch %d to %d (oldest %d)", ep, ep2, a.oldest())
	}
	in, fast = a.lookupInHits.Load(), a.replayFastHits.Load()
	rp = mustClaim(t, a.engine, req(k, "fp"), driver.Replay)
	if string(rp.Record.Result) != "second" || rp.Record.Token != c2.Record.Token {
		t.Fatalf("replay after the move %+v", rp.Record)
	}
	if a.lookupInHits.Load() != in || a.replayFastHits.Load()-fast != 1 {
		t.Fatal("the read of the old partition answered, or the parent's read did not")
	}
	if got, _ := a.hint.get(keyHash(k)); got != ep2 {
		t.Fatalf("hint after the move: epoch %d, want %d", got, ep2)
	}
	rp = mustClaim(t, a.engine, req(k, "fp"), driver.Replay)
	if string(rp.Record.Result) != "second" || a.lookupInHits.Load()-in != 1 {
		t.Fatalf("replay from the new partition %+v (%d reads of one partition)", rp.Record, a.lookupInHits.Load()-in)
	}

	// a hint naming an epoch older than the oldest live one: the parent's read, no error
	a.hint.add(keyHash(k), a.oldest()-3)
	in = a.lookupInHits.Load()
	if rp = mustClaim(t, a.engine, req(k, "fp"), driver.Replay); string(rp.Record.Result) != "second" || a.lookupInHits.Load() != in {
		t.Fatalf("replay with a dead epoch's hint %+v", rp.Record)
	}
}

// A record whose timestamps are not finite (bytes no receipts binary writes) is reported as
// corrupt (ErrCorrupt), not read as the zero time.
func TestInfiniteTimestampIsCorrupt(t *testing.T) {
	d := newTestDB(t)
	e := d.open(engineOptions{})
	k := driver.Key{Scope: "infinite", ID: t.Name()}
	c := mustClaim(t, e.engine, req(k, "fp"), driver.Claimed)
	if _, err := e.Finish(bg, k, c.Record.Token, driver.Succeeded, []byte("result")); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(bg, `UPDATE `+e.q.schema+`.records SET created_at = 'infinity' WHERE scope = $1 AND id = $2`,
		[]byte(k.Scope), []byte(k.ID)); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := e.Lookup(bg, k); !errors.Is(err, driver.ErrCorrupt) {
		t.Fatalf("Lookup of a record created at infinity: %v, want ErrCorrupt", err)
	}
}
