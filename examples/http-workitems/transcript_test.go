package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/internal/transcript"
	"github.com/receiptstore/receipts/receiptsprom"
)

// TestReadmeTranscript plays the README's curl session against the service
// on a real listener and checks the README shows what the server sent
// (times, ids and measured values aside). `go test -run TestReadmeTranscript
// -update` writes it.
func TestReadmeTranscript(t *testing.T) {
	const delay = 2 * time.Second // the README's -delay: long enough to send a duplicate meanwhile
	metrics := receiptsprom.New(nil)
	db, err := receipts.Open(t.TempDir(), &receipts.Options{GCInterval: -1, Observer: metrics})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	items, err := newPebbleItems(db)
	if err != nil {
		t.Fatal(err)
	}
	s := &service{db: db, items: items, tokens: map[string]string{"alice-token": "alice", "bob-token": "bob"}, delay: delay, now: time.Now}
	h, err := s.handler()
	if err != nil {
		t.Fatal(err)
	}
	api := httptest.NewServer(h)
	defer api.Close()
	admin := httptest.NewServer(adminMux(db, metrics))
	defer admin.Close()

	var out strings.Builder
	// curl -si: the command, then the status line, the headers (without
	// Date and Content-Length) and the body.
	curl := func(show bool, method, path, key, body string) {
		t.Helper()
		if out.Len() > 0 && !strings.HasSuffix(out.String(), "sleep 0.5\n") {
			out.WriteString("\n")
		}
		cmd := "curl -si"
		if !show {
			cmd = "curl -s -o /dev/null"
		}
		if method != "GET" {
			cmd += " -X " + method
		}
		cmd += " localhost:8080" + path + " -H 'Authorization: Bearer alice-token'"
		if key != "" {
			cmd += " -H 'Idempotency-Key: " + key + "'"
		}
		if body != "" {
			cmd += " -d '" + body + "'"
		}
		req, err := http.NewRequest(method, api.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer alice-token")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		if body != "" {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded") // what curl -d sends
		}
		if !show {
			fmt.Fprintf(&out, "$ %s & sleep 0.5\n", cmd)
			go func() {
				if resp, err := http.DefaultClient.Do(req); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}()
			waitPending(t, db, key) // instead of the sleep: the first request holds its claim
			return
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&out, "$ %s\n%s %s\n", cmd, resp.Proto, resp.Status)
		keys := make([]string, 0, len(resp.Header))
		for k := range resp.Header {
			if k != "Date" && k != "Content-Length" {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		for _, k := range keys {
			for _, v := range resp.Header[k] {
				fmt.Fprintf(&out, "%s: %s\n", k, v)
			}
		}
		fmt.Fprintf(&out, "\n%s\n", strings.TrimRight(string(b), "\n"))
	}
	curl(true, "POST", "/v1/work-items", "op-1", `{"title":"Write the report"}`)
	curl(true, "POST", "/v1/work-items", "op-1", `{ "title": "Write the report" }`)
	curl(true, "POST", "/v1/work-items", "op-1", `{"title":"Something else"}`)
	curl(true, "POST", "/v1/work-items", "", `{"title":"No key"}`)
	curl(false, "POST", "/v1/work-items", "op-2", `{"title":"Book the room"}`)
	curl(true, "POST", "/v1/work-items", "op-2", `{"title":"Book the room"}`)
	waitSettled(t, db, "op-2")
	out.WriteString("\n$ curl -s localhost:8080/v1/work-items -H 'Authorization: Bearer alice-token'\n")
	req, err := http.NewRequest("GET", api.URL+"/v1/work-items", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer alice-token")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	out.Write(b)
	transcript.Check(t, "README.md", "session", out.String(), normalize)

	// The metrics the session left, as the README's scrape shows them.
	resp, err = http.Get(admin.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var scrape strings.Builder
	scrape.WriteString("$ curl -s localhost:8081/metrics | grep '^receipts_' | grep -v _bucket\n")
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if l := sc.Text(); strings.HasPrefix(l, "receipts_") && !strings.Contains(l, "_bucket") {
			scrape.WriteString(l + "\n")
		}
	}
	transcript.Check(t, "README.md", "metrics", scrape.String(), normalize)
}

var volatile = []struct {
	re   *regexp.Regexp
	with string
}{
	{regexp.MustCompile(`wi_[A-Za-z0-9_-]{16}`), "wi_ID"},
	{regexp.MustCompile(`[A-Z][a-z]{2}, \d\d [A-Z][a-z]{2} \d{4} \d\d:\d\d:\d\d GMT`), "DATE"},
	{regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z`), "TIME"},
	{regexp.MustCompile(`(?m)^(Retry-After:) \d+$`), "$1 N"},
	// measured values: durations, the store's bytes and Pebble's own counts
	{regexp.MustCompile(`(?m)^((receipts_operation_duration_seconds_sum|receipts_pebble_\w+)\{[^}]*\}) \S+$`), "$1 N"},
}

// normalize blanks what differs between runs: ids (from the store's secret),
// times, and measured values.
func normalize(s string) string {
	for _, v := range volatile {
		s = v.re.ReplaceAllString(s, v.with)
	}
	return s
}

// waitPending waits until alice's key is claimed and not yet finished.
func waitPending(t *testing.T, db *receipts.DB, id string) {
	t.Helper()
	waitState(t, db, id, receipts.Pending)
}

// waitSettled waits until alice's key has its receipt.
func waitSettled(t *testing.T, db *receipts.DB, id string) {
	t.Helper()
	waitState(t, db, id, receipts.Succeeded)
}

func waitState(t *testing.T, db *receipts.DB, id string, want receipts.State) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		for r, err := range db.Scan(ctx, receipts.Filter{Scope: "alice", State: want}) {
			if err != nil {
				t.Fatal(err)
			}
			if r.Key.ID == id {
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s never reached %v", id, want)
		case <-time.After(10 * time.Millisecond):
		}
	}
}
