package main

import (
	"bytes"
	"context"
	"regexp"
	"testing"
	"time"

	"github.com/receiptstore/receipts/internal/transcript"
)

// TestDocTranscript runs the example with its default flags and checks that
// docs/mcp.md shows its output. `go test -run TestDocTranscript -update`
// writes it. Whether the host's retry lands while the first call still runs
// ("still running" lines) or after it, or never reached it, is the
// machine's timing, so those lines, the attempt numbers and "replayed" are
// left out of the comparison.
func TestDocTranscript(t *testing.T) {
	var out bytes.Buffer
	out.WriteString("$ go run ./examples/mcp-workitems\n")
	// The flags' defaults, as main sets them.
	o := options{dir: t.TempDir(), slow: 400 * time.Millisecond, timeout: 150 * time.Millisecond}
	if err := run(context.Background(), &out, o); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	transcript.Check(t, "../../docs/mcp.md", "run", out.String(), func(s string) string {
		s = stillRunning.ReplaceAllString(s, "")
		s = replayed.ReplaceAllString(s, "(replayed: ?)")
		return attemptN.ReplaceAllString(s, "attempt N: work item")
	})
}

var (
	stillRunning = regexp.MustCompile(`(?m)^attempt \d+: still running; retrying in .*\n`)
	attemptN     = regexp.MustCompile(`attempt \d+: work item`)
	replayed     = regexp.MustCompile(`\(replayed: \w+\)`) // false if attempt 1 never reached the server
)
