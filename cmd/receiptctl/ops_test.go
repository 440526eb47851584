package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/receiptstore/receipts/receipthttp"
	"github.com/stretchr/testify/require"
)

// version names receiptctl's module version, Go, Pebble and pgx.
func TestVersion(t *testing.T) {
	out := cli(t, "version").requireCode(t, exitOK).out
	for _, want := range []string{"receiptctl", "go\t", "go1.", "pebble", "v2.", "pgx", "v5."} {
		require.Contains(t, strings.ReplaceAll(out, "  ", "\t"), strings.TrimSuffix(want, "\t"), out)
	}
	var v versionInfo
	require.NoError(t, json.Unmarshal([]byte(cli(t, "version", "--json").requireCode(t, exitOK).out), &v))
	require.True(t, strings.HasPrefix(v.Go, "go1."), "%+v", v)
	require.True(t, strings.HasPrefix(v.Pebble, "v2."), "%+v", v)
	require.True(t, strings.HasPrefix(v.Pgx, "v5."), "%+v", v)
}

// cobra's completion command is on.
func TestCompletion(t *testing.T) {
	for _, shell := range []string{"bash", "zsh", "fish", "powershell"} {
		out := cli(t, "completion", shell).requireCode(t, exitOK).out
		require.Contains(t, out, "receiptctl", shell)
	}
}

// Every kind of bad input exits 2: an empty part and an over-long part
// alike (a 300-byte ID exited 1 before), offline and live.
func TestBadInputExitCode(t *testing.T) {
	dir := newFixture(t)
	long := strings.Repeat("x", 300)
	for _, args := range [][]string{
		{"--dir", dir, "get", "", "op"},
		{"--dir", dir, "get", "acct_1", long},
		{"--dir", dir, "get", long, "op"},
		{"--dir", dir, "ls", "--scope", long},
		{"--dir", dir, "ls", "--state", "nonsense"},
		{"--dir", dir, "ls", "--limit", "-1"},
	} {
		r := cli(t, args...)
		require.Equal(t, exitUsage, r.code, "%q: stdout %s stderr %s", args, r.out, r.stderr)
	}
}

// Offline, stats says what it cannot know instead of printing zeros and
// "none".
func TestStatsOfflineUnknown(t *testing.T) {
	dir := newFixture(t)
	out := cli(t, "--dir", dir, "stats").requireCode(t, exitOK).out
	require.Contains(t, out, "unknown offline")
	require.NotContains(t, out, "last gc\tnone")
	require.NotContains(t, out, "none since the store was opened")
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(cli(t, "--dir", dir, "stats", "--json").requireCode(t, exitOK).out), &m))
	for _, k := range []string{"counters", "last_gc", "waiters", "replay_cache_entries"} {
		require.NotContains(t, m, k)
	}
	require.Contains(t, m, "unknown_offline")
	require.EqualValues(t, 3, m["succeeded"])
}

// ls and get show a response stored by receipthttp as status, headers and
// body, and a JSON result (an MCP tool result) as JSON; wide keys are cut
// in tables and whole in JSON.
func TestResultsAndWideKeys(t *testing.T) {
	dir := t.TempDir()
	db, err := receipts.Open(dir, &receipts.Options{GCInterval: -1})
	require.NoError(t, err)
	mw, err := receipthttp.New(db, receipthttp.Config{Scope: func(*http.Request) (string, error) { return "alice", nil }})
	require.NoError(t, err)
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/v1/items/7")
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(`{"id":7,"title":"Write the report"}`))
	}))
	r := httptest.NewRequest(http.MethodPost, "/v1/items", strings.NewReader("x"))
	r.Header.Set("Idempotency-Key", "op-http")
	h.ServeHTTP(httptest.NewRecorder(), r)
	wide := strings.Repeat("w", 255)
	mcpResult := []byte(`{"content":[{"type":"text","text":"work item #1"}],"structuredContent":{"id":1}}`)
	for id, res := range map[string][]byte{"op-mcp": mcpResult, wide: []byte("ok")} {
		_, err = db.Do(context.Background(), receipts.Key{Scope: "alice", ID: id}, fp, func(context.Context, *receipts.Lease) ([]byte, error) { return res, nil })
		require.NoError(t, err)
	}
	require.NoError(t, db.Close())

	got := cli(t, "--dir", dir, "get", "alice", "op-http").requireCode(t, exitOK).out
	for _, want := range []string{"HTTP 201 Created", "Content-Type: application/json", "Location: /v1/items/7", `"title": "Write the report"`} {
		require.Contains(t, got, want)
	}
	got = cli(t, "--dir", dir, "get", "alice", "op-mcp").requireCode(t, exitOK).out
	require.Contains(t, got, `"text": "work item #1"`)

	ls := cli(t, "--dir", dir, "ls").requireCode(t, exitOK).out
	require.Contains(t, ls, `HTTP 201 application/json {"id":7,`)
	require.Contains(t, ls, `{"content":[{"type":"text"`)
	require.NotContains(t, ls, "base64:")
	cutID := strings.Repeat("w", keyCellWidth-1) + "…"
	require.Contains(t, ls, cutID)
	require.NotContains(t, ls, wide)
	for _, line := range strings.Split(ls, "\n") {
		require.Less(t, len([]rune(line)), 200, "a wide key stretched the table: %q", line)
	}
	js := cli(t, "--dir", dir, "ls", "--json").requireCode(t, exitOK).out
	require.Contains(t, js, wide)
	require.Contains(t, cli(t, "--dir", dir, "get", "alice", wide).requireCode(t, exitOK).out, wide)
}

// The progress line of verify and gc: the records done and the time, then
// cleared; and none when stderr is not a terminal.
func TestTicker(t *testing.T) {
	var buf syncBuf
	tk := startTicker(&buf, "verifying", time.Millisecond)
	tk.set(2048)
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(buf.String(), "verifying: 2048 records") && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	tk.end()
	out := buf.String()
	require.Contains(t, out, "\rverifying: 2048 records, ")
	require.True(t, strings.HasSuffix(out, "\r\033[K"), "%q", out)

	a := &app{stderr: &bytes.Buffer{}}
	off := a.startTicker("gc")
	require.Nil(t, off.w)
	off.end()
}

// verify reports its progress through receipts.WithProgress: on a store
// of 3000 records the callback sees 1024 and 2048 go by.
func TestVerifyProgress(t *testing.T) {
	dir := t.TempDir()
	db, err := receipts.Open(dir, &receipts.Options{GCInterval: -1})
	require.NoError(t, err)
	for i := range 3000 {
		_, err := pebblestore.DoBatch(context.Background(), db, receipts.Key{Scope: "s", ID: fmt.Sprint("op-", i)}, fp, func(context.Context, *receipts.Lease, *pebble.Batch) ([]byte, error) { return []byte("ok"), nil })
		require.NoError(t, err)
	}
	var seen []int
	rep, err := db.Check(receipts.WithProgress(context.Background(), func(n int) { seen = append(seen, n) }))
	require.NoError(t, err)
	require.NoError(t, db.Close())
	require.Equal(t, 3000, rep.Records)
	require.Contains(t, seen, 1024)
	require.Contains(t, seen, 2048)
}

type syncBuf struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuf) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuf) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
