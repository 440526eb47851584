package pgnodes

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestCrossNodeMutationCheck (RECEIPTS_MUTATION_CHECK=1; a few minutes) builds this package's
// tests with -tags receipts_mutate and shows that the cross-node harness passes unmutated and
// fails under each mutation that removes the fencing check or the claim's atomicity: nofence
// and nolock on Pebble, pgnofence and pgnoatomic on PostgreSQL.
func TestCrossNodeMutationCheck(t *testing.T) {
	if os.Getenv("RECEIPTS_MUTATION_CHECK") != "1" {
		t.Skip("set RECEIPTS_MUTATION_CHECK=1")
	}
	if os.Getenv(envRole) != "" {
		t.Skip("in a node process")
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	bin := filepath.Join(t.TempDir(), "pgnodes_mutate.test")
	if out, err := exec.Command(gobin, "test", "-c", "-tags", "receipts_mutate", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	cases := []struct{ harness, mutation string }{
		{"TestCrossNodePebble", ""}, {"TestCrossNodePebble", "nofence"}, {"TestCrossNodePebble", "nolock"},
		{"TestCrossNodePostgres", ""}, {"TestCrossNodePostgres", "pgnofence"}, {"TestCrossNodePostgres", "pgnoatomic"},
	}
	why := regexp.MustCompile(`duplicate effect|lost acknowledged|handed out twice|not linearizable|without receipt|disagree|committed .* but was told|node died`)
	var table strings.Builder
	table.WriteString("| harness | mutation | result | first violation | time |\n|---|---|---|---|---|\n")
	for _, c := range cases {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		cmd := exec.CommandContext(ctx, bin, "-test.run=^"+c.harness+"$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), "RECEIPTS_MUTATION="+c.mutation, "RECEIPTS_MUTATION_CHECK=",
			"RECEIPTS_PGNODES_SECONDS="+os.Getenv("RECEIPTS_PGNODES_SECONDS"), "RECEIPTS_SOAK=")
		if os.Getenv("RECEIPTS_PGNODES_SECONDS") == "" {
			cmd.Env = append(cmd.Env, "RECEIPTS_PGNODES_SECONDS=20", "RECEIPTS_PGNODES_KILLS=12")
		}
		var buf bytes.Buffer
		cmd.Stdout, cmd.Stderr = &buf, &buf
		start := time.Now()
		err := cmd.Run()
		cancel()
		failed := err != nil
		first := ""
		if failed {
			for _, line := range strings.Split(buf.String(), "\n") {
				if why.MatchString(line) {
					first = strings.TrimSpace(line)
					break
				}
			}
			if len(first) > 140 {
				first = first[:140]
			}
		}
		result := "pass"
		if failed {
			result = "FAIL (caught)"
		}
		table.WriteString("| " + c.harness + " | " + c.mutation + " | " + result + " | " + first + " | " + time.Since(start).Round(time.Second).String() + " |\n")
		switch {
		case c.mutation == "" && failed:
			t.Errorf("%s fails unmutated:\n%s", c.harness, buf.String())
		case c.mutation != "" && !failed:
			t.Errorf("%s survives mutation %s", c.harness, c.mutation)
		case c.mutation != "" && first == "":
			t.Errorf("%s under %s failed without naming a violation:\n%s", c.harness, c.mutation, buf.String())
		}
	}
	t.Logf("\n%s", table.String())
}
