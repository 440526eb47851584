package intents

import (
	"errors"
	"net/http"
	"testing"
	"time"
)

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		v    string
		want time.Duration
		ok   bool
	}{
		{"", 0, false},
		{"3", 3 * time.Second, true},
		{"0", 0, true},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second, true},
		{now.Add(-time.Minute).Format(http.TimeFormat), 0, true},
		{"999999999", 24 * time.Hour, true},
		{"86399", 86399 * time.Second, true},
		{"4294967295", 24 * time.Hour, true},
		{"4294967296", 24 * time.Hour, true}, // was ignored: retried at once
		{"18446744073709551615", 24 * time.Hour, true},
		{"18446744073709551616", 24 * time.Hour, true},
		{"99999999999999999999999999999999999999", 24 * time.Hour, true},
		{"+5", 0, false},
		{"1.5", 0, false},
		{" 5", 0, false},
		{"soon", 0, false},
		{"-1", 0, false},
	} {
		got, ok := parseRetryAfter(c.v, now)
		if got != c.want || ok != c.ok {
			t.Errorf("parseRetryAfter(%q) = %v, %v; want %v, %v", c.v, got, ok, c.want, c.ok)
		}
	}
}

// TestBackoff: exponential from MinBackoff, capped at MaxBackoff, and at
// least what the service asked for.
func TestBackoff(t *testing.T) {
	d := &Dispatcher{o: DispatcherOptions{MinBackoff: 10 * time.Millisecond, MaxBackoff: time.Second}}
	plain := errors.New("503")
	for n := uint32(1); n < 40; n++ {
		ceil := min(10*time.Millisecond<<min(n-1, 31), time.Second)
		for range 50 {
			if w := d.backoff(n, plain); w < 10*time.Millisecond || w > ceil {
				t.Fatalf("attempt %d: %v outside [10ms, %v]", n, w, ceil)
			}
		}
	}
	// Large backoffs do not overflow into short ones.
	big := &Dispatcher{o: DispatcherOptions{MinBackoff: time.Minute, MaxBackoff: maxDuration}}
	for n := uint32(1); n < 100; n++ {
		if w := big.backoff(n, plain); w < time.Minute || w > maxDuration {
			t.Fatalf("attempt %d of a 1m..%v backoff: %v", n, maxDuration, w)
		}
	}
	hinted := &RetryError{After: 5 * time.Second, Err: plain}
	for range 50 {
		if w := d.backoff(1, hinted); w < 5*time.Second || w > 5500*time.Millisecond {
			t.Fatalf("Retry-After 5s: waited %v", w)
		}
	}
}
