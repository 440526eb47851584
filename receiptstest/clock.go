package receiptstest

import (
	"sync"
	"time"
)

// DefaultStart is where NewClock starts when given the zero time:
// 2026-10-07 12:00 UTC, on a boundary of every whole-minute epoch width.
var DefaultStart = time.Date(2026, 10, 7, 12, 0, 0, 0, time.UTC)

// Clock is a fake clock for Options.Now: time stands still until the test
// moves it. It is safe for concurrent use; pass its Now method as
// Options.Now. The zero Clock is not usable: call NewClock.
type Clock struct {
	mu sync.Mutex
	t  time.Time // protected by mu
}

// NewClock returns a clock that reads start (DefaultStart if start is zero).
func NewClock(start time.Time) *Clock {
	if start.IsZero() {
		start = DefaultStart
	}
	return &Clock{t: start}
}

// Now returns the clock's current time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock by d (backwards if d is negative) and returns the
// new time.
func (c *Clock) Advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
	return c.t
}

// Set moves the clock to t, forwards or backwards.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}
