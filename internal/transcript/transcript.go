// Package transcript keeps the transcripts shown in the repository's
// Markdown equal to what a test produced, so that they cannot drift from
// what the code prints or sends.
//
// A transcript in a page is a fenced block that follows a marker line:
//
//	<!-- transcript NAME: written by `go test ./examples/x -run TestY -update`; do not edit -->
//
// A test produces the text and calls Check. Without -update, Check fails
// when the page's block differs from it (both first passed through the
// test's normalize function, which blanks what differs from run to run:
// times, random ids). With -update, Check writes the text into the page.
package transcript

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "write the transcripts the tests produce into their pages")

// ErrNoBlock is returned when a page has no transcript of the given name.
var ErrNoBlock = errors.New("transcript: no marked block")

// Check compares got with the block named name in page (a path), after
// normalize (nil: none), or writes got into it with -update.
func Check(t testing.TB, page, name, got string, normalize func(string) string) {
	t.Helper()
	if err := check(page, name, got, normalize); err != nil {
		t.Error(err)
	}
}

func check(page, name, got string, normalize func(string) string) error {
	b, err := os.ReadFile(page)
	if err != nil {
		return err
	}
	start, end, err := Find(string(b), name)
	if err != nil {
		return fmt.Errorf("%s: %w %q", page, err, name)
	}
	got = strings.TrimRight(got, "\n") + "\n"
	if *update {
		out := string(b[:start]) + got + string(b[end:])
		return os.WriteFile(page, []byte(out), 0o644)
	}
	if normalize == nil {
		normalize = func(s string) string { return s }
	}
	want := string(b[start:end])
	if g, w := normalize(got), normalize(want); g != w {
		return fmt.Errorf("%s: transcript %q differs from what the test produced (rewrite it with -update):\n--- page (normalized)\n%s\n--- produced (normalized)\n%s", page, name, w, g)
	}
	return nil
}

// Find returns the byte offsets of the body of the fenced block that
// follows the marker of the transcript called name.
func Find(page, name string) (start, end int, err error) {
	marker := "<!-- transcript " + name + ":"
	i := strings.Index(page, marker)
	if i < 0 {
		return 0, 0, ErrNoBlock
	}
	rest := page[i:]
	open := strings.Index(rest, "\n```")
	if open < 0 {
		return 0, 0, fmt.Errorf("%w: no fenced block after the marker", ErrNoBlock)
	}
	bodyStart := strings.IndexByte(rest[open+1:], '\n')
	if bodyStart < 0 {
		return 0, 0, fmt.Errorf("%w: unterminated fence", ErrNoBlock)
	}
	start = i + open + 1 + bodyStart + 1
	closeAt := strings.Index(page[start:], "```")
	if closeAt < 0 || (closeAt > 0 && page[start+closeAt-1] != '\n') {
		return 0, 0, fmt.Errorf("%w: unterminated block", ErrNoBlock)
	}
	return start, start + closeAt, nil
}
