package receipts_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/observe"
	"github.com/stretchr/testify/require"
)

// TestRetryAfterPerClass: a 1.5 s operation class measured among many 2 ms
// ones. A duplicate of the slow class is told about 1.5 s, of the fast class
// about 2 ms, and of a class never measured the store's average. With one
// average for the whole store (the old estimate) the slow class's hint was
// dominated by the fast calls: about 0.2 s here, and the MCP clients
// got 1 ms and hammered the tool.
func TestRetryAfterPerClass(t *testing.T) {
	s := newTestStore(t, nil) // LeaseTTL 30s
	fp := []byte("fp")
	const slow, fast = 1500 * time.Millisecond, 2 * time.Millisecond
	slowCtx := observe.WithOperationClass(bg, "export_report")
	fastCtx := observe.WithOperationClass(bg, "get_weather")
	run := func(ctx context.Context, id string, took time.Duration) {
		t.Helper()
		_, err := s.db.Do(ctx, key("a", id), fp, func(context.Context, *receipts.Lease) ([]byte, error) {
			s.clock.Advance(took)
			return []byte("ok"), nil
		})
		require.NoError(t, err)
	}
	for i := range 3 {
		run(slowCtx, fmt.Sprint("slow", i), slow)
	}
	for i := range 20 { // the fast class dominates the store's average
		run(fastCtx, fmt.Sprint("fast", i), fast)
	}

	// Hold one key of each class (and one without), then ask for each.
	var held []*receipts.Lease
	hint := func(ctx context.Context, id string) time.Duration {
		t.Helper()
		k := key("a", id)
		l, _, err := s.db.Claim(ctx, k, fp)
		require.NoError(t, err)
		held = append(held, l)
		_, _, err = s.db.Claim(ctx, k, fp)
		var ip *receipts.InProgressError
		require.ErrorAs(t, err, &ip)
		return ip.RetryAfter
	}
	slowHint := hint(slowCtx, "slow-held")
	fastHint := hint(fastCtx, "fast-held")
	storeHint := hint(observe.WithOperationClass(bg, "never_measured"), "other-held")
	noClassHint := hint(bg, "unclassed-held")
	t.Logf("RetryAfter: slow class %s, fast class %s, unmeasured class %s, no class %s", slowHint, fastHint, storeHint, noClassHint)

	require.InDelta(t, float64(slow), float64(slowHint), float64(10*time.Millisecond), "slow class")
	require.InDelta(t, float64(fast), float64(fastHint), float64(time.Millisecond), "fast class")
	// The store's average of all 23 attempts: far from both classes.
	require.Equal(t, storeHint, noClassHint, "an unmeasured class falls back to the store's average")
	require.Greater(t, storeHint, 20*fast)
	require.Less(t, storeHint, slow/4)

	// Releasing the held claims measures them too (0 s each): the slow
	// class's estimate moves by 1/8, as the store's does per attempt.
	for _, l := range held {
		require.NoError(t, l.Release(bg))
	}
	require.InDelta(t, float64(slow*7/8), float64(hint(slowCtx, "slow-held-2")), float64(10*time.Millisecond))
	require.NoError(t, held[len(held)-1].Release(bg))
}
