package intentspg_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/receiptstore/receipts/intents"
	"github.com/receiptstore/receipts/intents/intentspg"
	"github.com/receiptstore/receipts/intents/internal/intentsmodel"
	"github.com/receiptstore/receipts/internal/pgtest"
	"github.com/receiptstore/receipts/internal/testkit"
	"go.uber.org/goleak"
	"pgregory.net/rapid"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func leakCheck(t *testing.T) {
	t.Helper()
	opts := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opts) })
}

func pool(t *testing.T) (*pgxpool.Pool, string) {
	t.Helper()
	dsn, schema := pgtest.Schema(t)
	p, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p, schema
}

// TestModel runs the journal's model (intents/internal/intentsmodel) on the
// PostgreSQL store, reopening it now and then.
func TestModel(t *testing.T) {
	leakCheck(t)
	p, schema := pool(t)
	ctx := context.Background()
	checks := 100
	if testkit.Soak() {
		checks = 2000
	}
	open := func(t *rapid.T) intents.Store {
		s, err := intentspg.NewStore(ctx, p, &intentspg.Options{Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	testkit.RunRapid(t, checks, func(rt *rapid.T) {
		if _, err := p.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
			rt.Fatal(err)
		}
		intentsmodel.Model(rt, intentsmodel.Engine{Open: open, Reopen: open, Micro: true})
	})
}

// TestApproveSurvivesServerCrash crashes PostgreSQL (an immediate
// shutdown) right after Approve returned, and after an answer was
// recorded: both are there after the restart.
func TestApproveSurvivesServerCrash(t *testing.T) {
	leakCheck(t)
	p, schema := pool(t)
	ctx := context.Background()
	j, err := intentspg.Open(ctx, p, &intentspg.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	a, err := j.Approve(ctx, intents.Approval{Target: "billing", Operation: "POST /v1/charges",
		Arguments: map[string]any{"amount": 1.5, "to": "x"}, ApprovedBy: "alice", Ref: "run/1"})
	if err != nil {
		t.Fatal(err)
	}
	if err := pgtest.Restart(t); errors.Is(err, pgtest.ErrExternal) {
		t.Skip(err)
	} else if err != nil {
		t.Fatal(err)
	}
	var got *intents.Action
	for range 50 { // the pool reconnects
		if got, err = j.Get(ctx, a.Key); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	if got.State != intents.Approved || string(got.Arguments) != `{"amount":1.5,"to":"x"}` || got.Ref != "run/1" || !got.Deadline.Equal(a.Deadline) {
		t.Fatalf("after a crash: %+v (%s), approved %+v", got, got.Arguments, a)
	}
}

func TestOpenBadInput(t *testing.T) {
	leakCheck(t)
	p, schema := pool(t)
	ctx := context.Background()
	if _, err := intentspg.Open(ctx, nil, nil); !errors.Is(err, intents.ErrInvalid) {
		t.Errorf("nil pool: %v", err)
	}
	for _, s := range []string{"Bad", "a-b", "x;drop", "0abc"} {
		if _, err := intentspg.Open(ctx, p, &intentspg.Options{Schema: s}); !errors.Is(err, intents.ErrInvalid) {
			t.Errorf("schema %q: %v", s, err)
		}
	}
	j, err := intentspg.Open(ctx, p, &intentspg.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	_ = j.Close()
	if _, err := p.Exec(ctx, "UPDATE "+schema+".meta SET format = 99"); err != nil {
		t.Fatal(err)
	}
	if _, err := intentspg.Open(ctx, p, &intentspg.Options{Schema: schema}); !errors.Is(err, intents.ErrUnknownFormat) {
		t.Fatalf("format 99: %v", err)
	}
}

// TestConcurrentOpen: hosts starting at once on a new schema all open it.
func TestConcurrentOpen(t *testing.T) {
	leakCheck(t)
	p, schema := pool(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make([]error, 6)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			j, err := intentspg.Open(ctx, p, &intentspg.Options{Schema: schema})
			if err == nil {
				_ = j.Close()
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

// openAtOnce opens n journals in schema of dsn at once, each through a
// pool of its own (as n replicas starting together have), and returns the
// errors.
func openAtOnce(t *testing.T, dsn, schema string, n int) []error {
	t.Helper()
	ctx := context.Background()
	pools := make([]*pgxpool.Pool, n)
	for i := range pools {
		p, err := pgxpool.New(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		if err := p.Ping(ctx); err != nil { // connected before the start
			t.Fatal(err)
		}
		pools[i] = p
	}
	start := make(chan struct{})
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, p := range pools {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			j, err := intentspg.Open(ctx, p, &intentspg.Options{Schema: schema})
			if err == nil {
				err = j.Close()
			}
			errs[i] = err
		}()
	}
	close(start)
	wg.Wait()
	return errs
}

// TestReplicasStartAtOnceOnAnEmptyDatabase: eight hosts open the default
// schema of a new, empty database at the same moment, each with its own
// pool: every open succeeds (concurrent CREATE ... IF NOT EXISTS is not
// safe in PostgreSQL; the creation is serialized by an advisory lock).
func TestReplicasStartAtOnceOnAnEmptyDatabase(t *testing.T) {
	leakCheck(t)
	for round := range 3 {
		dsn := pgtest.Database(t)
		for i, err := range openAtOnce(t, dsn, intentspg.DefaultSchema, 8) {
			if err != nil {
				t.Fatalf("round %d, replica %d: %v", round, i, err)
			}
		}
	}
}

// TestOpenAddsTheLeaseColumns: a journal made before delivery leases (no
// holder, no lease_until) with an approved action in it is opened by six
// hosts at once: each open succeeds, the columns are added once (and
// uncertain_step, which came after them), the
// format stays 1, and the action is then delivered under a lease.
func TestOpenAddsTheLeaseColumns(t *testing.T) {
	leakCheck(t)
	ctx := context.Background()
	p, schema := pool(t)
	for _, q := range []string{
		`CREATE SCHEMA ` + schema,
		`CREATE TABLE ` + schema + `.meta (format int NOT NULL)`,
		`INSERT INTO ` + schema + `.meta (format) VALUES (1)`,
		`CREATE TABLE ` + schema + `.actions (
	key         text PRIMARY KEY,
	ref         text UNIQUE,
	state       smallint NOT NULL CHECK (state BETWEEN 1 AND 6),
	target      text NOT NULL,
	operation   text NOT NULL,
	arguments   json NOT NULL,
	approved_by text NOT NULL,
	approved_at timestamptz NOT NULL,
	deadline    timestamptz NOT NULL,
	attempts    bigint NOT NULL DEFAULT 0,
	last_error  text NOT NULL DEFAULT '',
	answer      jsonb,
	updated_at  timestamptz NOT NULL)`,
		`CREATE INDEX actions_state ON ` + schema + `.actions (state, key)`,
		`INSERT INTO ` + schema + `.actions (key, state, target, operation, arguments, approved_by, approved_at, deadline, attempts, updated_at)
 VALUES ('01a24000-0000-7000-8000-000000000001', 1, 'svc', 'POST /x', '{}', 'alice', now(), now() + interval '1 hour', 3, now())`,
	} {
		if _, err := p.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	dsn, _ := pgtest.Schema(t)
	for i, err := range openAtOnce(t, dsn, schema, 6) {
		if err != nil {
			t.Fatalf("host %d: %v", i, err)
		}
	}
	var cols, f int
	if err := p.QueryRow(ctx, `SELECT count(*) FROM information_schema.columns WHERE table_schema = $1 AND table_name = 'actions'
 AND column_name IN ('holder', 'lease_until', 'uncertain_step')`, schema).Scan(&cols); err != nil || cols != 3 {
		t.Fatalf("lease columns: %d, %v", cols, err)
	}
	if err := p.QueryRow(ctx, `SELECT format FROM `+schema+`.meta`).Scan(&f); err != nil || f != 1 {
		t.Fatalf("format %d, %v", f, err)
	}
	svc := newSharedService(t)
	j, err := intentspg.Open(ctx, p, &intentspg.Options{Schema: schema, Journal: &intents.Options{PollInterval: 20 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	key := "01a24000-0000-7000-8000-000000000001"
	if a, err := j.Get(ctx, key); err != nil || a.Holder != "" || !a.LeaseUntil.IsZero() || a.Attempts != 3 || a.UncertainStep != "" {
		t.Fatalf("the old action: %+v, %v", a, err)
	}
	d, err := intents.NewDispatcher(j, intents.DispatcherOptions{HostName: "new-host",
		Transports: map[string]intents.Transport{"svc": &intents.HTTPTransport{BaseURL: svc.srv.URL}}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	a, err := j.Wait(wctx, key)
	if err != nil {
		t.Fatal(err)
	}
	svc.mu.Lock()
	defer svc.mu.Unlock()
	if a.State != intents.Succeeded || a.Attempts != 4 || svc.requests[key] != 1 || a.Holder != "" {
		t.Fatalf("%v, Attempts %d, %d deliveries, holder %q", a.State, a.Attempts, svc.requests[key], a.Holder)
	}
}
