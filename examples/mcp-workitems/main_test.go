package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// TestRun runs the demo: the first attempt times out, the retry is a
// replay, and the tracker holds one work item.
func TestRun(t *testing.T) {
	var out bytes.Buffer
	err := run(context.Background(), &out, options{dir: t.TempDir(), slow: 200 * time.Millisecond, timeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, want := range []string{
		"attempt 1: no answer within 50ms; retrying with the same key",
		"(replayed: ", // true, unless attempt 1 never reached the server
		"same key, other arguments: idempotency_key_conflict",
		"work items in the tracker: 1\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
