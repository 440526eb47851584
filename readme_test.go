package receipts_test

import (
	"os"
	"strings"
	"testing"
)

// TestReadmeQuickStartIsTheExample keeps the README's Quick start identical
// to example_quickstart_test.go, so the code users copy is the code go test
// compiles and checks against its // Output:.
func TestReadmeQuickStartIsTheExample(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	example, err := os.ReadFile("example_quickstart_test.go")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n## Quick start\n")
	if !ok {
		t.Fatal("README.md has no \"## Quick start\" section")
	}
	_, block, ok := strings.Cut(section, "\n```go\n")
	if !ok {
		t.Fatal("README.md's Quick start has no ```go block")
	}
	block, _, ok = strings.Cut(block, "\n```\n")
	if !ok {
		t.Fatal("README.md's Quick start block is not closed")
	}
	if got, want := block+"\n", string(example); got != want {
		t.Errorf("README.md's Quick start differs from example_quickstart_test.go:\n--- README\n%s\n--- example_quickstart_test.go\n%s", got, want)
	}
}
