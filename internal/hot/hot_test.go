package hot

import (
	"sync"
	"testing"
)

// A Counter counts every add, from any number of goroutines at once.
func TestCounterCountsEveryAdd(t *testing.T) {
	var c Counter
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 1000 {
				c.Add(uint64(g%2 + 1))
			}
		}()
	}
	wg.Wait()
	if got, want := c.Load(), uint64(16*1000*1+16*1000*2); got != want {
		t.Fatalf("Load %d, want %d", got, want)
	}
}

// Stripe stays within its range.
func TestStripeInRange(t *testing.T) {
	for bits := uint(1); bits <= 6; bits++ {
		if s := Stripe(bits); s < 0 || s >= 1<<bits {
			t.Fatalf("Stripe(%d) = %d", bits, s)
		}
	}
}
