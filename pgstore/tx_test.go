package pgstore

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/receiptstore/receipts/driver"
)

func (n *node) effectsTable(t *testing.T) {
	t.Helper()
	if _, err := n.pool.Exec(bg, `CREATE TABLE IF NOT EXISTS `+n.q.schema+`.effects (k text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
}

// finishTx commits with the caller's transaction: rolled back, nothing is recorded and the
// lease is still held; committed, the effect and the receipt are both there.
func TestFinishTxCommitsIffTxCommits(t *testing.T) {
	e := newTestDB(t).open(engineOptions{})
	e.effectsTable(t)
	k := key("tx")
	c := mustClaim(t, e.engine, req(k, "fp"), driver.Claimed)
	eff := `INSERT INTO ` + e.q.schema + `.effects VALUES ($1)`

	tx, err := e.pool.Begin(bg)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.fenceTx(bg, tx, k, c.Record.Token); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(bg, eff, "tx"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.finishTx(bg, tx, k, c.Record.Token, driver.Succeeded, []byte("done")); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(bg); err != nil {
		t.Fatal(err)
	}
	rec, found, _, err := e.Lookup(bg, k)
	if err != nil || !found || rec.State != driver.Pending || rec.Token != c.Record.Token {
		t.Fatalf("after rollback: %+v %v %v", rec, found, err)
	}
	var n int
	_ = e.pool.QueryRow(bg, `SELECT count(*) FROM `+e.q.schema+`.effects`).Scan(&n)
	if n != 0 {
		t.Fatal("effect survived the rollback")
	}
	// still held: renew works, a new transaction commits
	if _, err := e.Renew(bg, k, c.Record.Token, time.Minute); err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(bg, e.pool, func(tx pgx.Tx) error {
		if err := e.fenceTx(bg, tx, k, c.Record.Token); err != nil {
			return err
		}
		if _, err := tx.Exec(bg, eff, "tx"); err != nil {
			return err
		}
		_, err := e.finishTx(bg, tx, k, c.Record.Token, driver.Succeeded, []byte("done"))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	rp := mustClaim(t, e.engine, req(k, "fp"), driver.Replay)
	_ = e.pool.QueryRow(bg, `SELECT count(*) FROM `+e.q.schema+`.effects`).Scan(&n)
	if string(rp.Record.Result) != "done" || n != 1 {
		t.Fatalf("after commit: %+v, %d effects", rp.Record, n)
	}
}

// While fenceTx holds the row, a claim after the lease ran out cannot take over (it reports
// in progress); once the transaction commits, the receipt is replayed.
func TestFenceTxBlocksTakeover(t *testing.T) {
	clk := newClock()
	d := newTestDB(t)
	a := d.open(engineOptions{Now: clk.Now})
	b := d.open(engineOptions{Now: clk.Now})
	k := key("fence")
	c := mustClaim(t, a.engine, req(k, "fp"), driver.Claimed)
	tx, err := a.pool.Begin(bg)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(bg)
	if err := a.fenceTx(bg, tx, k, c.Record.Token); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Minute) // the lease has run out; nobody took it over
	start := time.Now()
	mustClaim(t, b.engine, req(k, "fp"), driver.InProgress)
	t.Logf("claim against a fenced row answered in %v", time.Since(start))
	if _, err := a.finishTx(bg, tx, k, c.Record.Token, driver.Succeeded, []byte("ok")); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(bg); err != nil {
		t.Fatal(err)
	}
	mustClaim(t, b.engine, req(k, "fp"), driver.Replay)
}

// doTx: claim, effect and receipt in one transaction. A duplicate on another node waits for
// it and replays; an error from the effect records nothing.
func TestDoTx(t *testing.T) {
	d := newTestDB(t)
	a := d.open(engineOptions{})
	b := d.open(engineOptions{})
	a.effectsTable(t)
	eff := `INSERT INTO ` + a.q.schema + `.effects VALUES ($1)`
	k := key("dotx")

	inFn := make(chan struct{})
	release := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	var dup driver.ClaimResult
	var dupErr error
	go func() {
		defer wg.Done()
		<-inFn
		dup, dupErr = b.Claim(bg, req(k, "fp")) // blocks on the key's lock until a commits
	}()
	cr, fin, err := a.doTx(bg, req(k, "fp"), func(ctx context.Context, tx pgx.Tx, cr driver.ClaimResult) (driver.State, []byte, error) {
		if cr.Outcome != driver.Claimed {
			t.Errorf("outcome %v", cr.Outcome)
		}
		if _, err := tx.Exec(ctx, eff, "dotx"); err != nil {
			return 0, nil, err
		}
		close(inFn)
		time.Sleep(100 * time.Millisecond)
		close(release)
		return driver.Succeeded, []byte("r"), nil
	})
	if err != nil || cr.Outcome != driver.Claimed || fin.State != driver.Succeeded || string(fin.Result) != "r" {
		t.Fatalf("doTx: %+v %+v %v", cr, fin, err)
	}
	wg.Wait()
	if dupErr != nil || dup.Outcome != driver.Replay || string(dup.Record.Result) != "r" {
		t.Fatalf("duplicate during doTx: %+v %v", dup, dupErr)
	}
	// a second doTx replays without running fn
	cr, _, err = b.doTx(bg, req(k, "fp"), func(context.Context, pgx.Tx, driver.ClaimResult) (driver.State, []byte, error) {
		t.Error("fn ran on a replay")
		return driver.Succeeded, nil, nil
	})
	if err != nil || cr.Outcome != driver.Replay {
		t.Fatalf("second doTx: %+v %v", cr, err)
	}

	// fn fails: nothing recorded, claim included
	k2 := key("dotx-fail")
	boom := errors.New("boom")
	_, _, err = a.doTx(bg, req(k2, "fp"), func(ctx context.Context, tx pgx.Tx, cr driver.ClaimResult) (driver.State, []byte, error) {
		if _, err := tx.Exec(ctx, eff, "dotx-fail"); err != nil {
			return 0, nil, err
		}
		return 0, nil, boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("failing fn: %v", err)
	}
	if _, found, _, _ := a.Lookup(bg, k2); found {
		t.Fatal("claim of a failed doTx survived")
	}
	var n int
	_ = a.pool.QueryRow(bg, `SELECT count(*) FROM `+a.q.schema+`.effects`).Scan(&n)
	if n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
	mustClaim(t, b.engine, req(k2, "fp"), driver.Claimed)
}

// A claim blocked behind a doTx on the same key honours its context.
func TestClaimBlockedByDoTxHonoursContext(t *testing.T) {
	d := newTestDB(t)
	a, b := d.open(engineOptions{}), d.open(engineOptions{})
	k := key("blocked")
	inFn, release := make(chan struct{}), make(chan struct{})
	go func() {
		_, _, err := a.doTx(bg, req(k, "fp"), func(context.Context, pgx.Tx, driver.ClaimResult) (driver.State, []byte, error) {
			close(inFn)
			<-release
			return driver.Succeeded, []byte("r"), nil
		})
		if err != nil {
			t.Error(err)
		}
	}()
	<-inFn
	ctx, cancel := context.WithTimeout(bg, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := b.Claim(ctx, req(k, "fp"))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("blocked claim: %v", err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("blocked claim returned after %v", el)
	}
	close(release)
	for i := 0; ; i++ {
		res, err := b.Claim(bg, req(k, "fp"))
		if err != nil {
			t.Fatal(err)
		}
		if res.Outcome == driver.Replay {
			break
		}
		if i > 100 {
			t.Fatalf("outcome %v", res.Outcome)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
