// Package intentsmodel holds the model test of the intents journal, run on
// every Store: the Pebble store (package intents, with crashes) and the
// PostgreSQL one (package intentspg).
package intentsmodel

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"time"

	"github.com/receiptstore/receipts/intents"
	"pgregory.net/rapid"
)

// Engine is what Model runs on.
type Engine struct {
	// Open returns an empty store.
	Open func(t *rapid.T) intents.Store
	// Crash, if set, returns the store as a restart after a power loss
	// now would find it (what was synced, and maybe some of what was
	// not), without closing the current one, which Model closes next.
	Crash func(t *rapid.T) intents.Store
	// Reopen, if set, opens the store again after Model closed it.
	Reopen func(t *rapid.T) intents.Store
	// Micro: the store keeps times to the microsecond.
	Micro bool
}

// action is what the model expects of one action.
type action struct {
	ref      string
	args     string
	state    intents.State
	deadline time.Time
	// attempts is the latest value written; durable the least a crash may
	// leave (the value at the store's last synced write: Pebble syncs its
	// WAL as a whole).
	attempts, durable uint32
}

// Model runs random sequences of the journal's operations against a map
// and compares Get and List in every state after each step: Approve with
// and without a Ref (the same Ref again, with the same or other
// arguments), the Dispatcher's transitions (an answer, Uncertain, an
// attempt recorded without sync, each an Update as the Dispatcher makes
// it), Settle, Redeliver, Forget of the right and wrong states and of
// unknown keys, and crashes or reopens.
func Model(rt *rapid.T, e Engine) {
	ctx := context.Background()
	now := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	s := e.Open(rt)
	open := func() *intents.Journal {
		j, err := intents.New(s, &intents.Options{Now: clock})
		if err != nil {
			rt.Fatal(err)
		}
		return j
	}
	j := open()
	defer func() { _ = j.Close() }()
	tm := func(t time.Time) time.Time {
		if e.Micro {
			return t.Truncate(time.Microsecond)
		}
		return t
	}

	model := map[string]*action{}
	refs := map[string]string{}
	var keys []string
	synced := func() {
		for _, m := range model {
			m.durable = m.attempts
		}
	}
	pick := func(t *rapid.T) string {
		if len(keys) == 0 || rapid.IntRange(0, 9).Draw(t, "unknown") == 0 {
			return "0190b6a0-0000-7000-8000-000000000000"
		}
		return rapid.SampledFrom(keys).Draw(t, "key")
	}
	expect := func(t *rapid.T, op, key string, from []intents.State, err error) bool {
		m, ok := model[key]
		switch {
		case !ok:
			if !errors.Is(err, intents.ErrNotFound) {
				t.Fatalf("%s %s: %v, want ErrNotFound", op, key, err)
			}
			return false
		case !intents.StateIn(m.state, from):
			if !errors.Is(err, intents.ErrWrongState) {
				t.Fatalf("%s %s (%v): %v, want ErrWrongState", op, key, m.state, err)
			}
			return false
		case err != nil:
			t.Fatalf("%s %s: %v", op, key, err)
		}
		return true
	}
	// update is a transition as the Dispatcher makes it.
	update := func(key string, from []intents.State, sync bool, f func(*intents.Action)) error {
		_, err := s.Update(ctx, key, from, sync, func(a *intents.Action) error { f(a); return nil })
		return err
	}
	reopened := func(t *rapid.T, lossy bool) {
		var ns intents.Store
		if lossy {
			ns = e.Crash(t)
			_ = j.Close() // the crashed store, gone anyway
		} else {
			if err := j.Close(); err != nil {
				t.Fatal(err)
			}
			ns = e.Reopen(t)
		}
		s = ns
		j = open()
		for key, m := range model {
			a, err := j.Get(ctx, key)
			if err != nil {
				t.Fatalf("after a restart: %s: %v", key, err)
			}
			lo := m.attempts
			if lossy {
				lo = m.durable
			}
			if a.Attempts < lo || a.Attempts > m.attempts {
				t.Fatalf("after a restart: %s has %d attempts, want %d..%d", key, a.Attempts, lo, m.attempts)
			}
			m.attempts, m.durable = a.Attempts, a.Attempts
		}
	}

	ops := map[string]func(*rapid.T){
		"": func(t *rapid.T) { check(t, j, model, tm) },
		"approve": func(t *rapid.T) {
			ref := rapid.SampledFrom([]string{"", "", "run-1/call-a", "run-1/call-b"}).Draw(t, "ref")
			args := rapid.SampledFrom([]string{`{"n":1}`, `{"n":2}`}).Draw(t, "args")
			a, err := j.Approve(ctx, intents.Approval{Target: "svc", Operation: "op", Arguments: json.RawMessage(args), ApprovedBy: "p", Ref: ref})
			if k, taken := refs[ref]; ref != "" && taken {
				if model[k].args != args {
					if !errors.Is(err, intents.ErrRefConflict) {
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
			model[a.Key] = &action{ref: ref, args: args, state: intents.Approved, deadline: tm(a.Deadline)}
			keys = append(keys, a.Key)
			if ref != "" {
				refs[ref] = a.Key
			}
			synced()
		},
		"answer": func(t *rapid.T) {
			key := pick(t)
			st := rapid.SampledFrom([]intents.State{intents.Succeeded, intents.Failed, intents.Conflict, intents.Expired}).Draw(t, "state")
			n := uint32(rapid.IntRange(1, 5).Draw(t, "attempts"))
			err := update(key, []intents.State{intents.Approved, intents.Uncertain}, true, func(a *intents.Action) {
				a.State, a.Attempts = st, max(a.Attempts, n)
				a.Answer = &intents.Answer{State: st, Status: 201, Body: []byte("ok"), Header: map[string][]string{"Location": {"/x"}}, At: now}
			})
			if expect(t, "answer", key, []intents.State{intents.Approved, intents.Uncertain}, err) {
				m := model[key]
				m.state, m.attempts = st, max(m.attempts, n)
				synced()
			}
		},
		"uncertain": func(t *rapid.T) {
			key := pick(t)
			n := uint32(rapid.IntRange(1, 5).Draw(t, "attempts"))
			err := update(key, []intents.State{intents.Approved}, true, func(a *intents.Action) {
				a.State, a.Attempts, a.LastError = intents.Uncertain, max(a.Attempts, n), "deadline"
			})
			if expect(t, "uncertain", key, []intents.State{intents.Approved}, err) {
				m := model[key]
				m.state, m.attempts = intents.Uncertain, max(m.attempts, n)
				synced()
			}
		},
		"attempted": func(t *rapid.T) {
			key := pick(t)
			n := uint32(rapid.IntRange(1, 9).Draw(t, "attempts"))
			err := update(key, []intents.State{intents.Approved}, false, func(a *intents.Action) {
				a.Attempts, a.LastError = max(a.Attempts, n), "503"
			})
			if expect(t, "attempted", key, []intents.State{intents.Approved}, err) {
				m := model[key]
				m.attempts = max(m.attempts, n)
			}
		},
		"settle": func(t *rapid.T) {
			key := pick(t)
			st := rapid.SampledFrom([]intents.State{intents.Succeeded, intents.Failed}).Draw(t, "state")
			_, err := j.Settle(ctx, key, st, "bob", []byte("checked"))
			if expect(t, "settle", key, []intents.State{intents.Uncertain}, err) {
				model[key].state = st
				synced()
			}
		},
		"redeliver": func(t *rapid.T) {
			key := pick(t)
			dl := now.Add(time.Duration(rapid.IntRange(1, 100).Draw(t, "minutes")) * time.Minute)
			_, err := j.Redeliver(ctx, key, dl)
			if expect(t, "redeliver", key, []intents.State{intents.Uncertain}, err) {
				m := model[key]
				m.state, m.deadline = intents.Approved, tm(dl)
				synced()
			}
		},
		"forget": func(t *rapid.T) {
			key := pick(t)
			err := j.Forget(ctx, key)
			if expect(t, "forget", key, []intents.State{intents.Succeeded, intents.Failed, intents.Conflict, intents.Expired}, err) {
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
	}
	if e.Crash != nil {
		ops["crash"] = func(t *rapid.T) { reopened(t, true) }
	}
	if e.Reopen != nil {
		ops["reopen"] = func(t *rapid.T) { reopened(t, false) }
	}
	rt.Repeat(ops)
}

func check(t *rapid.T, j *intents.Journal, model map[string]*action, tm func(time.Time) time.Time) {
	ctx := context.Background()
	for key, m := range model {
		a, err := j.Get(ctx, key)
		if err != nil {
			t.Fatalf("Get %s: %v", key, err)
		}
		if a.State != m.state || a.Ref != m.ref || string(a.Arguments) != m.args || !a.Deadline.Equal(m.deadline) || a.Attempts != m.attempts {
			t.Fatalf("Get %s = %+v (%s), want %+v", key, a, a.Arguments, m)
		}
		if a.State.Answered() != (a.Answer != nil) || a.Answer != nil && a.Answer.State != a.State {
			t.Fatalf("Get %s: state %v with answer %+v", key, a.State, a.Answer)
		}
	}
	for st := intents.State(0); st <= intents.Uncertain; st++ {
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
