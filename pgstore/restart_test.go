package pgstore

import (
	"errors"
	"testing"
	"time"

	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/internal/pgtest"
)

// A crash and restart of PostgreSQL (pg_ctl restart -m immediate) loses nothing committed:
// claims and receipts are there, the holder can still finish, tokens keep growing, the
// engines ride over the broken pooled connections, and the listener comes back.
func TestServerRestart(t *testing.T) {
	leakCheck(t)
	d := newTestDB(t)
	a := d.open(engineOptions{ListenConn: d.listenConn()})
	b := d.open(engineOptions{ListenConn: d.listenConn(), PollInterval: time.Hour})
	waitListening(t, b)
	held := mustClaim(t, a.engine, req(key("held"), "fp"), driver.Claimed)
	done := mustClaim(t, a.engine, req(key("done"), "fp"), driver.Claimed)
	if _, err := a.Finish(bg, key("done"), done.Record.Token, driver.Succeeded, []byte("r")); err != nil {
		t.Fatal(err)
	}
	if err := pgtest.Restart(t); errors.Is(err, pgtest.ErrExternal) {
		t.Skip(err)
	} else if err != nil {
		t.Fatal(err)
	}
	rp := mustClaim(t, b.engine, req(key("done"), "fp"), driver.Replay)
	if string(rp.Record.Result) != "r" {
		t.Fatalf("replay after restart %+v", rp.Record)
	}
	mustClaim(t, b.engine, req(key("held"), "fp"), driver.InProgress)
	waitListening(t, b)
	ch, unwatch := b.Watch(key("held"))
	defer unwatch()
	drain(ch) // the reconnect's wake-all
	if _, err := a.Finish(bg, key("held"), held.Record.Token, driver.Succeeded, nil); err != nil {
		t.Fatalf("finish after restart: %v", err)
	}
	waitWake(t, ch, 2*time.Second, "after restart")
	fresh := mustClaim(t, a.engine, req(key("new"), "fp"), driver.Claimed)
	if fresh.Record.Token <= done.Record.Token {
		t.Fatalf("token %d after restart, %d before", fresh.Record.Token, done.Record.Token)
	}
}

func drain(c <-chan struct{}) {
	for {
		select {
		case <-c:
		default:
			return
		}
	}
}

// loseOnce makes the next statement's reply count as lost (the statement itself ran).
func loseOnce(e *engine) {
	n := 1
	e.testLoseReply = func() error {
		if n > 0 {
			n--
			return errLostReply
		}
		return nil
	}
}

// A Finish or Release whose reply was lost is retried; the retry finds the row already
// written (no row with the token any more) and reports success, not ErrLeaseLost.
func TestWriteLostReplyIsNotLeaseLost(t *testing.T) {
	e := newTestDB(t).open(engineOptions{})
	k := key("lost-finish")
	c := mustClaim(t, e.engine, req(k, "fp"), driver.Claimed)
	loseOnce(e.engine)
	rec, err := e.Finish(bg, k, c.Record.Token, driver.Succeeded, []byte("r"))
	if err != nil || rec.State != driver.Succeeded || string(rec.Result) != "r" {
		t.Fatalf("finish with a lost reply: %+v %v", rec, err)
	}
	k2 := key("lost-release")
	c2 := mustClaim(t, e.engine, req(k2, "fp"), driver.Claimed)
	loseOnce(e.engine)
	if err := e.Release(bg, k2, c2.Record.Token, false); err != nil {
		t.Fatalf("release with a lost reply: %v", err)
	}
	e.testLoseReply = nil
	// a genuinely stale token is still lease lost
	if _, err := e.Finish(bg, k, c.Record.Token, driver.Failed, []byte("other")); !isLeaseLost(err) {
		t.Fatalf("second finish: %v", err)
	}
}
