package transcript

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestFind(t *testing.T) {
	page := "# x\n\n<!-- transcript a: by a test -->\n\n```text\nline 1\nline 2\n```\n\nafter\n"
	start, end, err := Find(page, "a")
	if err != nil {
		t.Fatal(err)
	}
	if got := page[start:end]; got != "line 1\nline 2\n" {
		t.Fatalf("block = %q", got)
	}
	if _, _, err := Find(page, "b"); !errors.Is(err, ErrNoBlock) {
		t.Fatalf("Find of a missing name: %v", err)
	}
	if _, _, err := Find("<!-- transcript a: x -->\n```\nno end\n", "a"); !errors.Is(err, ErrNoBlock) {
		t.Fatalf("Find of an unterminated block: %v", err)
	}
}

// Check passes on an equal block, fails on another, and -update writes the
// produced text in place, leaving the rest of the page as it was.
func TestCheckAndUpdate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.md")
	page := "intro\n<!-- transcript s: t -->\n```\nold 1\n```\ntail\n"
	if err := os.WriteFile(path, []byte(page), 0o644); err != nil {
		t.Fatal(err)
	}
	digits := func(s string) string {
		return strings.Map(func(r rune) rune {
			if r >= '0' && r <= '9' {
				return '#'
			}
			return r
		}, s)
	}
	Check(t, path, "s", "old 7", digits) // equal after normalizing

	if err := check(path, "s", "new", nil); err == nil {
		t.Fatal("a differing transcript passed")
	}

	*update = true
	defer func() { *update = false }()
	Check(t, path, "s", "new 1\nnew 2", nil)
	b, _ := os.ReadFile(path)
	if want := "intro\n<!-- transcript s: t -->\n```\nnew 1\nnew 2\n```\ntail\n"; string(b) != want {
		t.Fatalf("updated page = %q, want %q", b, want)
	}
}
