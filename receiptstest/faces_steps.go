package receiptstest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/receiptstore/receipts"
	"github.com/stretchr/testify/require"
)

// stepFn is Attempt.Step of either front end (receipthttp, receiptmcp).
type stepFn func(ctx context.Context, name string, fingerprint []byte, fn func(ctx context.Context, s *receipts.Step) ([]byte, error)) ([]byte, error)

// faceSteps is the front-end suites' action of several steps (reserve, charge, notify) and
// the provider its steps call, which deduplicates by the key it is given (Step.ProviderKey),
// as Stripe does by Idempotency-Key. A test plans an operation key's steps (plan); the kit's
// application runs them for a call with that key, and answers with their results. The plan
// is out of band, not in the request, so a retry can carry the same request while its
// handler calls other steps (a deployment changed it) or its step no longer fails.
type faceSteps struct {
	mu       sync.Mutex
	plans    map[string]stepPlan  // by operation key ID
	runs     map[string][]stepRun // by key ID and step name: every run of the step's fn
	provider map[string]int       // the provider's effects, by provider key: at most 1 each
	calls    map[string]int       // the provider's calls, by provider key
}

// stepPlan is what an operation key's handler does: its steps, in order, and the step
// whose reply is lost ("" for none): the provider performs it, and the step's fn returns
// an error of unknown outcome.
type stepPlan struct {
	names []string
	lose  string
}

// stepRun is one run of a step's fn, as the fn saw it.
type stepRun struct {
	recovered   bool
	providerKey string
}

var tripSteps = []string{"reserve", "charge", "notify"}

// plan makes id's handler call the steps names, losing the reply of the step lose.
func (s *faceSteps) plan(id string, names []string, lose string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.plans == nil {
		s.plans = map[string]stepPlan{}
	}
	s.plans[id] = stepPlan{names: names, lose: lose}
}

// planned returns id's plan, if the test made one.
func (s *faceSteps) planned(id string) (stepPlan, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.plans[id]
	return p, ok
}

// run runs id's plan with step (the Attempt's), and returns the steps' results.
func (s *faceSteps) run(ctx context.Context, id string, p stepPlan, step stepFn) ([]string, error) {
	var out []string
	for _, name := range p.names {
		res, err := step(ctx, name, []byte("args of "+name), func(ctx context.Context, st *receipts.Step) ([]byte, error) {
			pk := st.ProviderKey()
			s.mu.Lock()
			if s.runs == nil {
				s.runs, s.provider, s.calls = map[string][]stepRun{}, map[string]int{}, map[string]int{}
			}
			s.runs[id+"/"+name] = append(s.runs[id+"/"+name], stepRun{recovered: st.Recovered(), providerKey: pk})
			s.calls[pk]++
			if s.provider[pk] == 0 { // the provider deduplicates by the key
				s.provider[pk]++
			}
			lose := p.lose == name
			s.mu.Unlock()
			if lose {
				return nil, errors.New("the provider's reply was lost")
			}
			return []byte(name + " done"), nil
		})
		if err != nil {
			return out, fmt.Errorf("step %s: %w", name, err)
		}
		out = append(out, string(res))
	}
	return out, nil
}

// stepRuns returns the runs of id's step name.
func (s *faceSteps) stepRuns(id, name string) []stepRun {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]stepRun(nil), s.runs[id+"/"+name]...)
}

// effects returns how many effects the provider performed for key, and how often it was
// called with it.
func (s *faceSteps) effects(pk string) (effects, calls int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.provider[pk], s.calls[pk]
}

// wantResumed requires id's trip to have resumed at notify: reserve and charge ran once,
// notify twice (the second Recovered, with the first's provider key), and the provider
// performed each step's effect once.
func (s *faceSteps) wantResumed(t testing.TB, id string) {
	t.Helper()
	keys := map[string]bool{}
	for _, name := range tripSteps {
		runs := s.stepRuns(id, name)
		want := 1
		if name == "notify" {
			want = 2
		}
		require.Len(t, runs, want, "%s: runs of step %s", id, name)
		require.False(t, runs[0].recovered, "%s: step %s's first run", id, name)
		if name == "notify" {
			require.True(t, runs[1].recovered, "%s: the retry of the uncertain step runs Recovered", id)
			require.Equal(t, runs[0].providerKey, runs[1].providerKey, "%s: the uncertain step's retry has the same provider key", id)
		}
		pk := runs[0].providerKey
		require.Regexp(t, `^rk_[A-Za-z0-9_-]{43}$`, pk)
		require.False(t, keys[pk], "%s: step %s's provider key is another step's", id, name)
		keys[pk] = true
		fx, calls := s.effects(pk)
		require.Equal(t, 1, fx, "%s: the provider's effects of step %s", id, name)
		require.Equal(t, want, calls, "%s: the provider's calls for step %s", id, name)
	}
}

// wantJournal requires db's journal of k to hold names, in order, in states.
func wantJournal(t testing.TB, db *receipts.DB, k receipts.Key, names []string, states []receipts.State, what string) {
	t.Helper()
	steps, err := db.Steps(bg, k)
	require.NoError(t, err, "%s: Steps", what)
	require.Len(t, steps, len(names), "%s: the journal", what)
	for i, s := range steps {
		require.Equal(t, names[i], s.Name, "%s: step %d", what, i)
		require.Equal(t, states[i], s.State, "%s: step %d %s", what, i, s.Name)
	}
}

// wantMismatchChangedNothing: after retries of k whose handler called "refund" where the
// journal holds "charge" (a lost reply left reserve done and charge started), no step's fn
// ran again, the journal is unchanged and the claim stays abandoned. On every front end.
func wantMismatchChangedNothing(t testing.TB, f *faceEnv, steps *faceSteps, k receipts.Key) {
	t.Helper()
	for name, want := range map[string]int{"reserve": 1, "charge": 1, "refund": 0, "notify": 0} {
		require.Len(t, steps.stepRuns(k.ID, name), want, "runs of step %s after the mismatches", name)
	}
	wantJournal(t, f.b, k, tripSteps[:2], []receipts.State{receipts.Succeeded, receipts.Pending}, "after the mismatches")
	rec, err := f.b.Lookup(bg, k)
	require.NoError(t, err)
	require.True(t, rec.Abandoned(f.clock.Now()), "a mismatch leaves the claim abandoned")
}
