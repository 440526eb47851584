package receiptstest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/stretchr/testify/require"
)

var orphanTests = []test{
	{"ErrorLeavesNoClaim", testClaimErrorLeavesNoClaim},
}

// Orphan loop sizes: first claims sent one after the other, and by orphanCallers callers at
// once (on an engine that batches concurrent claims, as pgstore does, they share
// transactions).
const (
	orphanClaims  = 384
	orphanCallers = 8
)

// A Claim that returns an error leaves no claim behind: a key left Pending by a claim whose
// caller was told it failed has no holder, so its retries get ErrInProgress for the whole
// lease, and the next attempt is told Recovered for an effect that never ran. The test claims
// fresh keys with deadlines from 0.3 to 2.7 ms, so that many contexts end while the claim is
// in flight (on PostgreSQL: after its COMMIT was sent, before its reply came back), alone and
// by several callers at once. Then the store is reopened (so that whatever the engine does
// after a call returned is done) and every key whose Claim returned an error is read: none
// may be Pending. Each key whose Claim gave a lease must be Pending with that lease's token.
// (PostgreSQL before its claims were sent detached from the caller's context: 24 and 32 such
// keys in two runs; Pebble: none, its claim is not cut short once begun.)
func testClaimErrorLeavesNoClaim(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	type outcome struct {
		k     receipts.Key
		token uint64 // the lease's, or 0: Claim returned an error
	}
	var mu sync.Mutex
	var outs []outcome
	claim := func(rng *rand.Rand, k receipts.Key) {
		d := 300*time.Microsecond + time.Duration(rng.Int64N(int64(2400*time.Microsecond)))
		ctx, cancel := context.WithTimeout(bg, d)
		l, r, err := e.db.Claim(ctx, k, []byte("fp"))
		cancel()
		o := outcome{k: k}
		switch {
		case err == nil && l != nil:
			o.token = l.Token()
		case err == nil:
			t.Errorf("claim %s of a fresh key: a receipt %+v", k, r)
			return
		}
		mu.Lock()
		outs = append(outs, o)
		mu.Unlock()
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range orphanClaims {
		claim(rng, key("alone", fmt.Sprint(i)))
	}
	var wg sync.WaitGroup
	for c := range orphanCallers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(3, uint64(c)))
			for i := range orphanClaims / orphanCallers {
				claim(rng, key("together", fmt.Sprintf("%d-%d", c, i)))
			}
		}()
	}
	wg.Wait()

	e.reopen()
	failed, orphans, lost := 0, 0, 0
	for _, o := range outs {
		r, err := e.db.Lookup(bg, o.k)
		if o.token == 0 {
			failed++
			if err == nil && r.State == receipts.Pending {
				orphans++
			}
			continue
		}
		if err != nil || r.State != receipts.Pending || r.Token != o.token {
			lost++
			t.Errorf("%s: a lease with token %d was handed out, and the key holds %+v (%v)", o.k, o.token, r, err)
		}
	}
	t.Logf("%d claims, %d returned an error, %d of those left a Pending claim", len(outs), failed, orphans)
	require.Zero(t, orphans, "keys left Pending by a Claim that returned an error")
	require.Zero(t, lost)
}
