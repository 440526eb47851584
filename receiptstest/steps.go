package receiptstest

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/driver"
	"github.com/stretchr/testify/require"
)

// Steps (Lease.Step): a finished step is never run again for its key, an unknown one is run
// again Recovered with the same step key, and a retry must call the same steps in the same
// order. An engine that keeps no journal returns receipts.ErrUnsupported, and these tests
// are skipped there, saying so.
var stepTests = []test{
	{"ResumeAfterUnknown", testStepsResume},
	{"FinishedStepNeverRunsAgain", testStepsReplay},
	{"StartedIsNotFinished", testStepsStartedVsNever},
	{"ProviderKeys", testStepsProviderKeys},
	{"Mismatch", testStepsMismatch},
	{"OutcomeClasses", testStepsOutcomes},
	{"NotPerformedKeepsRecordedSteps", testStepsReleaseKeeps},
	{"Limits", testStepsLimits},
	{"Fenced", testStepsFenced},
	{"SurvivesRestart", testStepsRestart},
	{"Encrypted", testStepsEncrypted},
	{"Erased", testStepsErased},
	{"StagedEffectCommitsWithTheStep", testStepsStaged},
	{"SettleStep", testStepsSettle},
	{"UnknownStepRefusesCommit", testStepsUnknownRefusesCommit},
	{"ReleaseInsideAStepKeepsTheClaim", testStepsReleaseInside},
	{"ForgetRefusedOnceAStepIsRecorded", testStepsForgetRefused},
	{"HashKeys", testStepsHashKeys},
	{"RetentionAndGC", testStepsRetention},
}

// stepsEnv opens a store, skipping the test on an engine without steps.
func stepsEnv(t *testing.T, s Store, mod func(*receipts.Options)) *env {
	t.Helper()
	e := newEnv(t, s, mod)
	l := e.claim(key("probe", "steps"), "fp")
	_, err := l.Step(bg, "probe", nil, func(context.Context, *receipts.Step) ([]byte, error) { return nil, nil })
	if errors.Is(err, receipts.ErrUnsupported) {
		t.Skipf("the engine keeps no step journal: %v", err)
	}
	require.NoError(t, err)
	require.NoError(t, l.Release(bg))
	return e
}

// action is a three-step action whose steps count their runs (and stop at fail, if set).
type action struct {
	runs      [3]atomic.Int32
	recovered [3]atomic.Bool
	keys      [3]atomic.Value
	fail      int   // the step (1-based) that returns failErr, 0 for none
	failErr   error // what it returns
}

var stepNames = [3]string{"reserve", "charge", "notify"}

func (a *action) fn(ctx context.Context, l *receipts.Lease) ([]byte, error) {
	var out []string
	for i, name := range stepNames {
		res, err := l.Step(ctx, name, []byte("args-"+name), func(ctx context.Context, s *receipts.Step) ([]byte, error) {
			a.runs[i].Add(1)
			a.recovered[i].Store(s.Recovered())
			a.keys[i].Store(s.ProviderKey())
			if a.fail == i+1 {
				return nil, a.failErr
			}
			return []byte(name + "-done"), nil
		})
		if err != nil {
			return nil, err
		}
		out = append(out, string(res))
	}
	return []byte(strings.Join(out, ",")), nil
}

func (a *action) wantRuns(t *testing.T, runs ...int32) {
	t.Helper()
	for i, n := range runs {
		require.Equal(t, n, a.runs[i].Load(), "runs of step %d (%s)", i, stepNames[i])
	}
}

// An attempt dies in the third step (an unknown error): the next attempt replays the first
// two, runs the third Recovered with the same step key, and the receipt is recorded once.
func testStepsResume(t *testing.T, s Store) {
	bg := bounded(t)
	e := stepsEnv(t, s, nil)
	k := key("a", "trip")
	a := &action{fail: 3, failErr: errors.New("connection reset")}
	_, err := e.db.Do(bg, k, []byte("fp"), a.fn)
	require.ErrorIs(t, err, receipts.ErrOutcomeUnknown)
	a.wantRuns(t, 1, 1, 1)
	firstKey := a.keys[2].Load()
	steps, err := e.db.Steps(bg, k)
	require.NoError(t, err)
	require.Len(t, steps, 3)
	require.Equal(t, receipts.Succeeded, steps[0].State)
	require.Equal(t, receipts.Succeeded, steps[1].State)
	require.Equal(t, receipts.Pending, steps[2].State, "the third step started, outcome unknown")
	require.Equal(t, "charge-done", string(steps[1].Result))

	a.fail = 0
	r, err := e.db.Do(bg, k, []byte("fp"), a.fn)
	require.NoError(t, err)
	require.Equal(t, "reserve-done,charge-done,notify-done", string(r.Result))
	a.wantRuns(t, 1, 1, 2)
	require.True(t, a.recovered[2].Load(), "the step whose outcome was unknown runs Recovered")
	require.Equal(t, firstKey, a.keys[2].Load(), "with the same step key")

	r2, err := e.db.Do(bg, k, []byte("fp"), a.fn)
	require.NoError(t, err)
	require.Equal(t, r.Result, r2.Result)
	a.wantRuns(t, 1, 1, 2)
	steps, err = e.db.Steps(bg, k)
	require.NoError(t, err)
	for _, st := range steps {
		require.Equal(t, receipts.Succeeded, st.State, st.Name)
	}
}

// A recorded step is replayed to every later attempt of the key, whatever it does after.
func testStepsReplay(t *testing.T, s Store) {
	bg := bounded(t)
	e := stepsEnv(t, s, nil)
	k := key("a", "k")
	l := e.claim(k, "fp")
	calls := 0
	step := func(ctx context.Context, s *receipts.Step) ([]byte, error) { calls++; return []byte("r1"), nil }
	res, err := l.Step(bg, "one", []byte("x"), step)
	require.NoError(t, err)
	require.Equal(t, "r1", string(res))
	require.NoError(t, l.Abandon(bg))

	for range 3 {
		l = e.claim(k, "fp")
		require.True(t, l.Recovered())
		res, err = l.Step(bg, "one", []byte("x"), step)
		require.NoError(t, err)
		require.Equal(t, "r1", string(res))
		require.Equal(t, 1, calls, "a recorded step never runs again")
		require.NoError(t, l.Abandon(bg))
	}
}

// A claim abandoned between two steps resumes with the next step not Recovered (it never
// started); one abandoned inside a step's fn resumes with that step Recovered.
func testStepsStartedVsNever(t *testing.T, s Store) {
	bg := bounded(t)
	e := stepsEnv(t, s, nil)
	k := key("a", "k")
	l := e.claim(k, "fp")
	_, err := l.Step(bg, "one", nil, func(context.Context, *receipts.Step) ([]byte, error) { return []byte("1"), nil })
	require.NoError(t, err)
	require.NoError(t, l.Abandon(bg)) // dies between steps

	l = e.claim(k, "fp")
	_, err = l.Step(bg, "one", nil, func(context.Context, *receipts.Step) ([]byte, error) {
		t.Fatal("a recorded step ran again")
		return nil, nil
	})
	require.NoError(t, err)
	var rec bool
	var l3 *receipts.Lease
	_, err = l.Step(bg, "two", nil, func(ctx context.Context, s *receipts.Step) ([]byte, error) {
		rec = s.Recovered()
		require.NoError(t, l.Abandon(bg)) // its holder is gone, and another attempt comes in
		l3 = e.claim(k, "fp")
		return []byte("2"), nil
	})
	require.ErrorIs(t, err, receipts.ErrOutcomeUnknown, "its record is refused: the lease was taken over")
	require.ErrorIs(t, err, receipts.ErrLeaseLost)
	require.False(t, rec, "a step that never started is not Recovered")

	l = l3
	_, err = l.Step(bg, "one", nil, func(context.Context, *receipts.Step) ([]byte, error) { return nil, errors.New("ran again") })
	require.NoError(t, err)
	_, err = l.Step(bg, "two", nil, func(ctx context.Context, s *receipts.Step) ([]byte, error) {
		rec = s.Recovered()
		return []byte("2"), nil
	})
	require.NoError(t, err)
	require.True(t, rec, "a step that started and has no outcome is Recovered")
	_, err = l.Commit(bg, []byte("done"))
	require.NoError(t, err)
}

// Step keys: stable across attempts and restarts, one per (key, step), none equal to a
// key's ProviderKey, in ProviderKey's form.
func testStepsProviderKeys(t *testing.T, s Store) {
	bg := bounded(t)
	e := stepsEnv(t, s, nil)
	seen := map[string]string{}
	collect := func(k receipts.Key, names ...string) {
		l := e.claim(k, "fp")
		for _, n := range names {
			_, err := l.Step(bg, n, nil, func(ctx context.Context, s *receipts.Step) ([]byte, error) {
				pk := s.ProviderKey()
				require.Regexp(t, `^rk_[A-Za-z0-9_-]{43}$`, pk)
				id := k.String() + "/" + n
				if prev, ok := seen[pk]; ok && prev != id {
					t.Fatalf("step key %s of %s is also %s's", pk, id, prev)
				}
				seen[pk] = id
				return nil, receipts.NotPerformed(errors.New("only looking"))
			})
			require.Error(t, err)
		}
		if prev, ok := seen[l.ProviderKey()]; ok {
			t.Fatalf("the key's ProviderKey is step key %s", prev)
		}
		require.NoError(t, l.Release(bg))
	}
	collect(key("a", "k"), "one", "two")
	collect(key("a", "k2"), "one", "two")
	collect(key("b", "k"), "one")
	require.Len(t, seen, 5)
	before := len(seen)
	e.reopen()
	collect(key("a", "k"), "one", "two") // the same keys after a restart
	require.Len(t, seen, before)
}

// Another name or fingerprint at a recorded position: ErrStepMismatch, nothing runs,
// nothing changes; the lease's later steps are refused too.
func testStepsMismatch(t *testing.T, s Store) {
	bg := bounded(t)
	e := stepsEnv(t, s, nil)
	k := key("a", "k")
	l := e.claim(k, "fp")
	_, err := l.Step(bg, "one", []byte("x"), func(context.Context, *receipts.Step) ([]byte, error) { return []byte("1"), nil })
	require.NoError(t, err)
	require.NoError(t, l.Abandon(bg))
	never := func(context.Context, *receipts.Step) ([]byte, error) {
		t.Fatal("a mismatched step ran")
		return nil, nil
	}
	for _, c := range []struct {
		name string
		fp   []byte
	}{{"two", []byte("x")}, {"one", []byte("y")}, {"one", nil}} {
		l = e.claim(k, "fp")
		_, err = l.Step(bg, c.name, c.fp, never)
		require.ErrorIs(t, err, receipts.ErrStepMismatch, "%s %q", c.name, c.fp)
		_, err = l.Step(bg, "three", nil, never)
		require.ErrorIs(t, err, receipts.ErrStepMismatch, "later steps of the lease are refused")
		require.NoError(t, l.Abandon(bg))
	}
	steps, err := e.db.Steps(bg, k)
	require.NoError(t, err)
	require.Len(t, steps, 1)
	require.Equal(t, "one", steps[0].Name)
	require.Equal(t, "1", string(steps[0].Result))

	l = e.claim(k, "fp") // a name used twice in one action
	_, err = l.Step(bg, "one", []byte("x"), never)
	require.NoError(t, err)
	_, err = l.Step(bg, "one", []byte("x"), never)
	require.ErrorIs(t, err, receipts.ErrInvalidArgument)
	_, err = l.Step(bg, "", nil, never)
	require.ErrorIs(t, err, receipts.ErrInvalidArgument)
	require.NoError(t, l.Abandon(bg))
}

// Permanent records a failed step, replayed with ErrFailed; NotPerformed records nothing.
func testStepsOutcomes(t *testing.T, s Store) {
	bg := bounded(t)
	e := stepsEnv(t, s, nil)
	k := key("a", "perm")
	a := &action{fail: 2, failErr: receipts.Permanent(errors.New("card declined"))}
	r, err := e.db.Do(bg, k, []byte("fp"), a.fn)
	require.ErrorIs(t, err, receipts.ErrFailed)
	require.Equal(t, receipts.Failed, r.State)
	a.wantRuns(t, 1, 1, 0)
	steps, err := e.db.Steps(bg, k)
	require.NoError(t, err)
	require.Len(t, steps, 2)
	require.Equal(t, receipts.Failed, steps[1].State)
	require.Contains(t, string(steps[1].Result), "card declined")

	// The failed step, replayed to an attempt (Forget the receipt? No: claim a new key whose
	// first attempt failed a step and was abandoned after).
	k2 := key("a", "perm2")
	l := e.claim(k2, "fp")
	_, err = l.Step(bg, "one", nil, func(context.Context, *receipts.Step) ([]byte, error) {
		return []byte("declined"), receipts.Permanent(errors.New("declined"))
	})
	require.Error(t, err)
	require.NoError(t, l.Abandon(bg))
	l = e.claim(k2, "fp")
	res, err := l.Step(bg, "one", nil, func(context.Context, *receipts.Step) ([]byte, error) {
		t.Fatal("a failed step ran again")
		return nil, nil
	})
	require.ErrorIs(t, err, receipts.ErrFailed)
	require.Equal(t, "declined", string(res))
	require.NoError(t, l.Abandon(bg))

	k3 := key("a", "np")
	l = e.claim(k3, "fp")
	_, err = l.Step(bg, "one", nil, func(context.Context, *receipts.Step) ([]byte, error) {
		return nil, receipts.NotPerformed(errors.New("busy"))
	})
	require.Error(t, err)
	steps, err = e.db.Steps(bg, k3)
	require.NoError(t, err)
	require.Empty(t, steps, "NotPerformed records nothing")
	require.NoError(t, l.Release(bg))
	_, err = e.db.Lookup(bg, k3)
	require.ErrorIs(t, err, receipts.ErrNotFound, "a first attempt with no step recorded is released for good")
}

// NotPerformed after recorded steps: the claim is kept, and the next attempt replays them.
func testStepsReleaseKeeps(t *testing.T, s Store) {
	bg := bounded(t)
	e := stepsEnv(t, s, nil)
	k := key("a", "k")
	a := &action{fail: 3, failErr: receipts.NotPerformed(errors.New("rate limited"))}
	_, err := e.db.Do(bg, k, []byte("fp"), a.fn)
	require.Error(t, err)
	require.NotErrorIs(t, err, receipts.ErrOutcomeUnknown)
	a.wantRuns(t, 1, 1, 1)
	r := e.lookup(k)
	require.Equal(t, receipts.Pending, r.State, "the claim is kept: two steps happened")
	a.fail = 0
	_, err = e.db.Do(bg, k, []byte("fp"), a.fn)
	require.NoError(t, err)
	a.wantRuns(t, 1, 1, 2)
	require.False(t, a.recovered[2].Load(), "the step that was not performed never started as far as the journal knows")
}

// Limits: MaxSteps; a result over MaxStepResultSize is recorded as failed and never run
// again.
func testStepsLimits(t *testing.T, s Store) {
	bg := bounded(t)
	e := stepsEnv(t, s, nil)
	k := key("a", "big")
	runs := 0
	big := func(context.Context, *receipts.Step) ([]byte, error) {
		runs++
		return make([]byte, receipts.MaxStepResultSize+1), nil
	}
	l := e.claim(k, "fp")
	_, err := l.Step(bg, "big", nil, big)
	require.Error(t, err)
	require.NotErrorIs(t, err, receipts.ErrOutcomeUnknown)
	require.NoError(t, l.Abandon(bg))
	l = e.claim(k, "fp")
	_, err = l.Step(bg, "big", nil, big)
	require.ErrorIs(t, err, receipts.ErrFailed)
	require.Equal(t, 1, runs, "a step whose result was too large is settled, not run again")
	require.NoError(t, l.Abandon(bg))

	k = key("a", "many")
	l = e.claim(k, "fp")
	for i := range receipts.MaxSteps {
		_, err := l.Step(bg, "s"+string(rune('A'+i%26))+string(rune('a'+i/26)), nil,
			func(context.Context, *receipts.Step) ([]byte, error) { return nil, nil })
		require.NoError(t, err)
	}
	ran := false
	_, err = l.Step(bg, "one-too-many", nil, func(context.Context, *receipts.Step) ([]byte, error) { ran = true; return nil, nil })
	require.ErrorIs(t, err, receipts.ErrInvalidArgument)
	require.False(t, ran)
	_, err = l.Commit(bg, []byte("ok"))
	require.NoError(t, err)
}

// A step of a lease that was taken over records nothing: its record is fenced.
func testStepsFenced(t *testing.T, s Store) {
	bg := bounded(t)
	e := stepsEnv(t, s, nil)
	k := key("a", "k")
	l1 := e.claim(k, "fp")
	e.clock.Advance(leaseTTL + 1)
	l2 := e.claim(k, "fp")
	require.True(t, l2.Recovered())
	_, err := l1.Step(bg, "one", nil, func(context.Context, *receipts.Step) ([]byte, error) {
		t.Fatal("a step of a lost lease ran")
		return nil, nil
	})
	require.ErrorIs(t, err, receipts.ErrLeaseLost, "its start is refused: nothing runs")
	res, err := l2.Step(bg, "one", nil, func(ctx context.Context, s *receipts.Step) ([]byte, error) {
		require.False(t, s.Recovered())
		return []byte("2"), nil
	})
	require.NoError(t, err)
	require.Equal(t, "2", string(res))
}

// The journal is durable: a restart resumes from it.
func testStepsRestart(t *testing.T, s Store) {
	bg := bounded(t)
	e := stepsEnv(t, s, nil)
	k := key("a", "trip")
	a := &action{fail: 2, failErr: errors.New("timeout")}
	_, err := e.db.Do(bg, k, []byte("fp"), a.fn)
	require.ErrorIs(t, err, receipts.ErrOutcomeUnknown)
	e.reopen()
	a.fail = 0
	r, err := e.db.Do(bg, k, []byte("fp"), a.fn)
	require.NoError(t, err)
	require.Equal(t, "reserve-done,charge-done,notify-done", string(r.Result))
	a.wantRuns(t, 1, 2, 1)
	require.True(t, a.recovered[1].Load())
}

// With Options.Keyring a step's result is sealed, and read back in the clear.
func testStepsEncrypted(t *testing.T, s Store) {
	bg := bounded(t)
	e, _ := sealEnv(t, s, nil)
	k := key("a", "k")
	l := e.claim(k, "fp")
	_, err := l.Step(bg, "one", nil, func(context.Context, *receipts.Step) ([]byte, error) { return []byte("card 4242"), nil })
	if errors.Is(err, receipts.ErrUnsupported) {
		t.Skip(err)
	}
	require.NoError(t, err)
	require.NoError(t, l.Abandon(bg))
	raw, _, _, err := e.db.Driver().Lookup(bg, driver.Key{Scope: k.Scope, ID: k.ID})
	require.NoError(t, err)
	require.NotEmpty(t, raw.Journal)
	require.NotContains(t, string(raw.Journal), "card 4242", "the step's result is sealed in the store")
	l = e.claim(k, "fp")
	res, err := l.Step(bg, "one", nil, func(context.Context, *receipts.Step) ([]byte, error) { return nil, errors.New("ran again") })
	require.NoError(t, err)
	require.Equal(t, "card 4242", string(res))
	steps, err := e.db.Steps(bg, k)
	require.NoError(t, err)
	require.Equal(t, "card 4242", string(steps[0].Result))
}

// Erasing the scope erases the journal with the claim: a late retry is refused, never run.
func testStepsErased(t *testing.T, s Store) {
	bg := bounded(t)
	e := stepsEnv(t, s, nil)
	k := key("a", "k")
	l := e.claim(k, "fp")
	_, err := l.Step(bg, "one", nil, func(context.Context, *receipts.Step) ([]byte, error) { return []byte("1"), nil })
	require.NoError(t, err)
	require.NoError(t, l.Abandon(bg))
	if _, err := e.db.EraseScope(bg, "a"); errors.Is(err, receipts.ErrUnsupported) {
		t.Skip(err)
	} else {
		require.NoError(t, err)
	}
	_, err = e.db.Steps(bg, k)
	require.ErrorIs(t, err, receipts.ErrNotFound)
	_, err = e.db.Do(bg, k, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
		t.Fatal("a late retry in an erased scope ran")
		return nil, nil
	})
	require.ErrorIs(t, err, receipts.ErrErased)
}

// A step's staged effect commits with its record, both or neither: a failing effect leaves
// neither, and the step's outcome is unknown (it ran); on the next attempt it runs again,
// Recovered.
func testStepsStaged(t *testing.T, s Store) {
	bg := bounded(t)
	stepsEnv(t, s, nil) // skips without steps
	f := newFaceEnv(t, s)
	x := newEffects(t, f)
	k := key("a", "staged")
	l := f.claim(k, "fp")
	_, err := l.Step(bg, "one", nil, func(ctx context.Context, st *receipts.Step) ([]byte, error) {
		st.Stage(x.make(t, "step-one", false))
		return []byte("1"), nil
	})
	require.NoError(t, err)
	require.True(t, x.has(t, "step-one"), "the effect committed with the step")

	_, err = l.Step(bg, "two", nil, func(ctx context.Context, st *receipts.Step) ([]byte, error) {
		st.Stage(x.make(t, "step-two", true))
		return []byte("2"), nil
	})
	require.ErrorIs(t, err, receipts.ErrOutcomeUnknown)
	require.False(t, x.has(t, "step-two"), "a failing effect is rolled back")
	steps, err := f.db.Steps(bg, k)
	require.NoError(t, err)
	require.Len(t, steps, 2)
	require.Equal(t, receipts.Pending, steps[1].State, "and the step is not recorded")

	l = f.claim(k, "fp")
	var rec bool
	_, err = l.Step(bg, "one", nil, func(context.Context, *receipts.Step) ([]byte, error) { return nil, errors.New("ran again") })
	require.NoError(t, err)
	_, err = l.Step(bg, "two", nil, func(ctx context.Context, st *receipts.Step) ([]byte, error) {
		rec = st.Recovered()
		st.Stage(x.make(t, "step-two", false))
		return []byte("2"), nil
	})
	require.NoError(t, err)
	require.True(t, rec)
	require.True(t, x.has(t, "step-two"))
}

// An operator settles the uncertain step without running it: as done (the next attempt gets
// its result) or as not done (the next attempt runs it, not Recovered).
func testStepsSettle(t *testing.T, s Store) {
	bg := bounded(t)
	e := stepsEnv(t, s, nil)
	for _, c := range []struct {
		state receipts.State
		runs  int32
	}{{receipts.Succeeded, 1}, {receipts.Pending, 2}} {
		k := key("a", "settle-"+c.state.String())
		a := &action{fail: 2, failErr: errors.New("timeout")}
		_, err := e.db.Do(bg, k, []byte("fp"), a.fn)
		require.ErrorIs(t, err, receipts.ErrOutcomeUnknown)
		r := e.listed(k)
		l, err := e.db.TakeOver(bg, r)
		require.NoError(t, err)
		require.ErrorIs(t, l.SettleStep(bg, "notify", c.state, nil), receipts.ErrNotFound, "not the uncertain step")
		require.ErrorIs(t, l.SettleStep(bg, "charge", 0, nil), receipts.ErrInvalidArgument)
		require.NoError(t, l.SettleStep(bg, "charge", c.state, []byte("charge-done")))
		require.ErrorIs(t, l.SettleStep(bg, "charge", c.state, nil), receipts.ErrNotFound, "settled once")
		require.NoError(t, l.Abandon(bg))
		a.fail = 0
		res, err := e.db.Do(bg, k, []byte("fp"), a.fn)
		require.NoError(t, err)
		require.Equal(t, "reserve-done,charge-done,notify-done", string(res.Result))
		a.wantRuns(t, 1, c.runs, 1)
		if c.state == receipts.Pending {
			require.False(t, a.recovered[1].Load(), "settled as not done: it runs as never started")
		}
	}
}

// A lease whose step's outcome is unknown records no receipt, and is never released: its
// step may have happened.
func testStepsUnknownRefusesCommit(t *testing.T, s Store) {
	bg := bounded(t)
	e := stepsEnv(t, s, nil)
	k := key("a", "k")
	l := e.claim(k, "fp")
	_, err := l.Step(bg, "one", nil, func(context.Context, *receipts.Step) ([]byte, error) { return nil, errors.New("reset") })
	require.ErrorIs(t, err, receipts.ErrOutcomeUnknown)
	_, err = l.Commit(bg, []byte("ok"))
	require.ErrorIs(t, err, receipts.ErrOutcomeUnknown)
	require.ErrorIs(t, l.Release(bg), receipts.ErrOutcomeUnknown)
	require.ErrorIs(t, l.Forget(bg), receipts.ErrOutcomeUnknown)
	r := e.lookup(k)
	require.Equal(t, receipts.Pending, r.State)
	require.True(t, r.Abandoned(e.clock.Now()))
}

// Release called from a step's fn (the step is under way: what it does may happen) keeps the
// claim, abandoned, rather than freeing the key.
func testStepsReleaseInside(t *testing.T, s Store) {
	bg := bounded(t)
	e := stepsEnv(t, s, nil)
	k := key("a", "k")
	l := e.claim(k, "fp")
	_, err := l.Step(bg, "one", nil, func(context.Context, *receipts.Step) ([]byte, error) {
		require.NoError(t, l.Release(bg))
		return nil, receipts.NotPerformed(errors.New("gave up"))
	})
	require.Error(t, err)
	r := e.lookup(k)
	require.Equal(t, receipts.Pending, r.State, "the claim is kept")
}

// Forget says no attempt's effect happened; a recorded step did, so Forget of a claim that
// has one is refused and the journal stays (Release keeps the claim to resume).
func testStepsForgetRefused(t *testing.T, s Store) {
	bg := bounded(t)
	e := stepsEnv(t, s, nil)
	k := key("a", "k")
	a := &action{fail: 2, failErr: errors.New("timeout")}
	_, err := e.db.Do(bg, k, []byte("fp"), a.fn)
	require.ErrorIs(t, err, receipts.ErrOutcomeUnknown)
	l := e.claim(k, "fp")
	require.ErrorIs(t, l.Forget(bg), receipts.ErrInvalidArgument)
	require.NoError(t, l.Release(bg))
	a.fail = 0
	_, err = e.db.Do(bg, k, []byte("fp"), a.fn)
	require.NoError(t, err)
	a.wantRuns(t, 1, 2, 1)

	k2 := key("a", "k2") // a step that only started is no obstacle
	l = e.claim(k2, "fp")
	_, err = l.Step(bg, "one", nil, func(context.Context, *receipts.Step) ([]byte, error) { return nil, errors.New("timeout") })
	require.ErrorIs(t, err, receipts.ErrOutcomeUnknown)
	l = e.claim(k2, "fp")
	require.NoError(t, l.Forget(bg))
	_, err = e.db.Lookup(bg, k2)
	require.ErrorIs(t, err, receipts.ErrNotFound)
}

// Under Options.HashKeys a key's steps are kept, replayed and listed as without it; the
// step keys are the same for the listed (hashed) key as for the raw one.
func testStepsHashKeys(t *testing.T, s Store) {
	bg := bounded(t)
	e := hashEnv(t, s, nil)
	k := key("tenant-secret", "order-1")
	a := &action{fail: 3, failErr: errors.New("timeout")}
	_, err := e.db.Do(bg, k, []byte("fp"), a.fn)
	if errors.Is(err, receipts.ErrUnsupported) {
		t.Skip(err)
	}
	require.ErrorIs(t, err, receipts.ErrOutcomeUnknown)
	steps, err := e.db.Steps(bg, k)
	require.NoError(t, err)
	require.Len(t, steps, 3)
	require.Equal(t, a.keys[2].Load(), steps[2].ProviderKey)
	var listed *receipts.Receipt
	for r, err := range e.db.Scan(bg, receipts.Filter{}) {
		require.NoError(t, err)
		listed = r
	}
	require.NotNil(t, listed)
	require.NotEqual(t, k, listed.Key, "listed hashed")
	lsteps, err := e.db.Steps(bg, listed.Key)
	require.NoError(t, err)
	require.Equal(t, steps, lsteps, "the listed key reads the same journal")
	a.fail = 0
	_, err = e.db.Do(bg, k, []byte("fp"), a.fn)
	require.NoError(t, err)
	a.wantRuns(t, 1, 1, 2)
}

// A journal goes with its claim's retention: once the record is past Retention (and after
// GC), its steps are gone with it, and a late retry is refused as expired, never resumed or
// run afresh.
func testStepsRetention(t *testing.T, s Store) {
	bg := bounded(t)
	e := stepsEnv(t, s, nil)
	if e.window() <= 0 {
		t.Skip("tombstones are off")
	}
	k := key("a", "old")
	a := &action{fail: 2, failErr: errors.New("timeout")}
	_, err := e.db.Do(bg, k, []byte("fp"), a.fn)
	require.ErrorIs(t, err, receipts.ErrOutcomeUnknown)
	e.clock.Advance(retention + time.Second)
	e.gc()
	_, err = e.db.Steps(bg, k)
	require.ErrorIs(t, err, receipts.ErrNotFound)
	_, err = e.db.Do(bg, k, []byte("fp"), a.fn)
	require.ErrorIs(t, err, receipts.ErrExpired)
	a.wantRuns(t, 1, 1, 0)
}
