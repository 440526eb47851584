package pgstore

import (
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/receiptstore/receipts/driver"
)

func waitWake(t *testing.T, c <-chan struct{}, bound time.Duration, what string) time.Duration {
	t.Helper()
	start := time.Now()
	select {
	case <-c:
		return time.Since(start)
	case <-time.After(bound):
		t.Fatalf("%s: no wake-up within %v", what, bound)
		return 0
	}
}

// A waiter on node B is woken by node A's writes over LISTEN/NOTIFY, well within one poll
// period (B's PollInterval is an hour here, so only a notification can wake it).
func TestWakeAcrossNodesListen(t *testing.T) {
	leakCheck(t)
	d := newTestDB(t)
	a := d.open(engineOptions{ListenConn: d.listenConn()})
	b := d.open(engineOptions{ListenConn: d.listenConn(), PollInterval: time.Hour})
	waitListening(t, b)
	var lat []time.Duration
	for i := 0; i < 10; i++ {
		k := key(fmt.Sprint("w", i))
		c := mustClaim(t, a.engine, req(k, "fp"), driver.Claimed)
		ch, done := b.Watch(k)
		start := time.Now()
		switch i % 4 {
		case 0, 1:
			if _, err := a.Finish(bg, k, c.Record.Token, driver.Succeeded, nil); err != nil {
				t.Fatal(err)
			}
		case 2:
			if err := a.Abandon(bg, k, c.Record.Token); err != nil {
				t.Fatal(err)
			}
		case 3:
			if err := a.Release(bg, k, c.Record.Token, false); err != nil {
				t.Fatal(err)
			}
		}
		waitWake(t, ch, 2*time.Second, "listen")
		lat = append(lat, time.Since(start))
		done()
	}
	// commit in the caller's transaction: woken once the engine sees it committed
	k := key("w-tx")
	c := mustClaim(t, a.engine, req(k, "fp"), driver.Claimed)
	ch, done := b.Watch(k)
	defer done()
	tx, err := a.pool.Begin(bg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.finishTx(bg, tx, k, c.Record.Token, driver.Succeeded, nil); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	select {
	case <-ch:
		t.Fatal("woken before the transaction committed")
	default:
	}
	start := time.Now()
	if err := tx.Commit(bg); err != nil {
		t.Fatal(err)
	}
	waitWake(t, ch, 2*time.Second, "finishTx")
	lat = append(lat, time.Since(start))
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	t.Logf("cross-node wake-up latency: min %v median %v max %v", lat[0], lat[len(lat)/2], lat[len(lat)-1])
}

// waitListening waits until n's LISTEN session is up.
func waitListening(t *testing.T, n *node) {
	t.Helper()
	for i := 0; !n.listenUp.Load(); i++ {
		if i > 500 {
			t.Fatal("listener did not come up")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Poll-only mode (no ListenConn, as behind PgBouncer in transaction mode): B's waiters are
// woken every PollInterval, so they see A's commit within about one period.
func TestWakeAcrossNodesPollOnly(t *testing.T) {
	leakCheck(t)
	d := newTestDB(t)
	a := d.open(engineOptions{})
	b := d.open(engineOptions{PollInterval: 50 * time.Millisecond})
	k := key("poll")
	c := mustClaim(t, a.engine, req(k, "fp"), driver.Claimed)
	ch, done := b.Watch(k)
	defer done()
	if _, err := a.Finish(bg, k, c.Record.Token, driver.Succeeded, nil); err != nil {
		t.Fatal(err)
	}
	t.Logf("poll-only wake-up after %v", waitWake(t, ch, time.Second, "poll-only"))
	mustClaim(t, b.engine, req(k, "fp"), driver.Replay)
}

// In one process a write wakes the key's watchers when it returns, not later.
func TestWakeSameEngine(t *testing.T) {
	e := newTestDB(t).open(engineOptions{NotifyInterval: -1, PollInterval: time.Hour})
	k := key("local")
	c := mustClaim(t, e.engine, req(k, "fp"), driver.Claimed)
	ch, done := e.Watch(k)
	defer done()
	other, done2 := e.Watch(key("other"))
	defer done2()
	if _, err := e.Finish(bg, k, c.Record.Token, driver.Succeeded, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	default:
		t.Fatal("not woken when Finish returned")
	}
	select {
	case <-other:
		t.Fatal("another key's watcher woken")
	default:
	}
}

// When the LISTEN session breaks, the engine wakes every local waiter (it may have missed
// notifications), polls meanwhile, reconnects, and hears notifications again.
func TestListenerReconnect(t *testing.T) {
	leakCheck(t)
	d := newTestDB(t)
	a := d.open(engineOptions{})
	b := d.open(engineOptions{ListenConn: d.listenConn(), PollInterval: time.Hour})
	waitListening(t, b)
	k := key("re")
	ch, done := b.Watch(k)
	defer done()
	if _, err := a.pool.Exec(bg, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
 WHERE query = $1 AND pid <> pg_backend_pid()`, "LISTEN "+pgx.Identifier{b.q.channel}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	waitWake(t, ch, 2*time.Second, "listener broke")
	time.Sleep(20 * time.Millisecond)
	waitListening(t, b)
	waitWake(t, ch, 2*time.Second, "listener back") // wake-all after LISTEN on reconnect
	c := mustClaim(t, a.engine, req(k, "fp"), driver.Claimed)
	if _, err := a.Finish(bg, k, c.Record.Token, driver.Succeeded, nil); err != nil {
		t.Fatal(err)
	}
	waitWake(t, ch, 2*time.Second, "after reconnect")
}

// Close stops every goroutine and the LISTEN session, and is idempotent.
func TestCloseStopsEverything(t *testing.T) {
	leakCheck(t)
	d := newTestDB(t)
	n := d.open(engineOptions{ListenConn: d.listenConn(), PollInterval: 10 * time.Millisecond})
	waitListening(t, n)
	k := key("close")
	c := mustClaim(t, n.engine, req(k, "fp"), driver.Claimed)
	_, done := n.Watch(k)
	defer done()
	if _, err := n.Finish(bg, k, c.Record.Token, driver.Succeeded, nil); err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	// The server ends a closed session's backend after the client hangs up: wait for it
	// (under load it shows in pg_stat_activity for a moment).
	var listeners int
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if err := n.pool.QueryRow(bg, `SELECT count(*) FROM pg_stat_activity WHERE query = $1`,
			"LISTEN "+pgx.Identifier{n.q.channel}.Sanitize()).Scan(&listeners); err != nil {
			t.Fatal(err)
		}
		if listeners == 0 || time.Now().After(deadline) {
			break
		}
	}
	if listeners != 0 {
		t.Fatalf("%d LISTEN sessions left after Close", listeners)
	}
}
