package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the session in README.md")

// TestMain runs the host child when the example re-executes this binary.
func TestMain(m *testing.M) {
	if os.Getenv(envChild) != "" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

var (
	uuidRE = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}`)
	urlRE  = regexp.MustCompile(`http://127\.0\.0\.1:[0-9]+`)
)

// normalize replaces the keys (by order of appearance) and the port.
func normalize(s string) string {
	seen := map[string]string{}
	s = uuidRE.ReplaceAllStringFunc(s, func(k string) string {
		if _, ok := seen[k]; !ok {
			seen[k] = fmt.Sprintf("<key-%d>", len(seen)+1)
		}
		return seen[k]
	})
	return urlRE.ReplaceAllString(s, "http://127.0.0.1:PORT")
}

// TestSession runs the example and checks that README.md shows its
// session (go test -update rewrites it): the host dies twice and resumes
// with its keys, and the service's log has one effect per approval.
func TestSession(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), &out, options{dir: t.TempDir(), answers: "y,n,y"}); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	got := normalize(out.String())
	for _, want := range []string{
		"SIGKILL: the host dies before the service saw the call (effects at the service: 0)",
		"SIGKILL: the service sent the email, the host dies before the answer reached it (effects at the service: 2)",
		"host: resuming book_flight [run-1/call_1], approved by alice, not answered yet: same key <key-1>",
		"host: calling send_email under key <key-2>\nhost: send_email succeeded",
		"approvals: 2 (declined: 1)\neffects at the service: 2\nduplicate effects: 0\nhost restarts: 2\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the session lacks %q:\n%s", want, got)
		}
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	const begin, end = "<!-- session: go test ./examples/agent-host -update -->\n```\n", "```\n<!-- /session -->"
	i, j := bytes.Index(readme, []byte(begin)), bytes.Index(readme, []byte(end))
	if i < 0 || j < i {
		t.Fatalf("README.md has no session block (%q ... %q)", begin, end)
	}
	session := "$ go run ./examples/agent-host -answers y,n,y\n" + got
	if *update {
		readme = append(append(append([]byte(nil), readme[:i+len(begin)]...), session...), readme[j:]...)
		if err := os.WriteFile("README.md", readme, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if have := string(readme[i+len(begin) : j]); have != session {
		t.Errorf("README.md's session is not what the example prints (go test ./examples/agent-host -update):\n--- README\n%s--- run\n%s", have, session)
	}
}
