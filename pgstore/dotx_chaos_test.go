package pgstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/internal/pgtest"
	"github.com/receiptstore/receipts/internal/testkit"
)

// DoTx under load on two nodes while the database's connections are cut (pg_terminate_backend
// of every backend of the nodes' pools, mid-statement and mid-commit) and PostgreSQL itself is
// crashed and restarted (pg_ctl restart -m immediate). The effect is a row fn writes in DoTx's
// transaction, in a table that would take a second row for a key. Keys whose number is a
// multiple of five are declined: fn writes the row, runs a statement that fails, and returns
// Permanent. At the end, for every key:
//   - at most one effect row, and one exactly when the key's receipt is Succeeded, naming the
//     receipt's token (the effect and the receipt committed together, or neither);
//   - a declined key's receipt is Failed, with no effect row;
//   - every receipt a worker was given is the one stored (a receipt reported is never lost);
//   - every call returned within its deadline (DoTx never waits for a connection its own
//     transaction holds).
//
// Pools of one and two connections for eight workers each, so that a cut leaves every
// connection of a pool lost at once. The soak run (RECEIPTS_SOAK=1) runs longer.
func TestDoTxUnderChaos(t *testing.T) {
	d := newTestDB(t)
	var conns int32 // of the next pool opened
	d.tune = func(c *pgxpool.Config) {
		c.MaxConns = conns
		c.ConnConfig.RuntimeParams["application_name"] = "dotx-chaos"
	}
	conns = 1
	a, pool := d.openDB(Options{})
	conns = 2
	b, _ := d.openDB(Options{})
	tbl := d.schema + ".chaos_effects"
	if _, err := pool.Exec(bg, `CREATE TABLE `+tbl+` (n bigserial PRIMARY KEY, k text NOT NULL, token bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}

	// keys are drawn from a window of 16 that slides on every 20 ms: first calls, calls racing
	// on one key, and replays all go on throughout
	const window = 16
	var base atomic.Int64
	declined := func(i int) bool { return i%5 == 0 }
	fp := []byte("fp")
	call := func(ctx context.Context, db *receipts.DB, i int) (*receipts.Receipt, error) {
		k := receipts.Key{Scope: "chaos", ID: fmt.Sprint(i)}
		return DoTx(ctx, db, k, fp, func(ctx context.Context, tx pgx.Tx, l *receipts.Lease) ([]byte, error) {
			if _, err := tx.Exec(ctx, `INSERT INTO `+tbl+` (k, token) VALUES ($1, $2)`, k.ID, int64(l.Token())); err != nil {
				return nil, err
			}
			if declined(i) {
				_, err := tx.Exec(ctx, `SELECT 1/0`)
				return []byte("declined"), receipts.Permanent(err)
			}
			return fmt.Appendf(nil, "r-%d-%d", i, l.Token()), nil
		})
	}

	duration, restarts := 4*time.Second, 1
	if testkit.Soak() {
		duration, restarts = 60*time.Second, 6
	}
	var (
		mu     sync.Mutex
		acks   = map[int]*receipts.Receipt{} // the receipt a worker was given for key i
		calls  atomic.Int64
		failed atomic.Int64 // calls that returned an error (cut, restarting, ...)
	)
	ack := func(i int, r *receipts.Receipt) {
		mu.Lock()
		defer mu.Unlock()
		if prev, ok := acks[i]; ok && (prev.Token != r.Token || string(prev.Result) != string(r.Result) || prev.State != r.State) {
			t.Errorf("key %d: receipt %+v, earlier %+v", i, r, prev)
		}
		acks[i] = r
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 16 {
		db := a
		if w%2 == 1 {
			db = b
		}
		wg.Go(func() {
			rnd := rand.New(rand.NewPCG(uint64(w), 1))
			for {
				select {
				case <-stop:
					return
				default:
				}
				i := int(base.Load()) + rnd.IntN(window)
				ctx, cancel := context.WithTimeout(bg, 30*time.Second)
				start := time.Now()
				r, err := call(ctx, db, i)
				cancel()
				calls.Add(1)
				if took := time.Since(start); took > 25*time.Second {
					t.Errorf("key %d: DoTx took %s (%v)", i, took, err)
				}
				switch {
				case err == nil && !declined(i) && r != nil && r.State == receipts.Succeeded:
					ack(i, r)
				case declined(i) && errors.Is(err, receipts.ErrFailed) && r != nil && r.State == receipts.Failed && string(r.Result) == "declined":
					ack(i, r)
				case err == nil || errors.Is(err, receipts.ErrFailed) || r != nil:
					t.Errorf("key %d (declined %v): %+v %v", i, declined(i), r, err)
				default:
					failed.Add(1)
					time.Sleep(5 * time.Millisecond)
				}
			}
		})
	}

	admin, err := pgx.Connect(bg, d.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = admin.Close(bg) }()
	cuts, restarted := 0, 0
	deadline := time.Now().Add(duration)
	slide := time.NewTicker(20 * time.Millisecond)
	defer slide.Stop()
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-slide.C:
				base.Add(1)
			}
		}
	}()
	for time.Now().Before(deadline) {
		time.Sleep(time.Duration(50+rand.IntN(100)) * time.Millisecond)
		if restarted < restarts && time.Until(deadline) < duration*time.Duration(restarts-restarted)/time.Duration(restarts+1) {
			if err := pgtest.Restart(t); errors.Is(err, pgtest.ErrExternal) {
				restarted = restarts
			} else if err != nil {
				t.Fatal(err)
			} else {
				restarted++
				_ = admin.Close(bg)
				if admin, err = pgx.Connect(bg, d.dsn); err != nil {
					t.Fatal(err)
				}
			}
			continue
		}
		var n int
		if err := admin.QueryRow(bg, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = 'dotx-chaos'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		cuts += n
	}
	close(stop)
	waited := make(chan struct{})
	go func() { wg.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(60 * time.Second):
		t.Fatal("workers still in DoTx a minute after the chaos ended")
	}
	keys := int(base.Load()) + window

	// every key to its end, calmly: the ones never finished get their DoTx now
	for i := range keys {
		r, err := call(bg, a, i)
		switch {
		case declined(i) && errors.Is(err, receipts.ErrFailed) && r != nil:
			ack(i, r)
		case !declined(i) && err == nil && r != nil:
			ack(i, r)
		default:
			t.Fatalf("key %d after the chaos: %+v %v", i, r, err)
		}
	}
	effects := map[string][]int64{}
	rows, err := pool.Query(bg, `SELECT k, token FROM `+tbl)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var k string
		var tok int64
		if err := rows.Scan(&k, &tok); err != nil {
			t.Fatal(err)
		}
		effects[k] = append(effects[k], tok)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for i := range keys {
		k := receipts.Key{Scope: "chaos", ID: fmt.Sprint(i)}
		for _, db := range []*receipts.DB{a, b} {
			r, err := db.Lookup(bg, k)
			if err != nil {
				t.Fatalf("key %d: lookup: %v", i, err)
			}
			if want := acks[i]; r.Token != want.Token || r.State != want.State || string(r.Result) != string(want.Result) {
				t.Errorf("key %d: stored %+v, a worker was given %+v", i, r, want)
			}
			eff := effects[k.ID]
			switch {
			case declined(i) && (r.State != receipts.Failed || len(eff) != 0):
				t.Errorf("declined key %d: %s receipt, effects %v", i, r.State, eff)
			case !declined(i) && (r.State != receipts.Succeeded || len(eff) != 1 || eff[0] != int64(r.Token)):
				t.Errorf("key %d: %s receipt of token %d, effects %v", i, r.State, r.Token, eff)
			}
		}
	}
	t.Logf("%d calls (%d failed), %d connections cut, %d restarts", calls.Load(), failed.Load(), cuts, restarted)
	if calls.Load() < 50 || (cuts == 0 && restarted == 0) {
		t.Fatalf("no chaos: %d calls, %d cuts, %d restarts", calls.Load(), cuts, restarted)
	}
}
