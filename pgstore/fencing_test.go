package pgstore

import (
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/receiptstore/receipts/driver"
)

// Every fenced write with a stale token is ErrLeaseLost and changes nothing.
func TestFencingStaleToken(t *testing.T) {
	clk := newClock()
	e := newTestDB(t).open(engineOptions{Now: clk.Now})
	k := key("f")
	old := mustClaim(t, e.engine, req(k, "fp"), driver.Claimed)
	if err := e.Abandon(bg, k, old.Record.Token); err != nil {
		t.Fatal(err)
	}
	cur := mustClaim(t, e.engine, req(k, "fp"), driver.TookOver)
	stale := old.Record.Token
	writes := map[string]func() error{
		"renew":             func() error { _, err := e.Renew(bg, k, stale, time.Minute); return err },
		"finish":            func() error { _, err := e.Finish(bg, k, stale, driver.Succeeded, []byte("x")); return err },
		"release":           func() error { return e.Release(bg, k, stale, false) },
		"release-recovered": func() error { return e.Release(bg, k, stale, true) },
		"forget":            func() error { return e.Forget(bg, k, stale) },
		"abandon":           func() error { return e.Abandon(bg, k, stale) },
		"fenceTx": func() error {
			tx, err := e.pool.Begin(bg)
			if err != nil {
				return err
			}
			defer tx.Rollback(bg)
			return e.fenceTx(bg, tx, k, stale)
		},
		"finishTx": func() error {
			tx, err := e.pool.Begin(bg)
			if err != nil {
				return err
			}
			defer tx.Rollback(bg)
			_, err = e.finishTx(bg, tx, k, stale, driver.Succeeded, []byte("x"))
			return err
		},
	}
	for name, w := range writes {
		if err := w(); !isLeaseLost(err) {
			t.Errorf("%s with a stale token: %v, want ErrLeaseLost", name, err)
		}
		rec, found, _, err := e.Lookup(bg, k)
		if err != nil || !found || rec.Token != cur.Record.Token || rec.State != driver.Pending ||
			!rec.LeaseExpiresAt.Equal(cur.Record.LeaseExpiresAt) || !rec.UpdatedAt.Equal(cur.Record.UpdatedAt) {
			t.Fatalf("after %s: %+v %v %v (want %+v)", name, rec, found, err, cur.Record)
		}
	}
	// the current holder still can
	if _, err := e.Renew(bg, k, cur.Record.Token, time.Minute); err != nil {
		t.Fatal(err)
	}
	// a finished record is fenced too: nothing holds it
	if _, err := e.Finish(bg, k, cur.Record.Token, driver.Succeeded, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Renew(bg, k, cur.Record.Token, time.Minute); !isLeaseLost(err) {
		t.Fatalf("renew of a finished record: %v", err)
	}
	if err := e.Forget(bg, k, cur.Record.Token); !isLeaseLost(err) {
		t.Fatalf("forget of a finished record: %v", err)
	}
	// past retention the holder's token is stale as well
	k2 := key("f2")
	c2 := mustClaim(t, e.engine, req(k2, "fp"), driver.Claimed)
	clk.Advance(25 * time.Hour)
	if _, err := e.Finish(bg, k2, c2.Record.Token, driver.Succeeded, nil); !isLeaseLost(err) {
		t.Fatalf("finish past retention: %v", err)
	}
}

// Release of a lease that took over an unknown outcome keeps the record as an abandoned
// claim: the next claim is Recovered (TookOver) too. A plain release deletes it.
func TestReleaseRecoveredKeepsClaim(t *testing.T) {
	clk := newClock()
	e := newTestDB(t).open(engineOptions{Now: clk.Now})
	k := key("r")
	c := mustClaim(t, e.engine, req(k, "fp"), driver.Claimed)
	if err := e.Abandon(bg, k, c.Record.Token); err != nil {
		t.Fatal(err)
	}
	to := mustClaim(t, e.engine, req(k, "fp"), driver.TookOver)
	if err := e.Release(bg, k, to.Record.Token, true); err != nil {
		t.Fatal(err)
	}
	rec, found, now, err := e.Lookup(bg, k)
	if err != nil || !found || rec.State != driver.Pending || rec.Attempts != 2 || string(rec.Fingerprint) != "fp" ||
		rec.LeaseExpiresAt.After(now) {
		t.Fatalf("after recovered release: %+v %v %v", rec, found, err)
	}
	again := mustClaim(t, e.engine, req(k, "fp"), driver.TookOver)
	if again.Record.Attempts != 3 {
		t.Fatalf("again %+v", again.Record)
	}
	// a lease that never took over: released → no record, the next claim starts afresh
	if err := e.Release(bg, k, again.Record.Token, false); err != nil {
		t.Fatal(err)
	}
	if _, found, _, err := e.Lookup(bg, k); err != nil || found {
		t.Fatalf("after release: %v %v", found, err)
	}
	fresh := mustClaim(t, e.engine, req(k, "other"), driver.Claimed)
	if fresh.Record.Attempts != 1 || fresh.Record.Token <= again.Record.Token {
		t.Fatalf("fresh %+v", fresh.Record)
	}
}

// 32 concurrent claims of one key on two nodes: exactly one is granted.
func TestClaimOneWinnerAmong32(t *testing.T) {
	d := newTestDB(t)
	nodes := []*node{d.open(engineOptions{}), d.open(engineOptions{})}
	for round := 0; round < 3; round++ {
		k := key(fmt.Sprint("race", round))
		var mu sync.Mutex
		count := map[driver.Outcome]int{}
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := 0; i < 32; i++ {
			wg.Add(1)
			go func(e *engine) {
				defer wg.Done()
				<-start
				res, err := e.Claim(bg, req(k, "fp"))
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					t.Error(err)
					return
				}
				count[res.Outcome]++
			}(nodes[i%2].engine)
		}
		close(start)
		wg.Wait()
		if count[driver.Claimed] != 1 || count[driver.InProgress] != 31 {
			t.Fatalf("round %d: outcomes %v", round, count)
		}
		var n int
		if err := nodes[0].pool.QueryRow(bg, `SELECT count(*) FROM `+nodes[0].q.schema+`.records WHERE id = $1`, []byte(k.ID)).Scan(&n); err != nil || n != 1 {
			t.Fatalf("rows for the key: %d %v", n, err)
		}
	}
	// and of an abandoned key: exactly one takeover
	k := key("race-takeover")
	c := mustClaim(t, nodes[0].engine, req(k, "fp"), driver.Claimed)
	if err := nodes[0].Abandon(bg, k, c.Record.Token); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	count := map[driver.Outcome]int{}
	var wg sync.WaitGroup
	for i := 0; i < 32; i++ {
		wg.Add(1)
		go func(e *engine) {
			defer wg.Done()
			res, err := e.Claim(bg, req(k, "fp"))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Error(err)
				return
			}
			count[res.Outcome]++
		}(nodes[i%2].engine)
	}
	wg.Wait()
	if count[driver.TookOver] != 1 || count[driver.InProgress] != 31 {
		t.Fatalf("takeover race: outcomes %v", count)
	}
}

// Tokens are unique across concurrent claimers on two nodes, and each claimer sees its own
// tokens increase.
func TestTokensUniqueAndIncreasing(t *testing.T) {
	d := newTestDB(t)
	nodes := []*node{d.open(engineOptions{}), d.open(engineOptions{})}
	const workers, per = 8, 25
	tokens := make([][]uint64, workers)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			e := nodes[w%2].engine
			for i := 0; i < per; i++ {
				k := key(fmt.Sprintf("tok-%d", i%5)) // overlapping keys: claims, takeovers, releases
				res, err := e.Claim(bg, req(k, "fp"))
				if err != nil {
					t.Error(err)
					return
				}
				switch res.Outcome {
				case driver.Claimed, driver.TookOver:
					tokens[w] = append(tokens[w], res.Record.Token)
					if i%2 == 0 {
						err = e.Abandon(bg, k, res.Record.Token)
					} else {
						err = e.Release(bg, k, res.Record.Token, res.Outcome == driver.TookOver)
					}
					if err != nil {
						t.Error(err)
						return
					}
				}
			}
		}(w)
	}
	wg.Wait()
	seen := map[uint64]bool{}
	total := 0
	for w, ts := range tokens {
		if !sort.SliceIsSorted(ts, func(i, j int) bool { return ts[i] < ts[j] }) {
			t.Fatalf("worker %d tokens not increasing: %v", w, ts)
		}
		for _, tok := range ts {
			if seen[tok] {
				t.Fatalf("token %d handed out twice", tok)
			}
			seen[tok] = true
			total++
		}
	}
	if total < workers {
		t.Fatalf("only %d grants", total)
	}
	t.Logf("%d grants, all tokens distinct", total)
}
