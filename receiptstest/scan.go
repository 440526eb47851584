package receiptstest

import (
	"context"
	"errors"
	"testing"

	"github.com/receiptstore/receipts"
	"github.com/stretchr/testify/require"
)

var scanTests = []test{
	{"Filters", testScanFilters},
}

// Scan with each Filter field, alone and combined.
func testScanFilters(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	do := func(k receipts.Key, err error) {
		_, _ = e.db.Do(bg, k, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
			return []byte("r"), err
		})
	}
	do(key("s1", "ok"), nil)
	do(key("s1", "failed"), receipts.Permanent(errors.New("no")))
	do(key("s1", "abandoned"), errors.New("timeout"))
	do(key("s2", "ok"), nil)
	do(key("s2", "released"), receipts.NotPerformed(errors.New("nothing")))
	do(key("s1x", "ok"), nil) // a scope that extends s1
	e.claim(key("s2", "live"), "fp")

	ids := func(f receipts.Filter) []string {
		var out []string
		for r, err := range e.db.Scan(bg, f) {
			require.NoError(t, err)
			require.NotNil(t, r)
			out = append(out, r.Key.Scope+"/"+r.Key.ID)
		}
		return out
	}
	all := []string{"s1/ok", "s1/failed", "s1/abandoned", "s2/ok", "s2/live", "s1x/ok"}
	require.ElementsMatch(t, all, ids(receipts.Filter{}))
	require.ElementsMatch(t, []string{"s1/ok", "s1/failed", "s1/abandoned"}, ids(receipts.Filter{Scope: "s1"}))
	require.Empty(t, ids(receipts.Filter{Scope: "s"}))
	require.ElementsMatch(t, []string{"s1/ok", "s2/ok", "s1x/ok"}, ids(receipts.Filter{State: receipts.Succeeded}))
	require.ElementsMatch(t, []string{"s1/failed"}, ids(receipts.Filter{State: receipts.Failed}))
	require.ElementsMatch(t, []string{"s1/abandoned"}, ids(receipts.Filter{Abandoned: true}))
	require.ElementsMatch(t, []string{"s2/live", "s1/abandoned"}, ids(receipts.Filter{State: receipts.Pending}))
	require.ElementsMatch(t, []string{"s2/ok"}, ids(receipts.Filter{Scope: "s2", State: receipts.Succeeded}))
	require.Empty(t, ids(receipts.Filter{Scope: "s2", Abandoned: true}))
	require.Empty(t, ids(receipts.Filter{State: receipts.Succeeded, Abandoned: true}))
	for n := 1; n <= len(all)+1; n++ {
		got := ids(receipts.Filter{Limit: n})
		require.Len(t, got, min(n, len(all)))
		require.Subset(t, all, got)
	}
	require.Len(t, ids(receipts.Filter{Scope: "s1", Limit: 2}), 2)

	// Breaking out of the loop early is fine.
	for range e.db.Scan(bg, receipts.Filter{}) {
		break
	}
	e.wantCounts(counts{Succeeded: 3, Failed: 1, Pending: 2, Abandoned: 1})

	// The live lease runs out: now it is abandoned too.
	e.clock.Advance(leaseTTL)
	require.ElementsMatch(t, []string{"s2/live", "s1/abandoned"}, ids(receipts.Filter{Abandoned: true}))
}
