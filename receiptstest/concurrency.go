package receiptstest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/stretchr/testify/require"
)

var concurrencyTests = []test{
	{"ClaimsOneWinner", testConcurrentClaimsOneWinner},
	{"DoSameKeyRunsOnce", testDoSameKeyRunsOnce},
	{"ManyKeysInParallel", testManyKeysInParallel},
}

// N concurrent claims of a free key: one lease, N-1 *InProgressError.
func testConcurrentClaimsOneWinner(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k := key("a", "k")
	const n = 32
	out := make(chan result, n)
	start := make(chan struct{})
	for range n {
		go func() {
			<-start
			l, r, err := e.db.Claim(bg, k, []byte("fp"))
			out <- result{l, r, err}
		}()
	}
	close(start)
	leases, inProgress := 0, 0
	for range n {
		o := recv(t, out, "a claim")
		switch {
		case o.err == nil && o.l != nil && o.r == nil:
			leases++
		case errors.Is(o.err, receipts.ErrInProgress) && o.l == nil && o.r == nil:
			inProgress++
		default:
			t.Errorf("unexpected: %+v", o)
		}
	}
	require.Equal(t, 1, leases)
	require.Equal(t, n-1, inProgress)
}

// N goroutines Do the same key at once: fn runs exactly once, and every
// caller gets the same receipt.
func testDoSameKeyRunsOnce(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	k := key("a", "hot")
	var calls atomic.Int32
	running, release := make(chan struct{}), make(chan struct{})
	const n = 16
	out := make(chan result, n)
	for range n {
		go func() {
			r, err := e.db.Do(bg, k, []byte("fp"), func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
				if calls.Add(1) == 1 {
					close(running)
				}
				<-release
				return []byte("once"), nil
			})
			out <- result{r: r, err: err}
		}()
	}
	recv(t, running, "one caller to run fn")
	letWaitersWait()
	close(release)
	var first *receipts.Receipt
	for range n {
		o := recv(t, out, "a Do")
		require.NoError(t, o.err)
		if first == nil {
			first = o.r
		}
		sameReceipt(t, first, o.r)
	}
	require.Equal(t, int32(1), calls.Load())
	require.Equal(t, []byte("once"), first.Result)
}

// Many goroutines on many keys (each key done several times, some fns
// failing in each of the ways): every key's fn ran until its first
// definitive outcome and never after, and every key reads back its own.
func testManyKeysInParallel(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	const workers, keys, rounds = 8, 64, 3
	var runs [keys]atomic.Int32
	var answered atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, workers*keys*rounds)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				for i := range keys {
					i := (i + w*7) % keys
					k := key(fmt.Sprintf("tenant-%d", i%4), fmt.Sprintf("op-%d", i))
					got, err := e.db.Do(bg, k, []byte(fmt.Sprint("fp-", i)), func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
						n := runs[i].Add(1)
						switch {
						case i%3 == 1 && n == 1:
							return nil, receipts.NotPerformed(errors.New("not yet"))
						case i%3 == 2 && n == 1:
							return nil, errors.New("unknown outcome")
						}
						return []byte(fmt.Sprint("result-", i)), nil
					})
					answered.Add(1)
					switch {
					case err == nil:
						if string(got.Result) != fmt.Sprint("result-", i) || got.Key != k {
							errs <- fmt.Errorf("%s: got %s %q", k, got.Key, got.Result)
						}
					case i%3 != 0 && r == 0:
						// the first run's NotPerformed or unknown outcome
					default:
						errs <- fmt.Errorf("%s round %d: %w", k, r, err)
					}
				}
			}
		}()
	}
	// A correct store finishes in a second or two; a broken one (a lease that nobody
	// finishes, waited out call after call) fails here, saying so, instead of hanging.
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Fatalf("workers not done after 2m: %d of %d calls answered (Do waiting on leases nobody finishes?)",
			answered.Load(), workers*keys*rounds)
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for i := range keys {
		want := int32(1)
		if i%3 != 0 {
			want = 2
		}
		require.Equal(t, want, runs[i].Load(), "key %d", i)
		k := key(fmt.Sprintf("tenant-%d", i%4), fmt.Sprintf("op-%d", i))
		r := e.lookup(k)
		require.Equal(t, fmt.Sprint("result-", i), string(r.Result))
		if i%3 == 2 {
			require.Equal(t, uint32(2), r.Attempts, "taken over after the unknown outcome")
		}
	}
	e.wantCounts(counts{Succeeded: keys})
}
