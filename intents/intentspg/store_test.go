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
