package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/intents"
	"github.com/stretchr/testify/require"
)

// consoleRun runs `receiptctl <store> console <args>` in-process until its context is
// cancelled: it returns the URL the command printed, and a stop func that cancels it and
// returns its exit code and stderr.
func consoleRun(t *testing.T, store []string, args ...string) (string, func() (int, string)) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	var stderr strings.Builder
	code := make(chan int, 1)
	go func() {
		c := runContext(ctx, append(append(append([]string{}, store...), "console"), args...), pw, &stderr)
		_ = pw.Close()
		code <- c
	}()
	var url string
	sc := bufio.NewScanner(pr)
	for sc.Scan() && url == "" {
		url = regexp.MustCompile(`http://127\.0\.0\.1:\d+/`).FindString(sc.Text())
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	stop := func() (int, string) {
		cancel()
		c := <-code
		return c, stderr.String()
	}
	if url == "" {
		c, e := stop()
		t.Fatalf("console printed no URL (exit %d): %s", c, e)
	}
	return url, stop
}

func getPage(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// receiptctl console serves the console of a store directory, and of a store on
// PostgreSQL, on a free loopback port it prints, until it is stopped; --read-only refuses
// changes.
func TestConsoleCommand(t *testing.T) {
	for name, store := range map[string]func(t *testing.T) []string{
		"dir": func(t *testing.T) []string { return []string{"--dir", newFixture(t)} },
		"pg":  func(t *testing.T) []string { return newPGFixture(t, receipts.Options{}) },
	} {
		t.Run(name, func(t *testing.T) {
			st := store(t)
			url, stop := consoleRun(t, st, "--read-only")
			status, body := getPage(t, url+"needs")
			require.Equal(t, http.StatusOK, status, body)
			require.Contains(t, body, "op-lost")
			require.Contains(t, body, "read-only")
			resp, err := http.Post(url+"settle", "application/x-www-form-urlencoded", strings.NewReader("k=x"))
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, http.StatusForbidden, resp.StatusCode)
			code, stderr := stop()
			require.Equal(t, exitOK, code, stderr)
		})
	}
	// --journal: the Host half page lists the journal's actions that need a person.
	jdir := t.TempDir()
	j, err := intents.Open(jdir, nil)
	require.NoError(t, err)
	_, err = j.Approve(context.Background(), intents.Approval{Target: "billing", Operation: "POST /v1/refunds", ApprovedBy: "ana"})
	require.NoError(t, err)
	require.NoError(t, j.Close())
	url, stop := consoleRun(t, []string{"--dir", newFixture(t)}, "--journal", jdir)
	status, body := getPage(t, url+"actions")
	require.Equal(t, http.StatusOK, status, body)
	require.Contains(t, body, "<h2>uncertain</h2>")
	code, stderr := stop()
	require.Equal(t, exitOK, code, stderr)
	cli(t, "--dir", newFixture(t), "console", "--journal-schema", "intents").requireCode(t, exitUsage)

	cli(t, "console").requireCode(t, exitUsage)
	cli(t, "--dir", t.TempDir(), "console").requireCode(t, exitProblem)
}
