package intents_test

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/intents"
	"github.com/receiptstore/receipts/receiptstest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(lockChildEnv); dir != "" {
		lockChild(dir) // never returns
	}
	goleak.VerifyTestMain(m)
}

var t0 = time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)

// openMem opens a journal on fs with a fake clock.
func openMem(t *testing.T, fs vfs.FS, clk *receiptstest.Clock) *intents.Journal {
	t.Helper()
	j, err := intents.Open("journal", &intents.Options{Now: clk.Now, Pebble: &pebble.Options{FS: fs}})
	if err != nil {
		t.Fatal(err)
	}
	return j
}

func approval(args any) intents.Approval {
	return intents.Approval{Target: "billing", Operation: "POST /v1/charges", Arguments: args, ApprovedBy: "alice"}
}

func list(t *testing.T, j *intents.Journal, st intents.State) []*intents.Action {
	t.Helper()
	var out []*intents.Action
	for a, err := range j.List(context.Background(), st) {
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, a)
	}
	return out
}

func TestApproveMintsAKeyPerApproval(t *testing.T) {
	ctx := context.Background()
	clk := receiptstest.NewClock(t0)
	j := openMem(t, vfs.NewMem(), clk)
	defer j.Close()
	args := map[string]any{"amount_cents": 1299, "currency": "EUR"}
	a, err := j.Approve(ctx, approval(args))
	if err != nil {
		t.Fatal(err)
	}
	b, err := j.Approve(ctx, approval(args))
	if err != nil {
		t.Fatal(err)
	}
	if a.Key == b.Key {
		t.Fatalf("two approvals with the same arguments share key %s", a.Key)
	}
	for _, x := range []*intents.Action{a, b} {
		if mint, ok := receipts.UUIDv7Time(x.Key); !ok || !mint.Equal(t0) {
			t.Fatalf("key %q: not a UUIDv7 minted at %v (%v, %v)", x.Key, t0, mint, ok)
		}
		if x.State != intents.Approved || !x.Deadline.Equal(t0.Add(intents.DefaultDeliverFor)) || x.ApprovedBy != "alice" {
			t.Fatalf("approved action: %+v", x)
		}
		if string(x.Arguments) != `{"amount_cents":1299,"currency":"EUR"}` {
			t.Fatalf("arguments %s", x.Arguments)
		}
	}
	got := list(t, j, intents.Approved)
	if len(got) != 2 || got[0].Key != a.Key && got[0].Key != b.Key {
		t.Fatalf("List(Approved) = %v", got)
	}
}

func TestApproveRefReturnsTheSameAction(t *testing.T) {
	ctx := context.Background()
	clk := receiptstest.NewClock(t0)
	j := openMem(t, vfs.NewMem(), clk)
	defer j.Close()
	ap := approval(json.RawMessage(`{"amount_cents": 1299}`))
	ap.Ref = "run-7/call_abc"
	a, err := j.Approve(ctx, ap)
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Minute)
	ap.Arguments = map[string]int{"amount_cents": 1299} // the same JSON, spelled otherwise
	again, err := j.Approve(ctx, ap)
	if err != nil {
		t.Fatal(err)
	}
	if again.Key != a.Key || !again.Deadline.Equal(a.Deadline) {
		t.Fatalf("approving ref %q again: key %s deadline %v, want %s %v", ap.Ref, again.Key, again.Deadline, a.Key, a.Deadline)
	}
	ap.Arguments = map[string]int{"amount_cents": 9999}
	if _, err := j.Approve(ctx, ap); !errors.Is(err, intents.ErrRefConflict) {
		t.Fatalf("same ref, other arguments: %v, want ErrRefConflict", err)
	}
	if n := len(list(t, j, 0)); n != 1 {
		t.Fatalf("%d actions, want 1", n)
	}
}

func TestApproveBadInputChangesNothing(t *testing.T) {
	ctx := context.Background()
	clk := receiptstest.NewClock(t0)
	j := openMem(t, vfs.NewMem(), clk)
	defer j.Close()
	ok := approval(map[string]any{"x": 1})
	long := strings.Repeat("x", intents.MaxFieldLen+1)
	cases := []struct {
		name string
		edit func(*intents.Approval)
		want error
	}{
		{"empty target", func(a *intents.Approval) { a.Target = "" }, intents.ErrEmptyTarget},
		{"empty operation", func(a *intents.Approval) { a.Operation = "" }, intents.ErrEmptyOperation},
		{"no approver", func(a *intents.Approval) { a.ApprovedBy = "" }, intents.ErrNoApprover},
		{"channel arguments", func(a *intents.Approval) { a.Arguments = make(chan int) }, intents.ErrBadArguments},
		{"function arguments", func(a *intents.Approval) { a.Arguments = map[string]any{"f": func() {}} }, intents.ErrBadArguments},
		{"NaN arguments", func(a *intents.Approval) { a.Arguments = math.NaN() }, intents.ErrBadArguments},
		{"raw arguments not JSON", func(a *intents.Approval) { a.Arguments = json.RawMessage(`{"x":`) }, intents.ErrBadArguments},
		{"arguments too large", func(a *intents.Approval) { a.Arguments = strings.Repeat("y", intents.MaxArgumentsSize) }, intents.ErrBadArguments},
		{"deadline in the past", func(a *intents.Approval) { a.Deadline = t0.Add(-time.Second) }, intents.ErrDeadlinePassed},
		{"deadline now", func(a *intents.Approval) { a.Deadline = t0 }, intents.ErrDeadlinePassed},
		{"target too long", func(a *intents.Approval) { a.Target = long }, intents.ErrTooLong},
		{"ref too long", func(a *intents.Approval) { a.Ref = long }, intents.ErrTooLong},
	}
	for _, c := range cases {
		ap := ok
		c.edit(&ap)
		_, err := j.Approve(ctx, ap)
		if !errors.Is(err, c.want) || !errors.Is(err, intents.ErrInvalid) {
			t.Errorf("%s: %v, want %v (and ErrInvalid)", c.name, err, c.want)
		}
	}
	if n := len(list(t, j, 0)); n != 0 {
		t.Fatalf("bad approvals left %d actions", n)
	}
}

// TestApproveIsDurableBeforeItReturns crashes the file system right after
// Approve (and after Settle) returns: the clone keeps what was synced only.
func TestApproveIsDurableBeforeItReturns(t *testing.T) {
	ctx := context.Background()
	clk := receiptstest.NewClock(t0)
	fs := vfs.NewCrashableMem()
	j := openMem(t, fs, clk)
	a, err := j.Approve(ctx, approval(map[string]any{"n": 1}))
	if err != nil {
		t.Fatal(err)
	}
	crashed := fs.CrashClone(vfs.CrashCloneCfg{})
	_ = j.Close()

	j = openMem(t, crashed, clk)
	got, err := j.Get(ctx, a.Key)
	if err != nil {
		t.Fatalf("after a crash: %v", err)
	}
	if got.State != intents.Approved || string(got.Arguments) != `{"n":1}` || got.Target != "billing" {
		t.Fatalf("after a crash: %+v", got)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestLockedDirectory(t *testing.T) {
	dir := t.TempDir()
	j, err := intents.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := intents.Open(dir, nil); !errors.Is(err, intents.ErrLocked) {
		t.Fatalf("second Open in this process: %v, want ErrLocked", err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}

	// Another process holds it.
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), lockChildEnv+"="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	buf := make([]byte, 6)
	if _, err := out.Read(buf); err != nil || string(buf) != "locked" {
		t.Fatalf("child: %q %v", buf, err)
	}
	if _, err := intents.Open(dir, nil); !errors.Is(err, intents.ErrLocked) {
		t.Fatalf("Open while another process holds the directory: %v, want ErrLocked", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "LOCK")); err != nil {
		t.Fatal(err)
	}
}

const lockChildEnv = "INTENTS_LOCK_CHILD"

// lockChild holds the journal in dir until it is killed.
func lockChild(dir string) {
	j, err := intents.Open(dir, nil)
	if err != nil {
		os.Stdout.WriteString("error " + err.Error())
		os.Exit(1)
	}
	os.Stdout.WriteString("locked")
	defer j.Close()
	select {}
}

func TestSettleRedeliverForget(t *testing.T) {
	ctx := context.Background()
	clk := receiptstest.NewClock(t0)
	j := openMem(t, vfs.NewMem(), clk)
	defer j.Close()
	a, err := j.Approve(ctx, approval(nil))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := j.Settle(ctx, a.Key, intents.Succeeded, "bob", nil); !errors.Is(err, intents.ErrWrongState) {
		t.Fatalf("Settle of an approved action: %v, want ErrWrongState", err)
	}
	if _, err := j.Redeliver(ctx, a.Key, t0.Add(time.Hour)); !errors.Is(err, intents.ErrWrongState) {
		t.Fatalf("Redeliver of an approved action: %v, want ErrWrongState", err)
	}
	if err := j.Forget(ctx, a.Key); !errors.Is(err, intents.ErrWrongState) {
		t.Fatalf("Forget of an approved action: %v, want ErrWrongState", err)
	}
	if _, err := j.Get(ctx, "nope"); !errors.Is(err, intents.ErrNotFound) {
		t.Fatalf("Get of an unknown key: %v", err)
	}
	if _, err := j.Settle(ctx, a.Key, intents.Approved, "bob", nil); !errors.Is(err, intents.ErrInvalid) {
		t.Fatalf("Settle to approved: %v, want ErrInvalid", err)
	}
}

func TestClosed(t *testing.T) {
	j := openMem(t, vfs.NewMem(), receiptstest.NewClock(t0))
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	if err := j.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := j.Approve(context.Background(), approval(nil)); !errors.Is(err, intents.ErrClosed) {
		t.Fatalf("Approve after Close: %v", err)
	}
	if _, err := j.Wait(context.Background(), "k"); !errors.Is(err, intents.ErrClosed) {
		t.Fatalf("Wait after Close: %v", err)
	}
}

// TestCloseDuringList: Close waits for a List in progress, and a call made
// inside the loop after Close began gets ErrClosed instead of waiting.
func TestCloseDuringList(t *testing.T) {
	ctx := context.Background()
	j := openMem(t, vfs.NewMem(), receiptstest.NewClock(t0))
	for range 2 {
		if _, err := j.Approve(ctx, approval(nil)); err != nil {
			t.Fatal(err)
		}
	}
	closed := make(chan error, 1)
	n := 0
	for a, err := range j.List(ctx, 0) {
		if err != nil {
			t.Fatal(err)
		}
		n++
		if n == 1 {
			go func() { closed <- j.Close() }()
			for {
				if _, err := j.Get(ctx, a.Key); errors.Is(err, intents.ErrClosed) {
					break
				}
				time.Sleep(time.Millisecond)
			}
			select {
			case err := <-closed:
				t.Fatalf("Close returned (%v) while List was running", err)
			default:
			}
		}
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
}
