package receipts_test

import (
	"context"
	"testing"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/stretchr/testify/require"
)

// TestWaitAtMostNonPositiveLooksOnce: WaitAtMost(d) with d <= 0 looks at
// the key once and answers. Before, a maxWait of 0 meant "unbounded" (and a
// negative one too): with the fake clock standing still the claim waited
// until its context ran out.
func TestWaitAtMostNonPositiveLooksOnce(t *testing.T) {
	for _, d := range []time.Duration{0, -time.Second} {
		t.Run(d.String(), func(t *testing.T) {
			s := newTestStore(t, nil)
			k := key("a", "held")
			l, _, err := s.db.Claim(bg, k, []byte("fp"))
			require.NoError(t, err)
			s.clock.Advance(10 * time.Second)

			ctx, cancel := context.WithTimeout(bg, 5*time.Second)
			defer cancel()
			start := time.Now()
			_, _, err = s.db.Claim(ctx, k, []byte("fp"), receipts.WaitAtMost(d))
			require.Less(t, time.Since(start), 2*time.Second, "WaitAtMost(%s) waited", d)
			var ipe *receipts.InProgressError
			require.ErrorAs(t, err, &ipe)
			require.NoError(t, ctx.Err())
			require.NotErrorIs(t, err, context.DeadlineExceeded)
			require.Equal(t, 20*time.Second, ipe.RetryAfter)

			// A free key: a lease; a finished one: its receipt.
			l2, r, err := s.db.Claim(bg, key("a", "free"), []byte("fp"), receipts.WaitAtMost(d))
			require.NoError(t, err)
			require.Nil(t, r)
			require.NotNil(t, l2)
			_, err = l.Commit(bg, []byte("done"))
			require.NoError(t, err)
			l3, r, err := s.db.Claim(bg, k, []byte("fp"), receipts.WaitAtMost(d))
			require.NoError(t, err)
			require.Nil(t, l3)
			require.Equal(t, "done", string(r.Result))
		})
	}
}
