package pgstore

import (
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
