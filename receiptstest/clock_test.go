package receiptstest_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/receiptstore/receipts/receiptstest"
)

func ExampleClock() {
	c := receiptstest.NewClock(time.Time{}) // receiptstest.DefaultStart
	// opts := &receipts.Options{Now: c.Now}
	fmt.Println(c.Now().Format(time.RFC3339))
	fmt.Println(c.Advance(31 * time.Second).Format(time.RFC3339))
	c.Set(time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC))
	fmt.Println(c.Now().Format(time.RFC3339))
	// Output:
	// 2026-10-07T12:00:00Z
	// 2026-10-07T12:00:31Z
	// 2027-01-01T00:00:00Z
}

func TestClockConcurrent(t *testing.T) {
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	c := receiptstest.NewClock(start)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 1000 {
				c.Advance(time.Millisecond)
				_ = c.Now()
			}
		}()
	}
	wg.Wait()
	if got, want := c.Now(), start.Add(8*time.Second); !got.Equal(want) {
		t.Fatalf("Now() = %s, want %s", got, want)
	}
	c.Advance(-time.Hour)
	if got, want := c.Now(), start.Add(8*time.Second-time.Hour); !got.Equal(want) {
		t.Fatalf("after Advance(-1h): %s, want %s", got, want)
	}
}
