package main

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/receiptstore/receipts/internal/transcript"
)

// TestMain runs the booking service when the example re-executes this
// binary.
func TestMain(m *testing.M) {
	if os.Getenv(envChild) != "" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

var providerKey = regexp.MustCompile(`rk_[A-Za-z0-9_-]{43}`)

// normalize names the provider keys (random per store) by order of
// appearance.
func normalize(s string) string {
	seen := map[string]string{}
	return providerKey.ReplaceAllStringFunc(s, func(k string) string {
		if _, ok := seen[k]; !ok {
			seen[k] = "rk_<" + string(rune('A'+len(seen))) + ">"
		}
		return seen[k]
	})
}

// TestSession runs the example, with real SIGKILLs of the booking service,
// and checks that README.md shows its session (go test
// ./examples/steps -run TestSession -update rewrites it): each retry
// resumes at the step that was cut, a finished step never runs again, and
// the provider did each step's effect once.
func TestSession(t *testing.T) {
	var out bytes.Buffer
	out.WriteString("$ go run ./examples/steps\n")
	if err := run(context.Background(), &out, options{dir: t.TempDir()}); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	got := normalize(out.String())
	for _, want := range []string{
		// trip-1: cut between charge and notify; the retry resumes at notify, which never started.
		"== book trip-1 ==\nattempt 1 of trip-1 (recovered: false)\n  reserve: runs",
		"== retry trip-1 (same key) ==\nattempt 2 of trip-1 (recovered: true)\n  reserve: finished in an earlier attempt, not run again: seat 12A held (H-1)\n  charge: finished in an earlier attempt, not run again: EUR 1299.00 charged (CH-2)\n  notify: runs (recovered: false)",
		"== retry trip-1 again ==\ntrip-1: answered from its receipt, no step ran",
		// trip-2: cut inside notify; the retry runs it Recovered with the same key, and the provider deduplicates.
		"  notify: runs (recovered: false), provider key rk_<F>\n  provider: notify done: itinerary e-mailed (M-6)\n== SIGKILL",
		"  notify: runs (recovered: true), provider key rk_<F>\n  provider: notify already done under this key: itinerary e-mailed (M-6) (deduplicated, not done again)",
		"trip-1's journal (DB.Steps): reserve succeeded, charge succeeded, notify succeeded",
		"provider effects: 6 (one per step key: true)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the session lacks %q:\n%s", want, got)
		}
	}
	transcript.Check(t, "README.md", "session", out.String(), normalize)
}
