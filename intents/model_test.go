package intents

import (
	"context"
	"encoding/json"
	"errors"
	mrand "math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/receiptstore/receipts/internal/testkit"
	"pgregory.net/rapid"
)

// modelAction is what the model expects of one action.
type modelAction struct {
	ref      string
	args     string
	state    State
	deadline time.Time
	// attempts: the latest value written, and the least a crash may leave
	// (the value at the journal's last synced write: Pebble's WAL is
	// synced as a whole).
	attempts, durable uint32
}

// TestModel runs random sequences of the journal's operations (Approve
// with and without a Ref, the Dispatcher's answer, uncertain and attempted
// records, Settle, Redeliver, Forget, and crashes that keep only what was
// synced) against a map, and compares Get and List in every state after
// each step.
func TestModel(t *testing.T) {
	checks := 200
	if testkit.Soak() {
		checks = 5000
	}
	testkit.RunRapid(t, checks, testModel)
}

func testModel(rt *rapid.T) {
	ctx := context.Background()
	now := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	fs := vfs.NewCrashableMem()
	open := func(fs vfs.FS) *Journal {
		j, err := Open("j", &Options{Now: clock, Pebble: &pebble.Options{FS: fs}})
		if err != nil {
			rt.Fatal(err)
		}
		return j
	}
	j := open(fs)
	defer func() { _ = j.Close() }()

	model := map[string]*modelAction{}
	refs := map[string]string{} // ref → key
	var keys []string           // every key ever minted, forgotten ones too
	synced := func() {
		for _, m := range model {
			m.durable = m.attempts
		}
	}
	pickKey := func(t *rapid.T) string {
		if len(keys) == 0 || rapid.IntRange(0, 9).Draw(t, "unknown") == 0 {
			return "0190b6a0-0000-7000-8000-000000000000"
		}
		return rapid.SampledFrom(keys).Draw(t, "key")
	}
	// expect checks err against the model's verdict for key in from.
	expect := func(t *rapid.T, op, key string, from []State, err error) bool {
		m, ok := model[key]
		switch {
		case !ok:
			if !errors.Is(err, ErrNotFound) {
				t.Fatalf("%s %s: %v, want ErrNotFound", op, key, err)
			}
			return false
		case !StateIn(m.state, from):
			if !errors.Is(err, ErrWrongState) {
				t.Fatalf("%s %s (%v): %v, want ErrWrongState", op, key, m.state, err)
			}
			return false
		case err != nil:
			t.Fatalf("%s %s: %v", op, key, err)
		}
		return true
	}

	rt.Repeat(map[string]func(*rapid.T){
		"": func(t *rapid.T) { check(t, j, model) },
		"approve": func(t *rapid.T) {
			ref := rapid.SampledFrom([]string{"", "", "run-1/call-a", "run-1/call-b"}).Draw(t, "ref")
			args := rapid.SampledFrom([]string{`{"n":1}`, `{"n":2}`}).Draw(t, "args")
			a, err := j.Approve(ctx, Approval{Target: "svc", Operation: "op", Arguments: json.RawMessage(args), ApprovedBy: "p", Ref: ref})
			if k, taken := refs[ref]; ref != "" && taken {
				if model[k].args != args {
					if !errors.Is(err, ErrRefConflict) {
						t.Fatalf("ref %q approved with other arguments: %v", ref, err)
					}
					return
				}
				if err != nil || a.Key != k {
					t.Fatalf("ref %q again: %v, %v; want key %s", ref, a, err, k)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			model[a.Key] = &modelAction{ref: ref, args: args, state: Approved, deadline: a.Deadline}
			keys = append(keys, a.Key)
			if ref != "" {
				refs[ref] = a.Key
			}
			synced()
		},
		"answer": func(t *rapid.T) {
			key := pickKey(t)
			st := rapid.SampledFrom([]State{Succeeded, Failed, Conflict, Expired}).Draw(t, "state")
			n := uint32(rapid.IntRange(1, 5).Draw(t, "attempts"))
			a, err := j.answer(ctx, key, &Answer{State: st, Status: 200, Body: []byte("ok")}, n)
			if expect(t, "answer", key, []State{Approved, Uncertain}, err) {
				m := model[key]
				m.state, m.attempts = st, max(m.attempts, n)
				if a.Answer == nil || a.Answer.State != st || string(a.Answer.Body) != "ok" {
					t.Fatalf("answer: %+v", a)
				}
				synced()
			}
		},
		"uncertain": func(t *rapid.T) {
			key := pickKey(t)
			n := uint32(rapid.IntRange(1, 5).Draw(t, "attempts"))
			_, err := j.uncertain(ctx, key, "deadline", n)
			if expect(t, "uncertain", key, []State{Approved}, err) {
				m := model[key]
				m.state, m.attempts = Uncertain, max(m.attempts, n)
				synced()
			}
		},
		"attempted": func(t *rapid.T) {
			key := pickKey(t)
			n := uint32(rapid.IntRange(1, 9).Draw(t, "attempts"))
			err := j.attempted(ctx, key, n, "503")
			if expect(t, "attempted", key, []State{Approved}, err) {
				m := model[key]
				m.attempts = max(m.attempts, n)
			}
		},
		"settle": func(t *rapid.T) {
			key := pickKey(t)
			st := rapid.SampledFrom([]State{Succeeded, Failed}).Draw(t, "state")
			_, err := j.Settle(ctx, key, st, "bob", []byte("checked"))
			if expect(t, "settle", key, []State{Uncertain}, err) {
				model[key].state = st
				synced()
			}
		},
		"redeliver": func(t *rapid.T) {
			key := pickKey(t)
			dl := now.Add(time.Duration(rapid.IntRange(1, 100).Draw(t, "minutes")) * time.Minute)
			_, err := j.Redeliver(ctx, key, dl)
			if expect(t, "redeliver", key, []State{Uncertain}, err) {
				m := model[key]
				m.state, m.deadline = Approved, dl
				synced()
			}
		},
		"forget": func(t *rapid.T) {
			key := pickKey(t)
			err := j.Forget(ctx, key)
			if expect(t, "forget", key, []State{Succeeded, Failed, Conflict, Expired}, err) {
				if r := model[key].ref; r != "" {
					delete(refs, r)
				}
				delete(model, key)
				synced()
			}
		},
		"advance": func(t *rapid.T) {
			now = now.Add(time.Duration(rapid.IntRange(1, 5000).Draw(t, "ms")) * time.Millisecond)
		},
		"crash": func(t *rapid.T) {
			pct := rapid.SampledFrom([]int{0, 50, 100}).Draw(t, "unsynced%")
			cfg := vfs.CrashCloneCfg{UnsyncedDataPercent: pct}
			if pct > 0 {
				cfg.RNG = mrand.New(mrand.NewPCG(rapid.Uint64().Draw(t, "seed"), 1))
			}
			clone := fs.CrashClone(cfg)
			_ = j.Close()
			fs = clone
			j = open(fs)
			for key, m := range model {
				a, err := j.Get(ctx, key)
				if err != nil {
					t.Fatalf("after a crash: %s: %v", key, err)
				}
				if a.Attempts < m.durable || a.Attempts > m.attempts {
					t.Fatalf("after a crash: %s has %d attempts, want %d..%d", key, a.Attempts, m.durable, m.attempts)
				}
				m.attempts, m.durable = a.Attempts, a.Attempts
			}
		},
	})
	check(rt, j, model)
}

func check(t *rapid.T, j *Journal, model map[string]*modelAction) {
	ctx := context.Background()
	for key, m := range model {
		a, err := j.Get(ctx, key)
		if err != nil {
			t.Fatalf("Get %s: %v", key, err)
		}
		if a.State != m.state || a.Ref != m.ref || string(a.Arguments) != m.args || !a.Deadline.Equal(m.deadline) || a.Attempts != m.attempts {
			t.Fatalf("Get %s = %+v (%s), want %+v", key, a, a.Arguments, m)
		}
	}
	for st := State(0); st <= Uncertain; st++ {
		var want, got []string
		for k, m := range model {
			if st == 0 || m.state == st {
				want = append(want, k)
			}
		}
		slices.Sort(want)
		for a, err := range j.List(ctx, st) {
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, a.Key)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("List(%v) = %v, want %v", st, got, want)
		}
	}
}
