package receipts_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// pendingPages are pages the README links to that other work writes. They
// may be missing; once they exist their links are checked like any other.
var pendingPages = map[string]bool{}

var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestDocLinks checks every relative link in the repository's Markdown
// (README.md, docs/, bench/ and the examples): the file it names exists,
// and an #anchor names a heading of the page it points to, as GitHub
// derives them.
func TestDocLinks(t *testing.T) {
	var pages []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			pages = append(pages, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"README.md", "docs/http.md", "docs/mcp.md", "docs/postgresql.md", "docs/operating.md", "docs/performance.md", "docs/reliability.md"} {
		if !slices.Contains(pages, filepath.FromSlash(want)) {
			t.Errorf("%s is missing", want)
		}
	}
	anchors := map[string]map[string]bool{}
	anchorsOf := func(page string) map[string]bool {
		if a, ok := anchors[page]; ok {
			return a
		}
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		a := headingAnchors(string(b))
		anchors[page] = a
		return a
	}
	checked := 0
	for _, page := range pages {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for n, line := range outsideCode(string(b)) {
			for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				file, anchor, _ := strings.Cut(target, "#")
				dest := page
				if file != "" {
					dest = filepath.Join(filepath.Dir(page), filepath.FromSlash(file))
				}
				checked++
				if _, err := os.Stat(dest); err != nil {
					if pendingPages[filepath.ToSlash(dest)] {
						continue
					}
					t.Errorf("%s:%d: link %q: %s does not exist", page, n+1, target, dest)
					continue
				}
				if anchor != "" && strings.HasSuffix(dest, ".md") && !anchorsOf(dest)[anchor] {
					t.Errorf("%s:%d: link %q: %s has no heading with anchor #%s", page, n+1, target, dest, anchor)
				}
			}
		}
	}
	if checked < 20 {
		t.Fatalf("checked only %d links: the link pattern is broken", checked)
	}
}

// TestHeadingAnchors pins the anchor rule TestDocLinks relies on.
func TestHeadingAnchors(t *testing.T) {
	got := headingAnchors("# Many nodes: PostgreSQL (pgstore)\n```\n# not a heading\n```\n## `receiptctl`: inspect\n## Twice\n## Twice\n")
	for _, want := range []string{"many-nodes-postgresql-pgstore", "receiptctl-inspect", "twice", "twice-1"} {
		if !got[want] {
			t.Errorf("no anchor %q in %v", want, got)
		}
	}
	if got["not-a-heading"] {
		t.Errorf("a line in a code block made an anchor")
	}
}

// outsideCode returns the page's lines with those inside fenced code
// blocks blanked, so that line numbers stay right.
func outsideCode(page string) []string {
	lines := strings.Split(page, "\n")
	in := false
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			in = !in
			lines[i] = ""
			continue
		}
		if in {
			lines[i] = ""
		}
	}
	return lines
}

// headingAnchors returns the anchors GitHub gives a page's headings:
// lower case, letters, digits, '-' and '_' kept, spaces made '-', the
// rest dropped; a repeated anchor gets -1, -2, ...
func headingAnchors(page string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, l := range outsideCode(page) {
		if !strings.HasPrefix(l, "#") {
			continue
		}
		text := strings.TrimSpace(strings.TrimLeft(l, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(text) {
			switch {
			case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteByte('-')
			}
		}
		a := b.String()
		if n := seen[b.String()]; n > 0 {
			a += "-" + strconv.Itoa(n)
		}
		seen[b.String()]++
		out[a] = true
	}
	return out
}
