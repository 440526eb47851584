package pgstore

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/receiptstest"
)

// Two nodes whose claims of the same fresh keys land on either side of an epoch boundary
// (their clocks 1 µs apart) write to different partitions, where the primary key cannot
// arbitrate: the claim's advisory lock must. Exactly one claim per key wins, one row per key.
func TestClaimAcrossEpochBoundary(t *testing.T) {
	const width = time.Hour
	boundary := time.UnixMicro((time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC).UnixMicro()/width.Microseconds() + 1) * width.Microseconds())
	before := receiptstest.NewClock(boundary.Add(-time.Microsecond))
	after := receiptstest.NewClock(boundary)
	d := newTestDB(t)
	o := engineOptions{Retention: 4 * width, EpochWidth: width}
	o.Now = before.Now
	a := d.open(o)
	o.Now = after.Now
	b := d.open(o)
	if a.epochOf(before.Now()) == b.epochOf(after.Now()) {
		t.Fatal("clocks in one epoch")
	}
	const keys = 60
	var mu sync.Mutex
	claimed := map[string]int{}
	var wg sync.WaitGroup
	for i := 0; i < keys; i++ {
		k := key(fmt.Sprint("b", i))
		for _, e := range []*engine{a.engine, b.engine} {
			wg.Add(1)
			go func(e *engine) {
				defer wg.Done()
				res, err := e.Claim(bg, req(k, "fp"))
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if res.Outcome == driver.Claimed {
					claimed[k.ID]++
				}
				mu.Unlock()
			}(e)
		}
	}
	wg.Wait()
	var dup int
	if err := a.pool.QueryRow(bg, `SELECT count(*) FROM (SELECT id FROM `+a.q.schema+`.records GROUP BY id HAVING count(*) > 1) x`).Scan(&dup); err != nil {
		t.Fatal(err)
	}
	for id, n := range claimed {
		if n != 1 {
			t.Errorf("key %s claimed %d times", id, n)
		}
	}
	if dup != 0 || len(claimed) != keys {
		t.Fatalf("%d keys with two rows; %d keys claimed of %d", dup, len(claimed), keys)
	}
}
