package receiptstest

import (
	"sync/atomic"
	"time"
)

// DefaultStart is where NewClock starts when given the zero time:
// 2026-10-07 12:00 UTC, on a boundary of every whole-minute epoch width.
var DefaultStart = time.Date(2026, 10, 7, 12, 0, 0, 0, time.UTC)

// Clock is a fake clock for Options.Now: time stands still until the test
// moves it, forwards or backwards. It is safe for concurrent use and
// lock-free (one atomic load per Now), so benchmarks can use it too. Pass
// its Now method as Options.Now.
//
// It reads in UTC, at nanosecond resolution, between the years 1678 and
// 2262 (what an int64 of Unix nanoseconds holds). The zero Clock reads the
// Unix epoch; NewClock starts anywhere.
type Clock struct {
	ns atomic.Int64 // Unix nanoseconds
}

// NewClock returns a clock that reads start (DefaultStart if start is zero).
func NewClock(start time.Time) *Clock {
	if start.IsZero() {
		start = DefaultStart
	}
	c := &Clock{}
	c.ns.Store(start.UnixNano())
	return c
}

// Now returns the clock's current time.
func (c *Clock) Now() time.Time { return time.Unix(0, c.ns.Load()).UTC() }

// Advance moves the clock by d (backwards if d is negative) and returns the
// new time. Concurrent Advances add up.
func (c *Clock) Advance(d time.Duration) time.Time {
	return time.Unix(0, c.ns.Add(int64(d))).UTC()
}

// Set moves the clock to t, forwards or backwards.
func (c *Clock) Set(t time.Time) { c.ns.Store(t.UnixNano()) }
