package pgstore

import (
	"fmt"
	"testing"
	"time"

	"github.com/receiptstore/receipts/driver"
)

// Scan lists visible records in (scope, id) order across pages and partitions, with the
// filter's scope, state, abandoned and limit.
func TestScanFilter(t *testing.T) {
	clk := newClock()
	e := newTestDB(t).open(engineOptions{Now: clk.Now, Retention: 4 * time.Hour, EpochWidth: time.Hour})
	const n = 1200 // more than two pages
	for i := 0; i < n; i++ {
		k := driver.Key{Scope: fmt.Sprintf("s%d", i%3), ID: fmt.Sprintf("id%05d", i)}
		c := mustClaim(t, e.engine, req(k, "fp"), driver.Claimed)
		var err error
		switch i % 4 {
		case 0:
			_, err = e.Finish(bg, k, c.Record.Token, driver.Succeeded, []byte("ok"))
		case 1:
			_, err = e.Finish(bg, k, c.Record.Token, driver.Failed, []byte("no"))
		case 2:
			err = e.Abandon(bg, k, c.Record.Token)
		}
		if err != nil {
			t.Fatal(err)
		}
		if i == n/2 {
			clk.Advance(time.Hour) // the rest in the next partition
		}
	}
	count := func(f driver.Filter) int {
		t.Helper()
		var last driver.Key
		c := 0
		for r, err := range e.Scan(bg, f) {
			if err != nil {
				t.Fatal(err)
			}
			if c > 0 && (r.Key.Scope < last.Scope || r.Key.Scope == last.Scope && r.Key.ID <= last.ID) {
				t.Fatalf("out of order: %v after %v", r.Key, last)
			}
			if f.Scope != "" && r.Key.Scope != f.Scope || f.State != 0 && r.State != f.State ||
				f.Abandoned && (r.State != driver.Pending || r.LeaseExpiresAt.After(clk.Now())) {
				t.Fatalf("%+v does not match %+v", r, f)
			}
			last = r.Key
			c++
		}
		return c
	}
	for _, tc := range []struct {
		f    driver.Filter
		want int
	}{
		{driver.Filter{}, n},
		{driver.Filter{Scope: "s1"}, n / 3},
		{driver.Filter{State: driver.Succeeded}, n / 4},
		{driver.Filter{State: driver.Pending}, n / 2},
		{driver.Filter{Abandoned: true}, n/4 + n/8}, // abandoned, and the live claims of the first hour (leases run out)
		{driver.Filter{Scope: "s0", State: driver.Failed}, n / 12},
		{driver.Filter{Limit: 501}, 501},
		{driver.Filter{Scope: "none"}, 0},
	} {
		if got := count(tc.f); got != tc.want {
			t.Errorf("%+v: %d records, want %d", tc.f, got, tc.want)
		}
	}
	// once the lease of the live claims runs out they are abandoned too
	clk.Advance(time.Minute)
	if got := count(driver.Filter{Abandoned: true}); got != n/2 {
		t.Errorf("abandoned after lease expiry: %d, want %d", got, n/2)
	}
	// past retention, nothing
	clk.Advance(5 * time.Hour)
	if got := count(driver.Filter{}); got != 0 {
		t.Errorf("past retention: %d", got)
	}
}
