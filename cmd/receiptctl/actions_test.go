package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/receiptstore/receipts/intents"
	"github.com/receiptstore/receipts/intents/intentspg"
	"github.com/receiptstore/receipts/internal/pgtest"
	"github.com/stretchr/testify/require"
)

// fillJournal approves three actions in j and delivers them to a real
// HTTP service: one succeeds, one is refused (400), one goes to a route
// that is down until its deadline (uncertain), naming the step of its
// action that was uncertain.
func fillJournal(t *testing.T, j *intents.Journal) {
	t.Helper()
	ctx := context.Background()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/ok":
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{"id":"wi_1"}`))
		case "/bad":
			http.Error(w, "no title", http.StatusBadRequest)
		default: // the service's action died in its step "charge": outcome unknown
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"type":"https://receipts.dev/problems/outcome-unknown","status":503,"step":"charge"}`))
		}
	}))
	defer srv.Close()
	d, err := intents.NewDispatcher(j, intents.DispatcherOptions{
		Transports: map[string]intents.Transport{"workitems": &intents.HTTPTransport{BaseURL: srv.URL}},
		MinBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond,
	})
	require.NoError(t, err)
	defer d.Close()
	var keys []string
	for _, op := range []string{"POST /ok", "POST /bad", "POST /down"} {
		// Only /down must run out of time (it turns uncertain); the others answer at once,
		// and get a deadline a loaded machine cannot miss.
		deadline := time.Now().Add(30 * time.Second)
		if op == "POST /down" {
			deadline = time.Now().Add(300 * time.Millisecond)
		}
		a, err := j.Approve(ctx, intents.Approval{Target: "workitems", Operation: op, Arguments: map[string]string{"title": "x"},
			ApprovedBy: "alice", Deadline: deadline})
		require.NoError(t, err)
		keys = append(keys, a.Key)
	}
	for _, k := range keys {
		wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		_, err := j.Wait(wctx, k)
		cancel()
		require.NoError(t, err)
	}
}

func TestActions(t *testing.T) {
	dir := t.TempDir()
	j, err := intents.Open(dir, nil)
	require.NoError(t, err)
	fillJournal(t, j)

	// A running host holds the directory.
	r := cli(t, "actions", dir).requireCode(t, exitProblem)
	require.Contains(t, r.stderr, "a running host holds it")
	require.NoError(t, j.Close())

	r = cli(t, "actions", dir).requireCode(t, exitOK)
	require.Contains(t, r.out, "3 actions: 1 uncertain, 1 failed, 1 succeeded")
	require.Regexp(t, `(?m)^KEY\s+TARGET\s+OPERATION\s+APPROVED BY\s+APPROVED\s+DEADLINE\s+ATTEMPTS\s+UNCERTAIN STEP\s+ANSWER$`, r.out)
	require.Regexp(t, `(?s)UNCERTAIN.*POST /down.*\scharge\s+.*503 Service Unavailable \(step "charge" uncertain\)\n.*FAILED.*POST /bad.*400 no title\n.*SUCCEEDED.*POST /ok.*201 \{"id":"wi_1"\}`, r.out)

	r = cli(t, "actions", dir, "--state", "uncertain").requireCode(t, exitOK)
	require.Contains(t, r.out, "1 action: 1 uncertain")
	require.NotContains(t, r.out, "POST /ok")

	r = cli(t, "--json", "actions", dir).requireCode(t, exitOK)
	var acts []intents.Action
	require.NoError(t, json.Unmarshal([]byte(r.out), &acts))
	require.Len(t, acts, 3)
	require.Equal(t, intents.Uncertain, acts[0].State)
	require.Equal(t, "charge", acts[0].UncertainStep)
	require.Contains(t, r.out, `"uncertain_step": "charge"`)
	require.Equal(t, intents.Succeeded, acts[2].State)
	require.JSONEq(t, `{"title":"x"}`, string(acts[2].Arguments))

	cli(t, "actions").requireCode(t, exitUsage)
	cli(t, "actions", dir, "--state", "done").requireCode(t, exitUsage)
	cli(t, "--dir", dir, "actions").requireCode(t, exitUsage)
	empty := t.TempDir()
	r = cli(t, "actions", empty).requireCode(t, exitProblem)
	require.Contains(t, r.stderr, "no journal")
	entries, _ := readDirNames(empty)
	require.Empty(t, entries, "actions created something in an empty directory")
}

func TestActionsPG(t *testing.T) {
	dsn, schema := pgtest.Schema(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	require.NoError(t, err)
	defer pool.Close()
	r := cli(t, "--pg", dsn, "--schema", schema, "actions").requireCode(t, exitProblem)
	require.Contains(t, r.stderr, "no journal in schema")
	j, err := intentspg.Open(ctx, pool, &intentspg.Options{Schema: schema})
	require.NoError(t, err)
	fillJournal(t, j)
	// Next to the running host: PostgreSQL has no directory lock.
	r = cli(t, "--pg", dsn, "--schema", schema, "actions").requireCode(t, exitOK)
	require.Contains(t, r.out, "3 actions: 1 uncertain, 1 failed, 1 succeeded")
	require.Regexp(t, `POST /down.*\scharge\s`, r.out, "the uncertain step, kept by intentspg")
	require.NoError(t, j.Close())
}

func readDirNames(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names, err
}

// TestActionsShowsTheHolder: on a journal shared by hosts, an approved
// action in delivery shows the host that holds its lease and until when,
// and one whose holder died shows that its lease ended.
func TestActionsShowsTheHolder(t *testing.T) {
	dsn, schema := pgtest.Schema(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	require.NoError(t, err)
	defer pool.Close()
	j, err := intentspg.Open(ctx, pool, &intentspg.Options{Schema: schema})
	require.NoError(t, err)
	defer j.Close()
	arrived, release := make(chan struct{}, 1), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-release
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	defer close(release)
	dead, err := j.Approve(ctx, intents.Approval{Target: "elsewhere", Operation: "POST /y", ApprovedBy: "bob"})
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE `+schema+`.actions SET holder = 'web-2:99', lease_until = now() - interval '1 minute' WHERE key = $1`, dead.Key)
	require.NoError(t, err)
	d, err := intents.NewDispatcher(j, intents.DispatcherOptions{HostName: "web-1",
		Transports: map[string]intents.Transport{"workitems": &intents.HTTPTransport{BaseURL: srv.URL}}})
	require.NoError(t, err)
	defer d.Close()
	a, err := j.Approve(ctx, intents.Approval{Target: "workitems", Operation: "POST /x", ApprovedBy: "alice"})
	require.NoError(t, err)
	<-arrived // web-1 holds it, its attempt in flight

	r := cli(t, "--pg", dsn, "--schema", schema, "actions").requireCode(t, exitOK)
	require.Contains(t, r.out, "HELD BY")
	require.Regexp(t, a.Key+`.*web-1 until [0-9-]+ [0-9:.]+ \(in [0-9]+s\)`, r.out)
	require.Regexp(t, dead.Key+`.*web-2:99 until [0-9-]+ [0-9:.]+ \(ended: another host may take it\)`, r.out)

	r = cli(t, "--pg", dsn, "--schema", schema, "--json", "actions").requireCode(t, exitOK)
	var acts []intents.Action
	require.NoError(t, json.Unmarshal([]byte(r.out), &acts))
	held := map[string]intents.Action{}
	for _, x := range acts {
		held[x.Key] = x
	}
	require.Equal(t, "web-1", held[a.Key].Holder)
	require.True(t, held[a.Key].LeaseUntil.After(time.Now()))
	require.Equal(t, "web-2:99", held[dead.Key].Holder)
}
