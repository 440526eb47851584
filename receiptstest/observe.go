package receiptstest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/observe"
	"github.com/stretchr/testify/require"
)

var observeTests = []test{
	{"EventPerTransition", testObserveTransitions},
	{"WaitEvents", testObserveWaits},
	{"KeyHashStableAndOpaque", testObserveKeyHash},
	{"GCEvent", testObserveGC},
	{"BeginnerSeesOperationsBegin", testObserveBegin},
	{"LogsKeyHashUnlessLogKeys", testObserveLogs},
	{"ExpiredRetry", testObserveExpired},
	{"KindFilterDeclines", testObserveKindFilter},
	{"ReplayCarriesStoredTrace", testObserveTrace},
}

// recorder is an Observer that keeps every event.
type recorder struct {
	mu     sync.Mutex
	events []observe.Event // protected by mu
}

func (r *recorder) Observe(_ context.Context, e observe.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

// take returns the events since the last take.
func (r *recorder) take() []observe.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	ev := r.events
	r.events = nil
	return ev
}

// ev is the part of an Event a test compares.
type ev struct {
	Kind      observe.EventKind
	Outcome   observe.Outcome
	Attempt   uint32
	Recovered bool
	Class     string
}

func evs(events []observe.Event) []ev {
	out := make([]ev, len(events))
	for i, e := range events {
		out[i] = ev{e.Kind, e.Outcome, e.Attempt, e.Recovered, e.Class}
	}
	return out
}

func newObservedEnv(t *testing.T, s Store) (*env, *recorder) {
	rec := &recorder{}
	e := newEnv(t, s, func(o *receipts.Options) { o.Observer = rec })
	return e, rec
}

// Every transition is reported once, with its outcome, attempt and class;
// the finish of an attempt carries the class of its claim and how long the
// lease was held.
func testObserveTransitions(t *testing.T, s Store) {
	e, rec := newObservedEnv(t, s)
	db := e.db
	claim, finish := observe.ClaimEvent, observe.FinishEvent
	refund := observe.WithOperationClass(bg, "refund")

	// A first call, its commit, a replay and a mismatch.
	k1 := key("obs", "k1")
	l, _, err := db.Claim(refund, k1, []byte("fp"))
	require.NoError(t, err)
	e.clock.Advance(2 * time.Second)
	_, err = l.Commit(bg, []byte("ok")) // the class comes from the claim
	require.NoError(t, err)
	e.replay(k1, "fp")
	_, _, err = db.Claim(bg, k1, []byte("other"))
	require.ErrorIs(t, err, receipts.ErrIntentMismatch)
	got := rec.take()
	require.Equal(t, []ev{
		{claim, observe.OutcomeClaimed, 1, false, "refund"},
		{finish, observe.OutcomeSucceeded, 1, false, "refund"},
		{claim, observe.OutcomeReplayed, 1, false, ""},
		{claim, observe.OutcomeMismatch, 0, false, ""},
	}, evs(got))
	require.Equal(t, 2*time.Second, got[1].Held, "Held: claim to commit by the store's clock")
	for _, x := range got {
		require.NotEmpty(t, x.Engine)
		require.Equal(t, got[0].Engine, x.Engine)
		require.False(t, x.Start.IsZero())
		require.GreaterOrEqual(t, x.Duration, time.Duration(0))
	}

	// In progress, a takeover, the stale holder's commit, an abandon.
	k2 := key("obs", "k2")
	old := e.claim(k2, "fp")
	e.inProgress(k2, "fp")
	e.clock.Advance(leaseTTL + time.Second)
	nl := e.claim(k2, "fp")
	_, err = old.Commit(bg, []byte("late"))
	require.ErrorIs(t, err, receipts.ErrLeaseLost)
	_, err = old.Commit(bg, []byte("late"))
	require.ErrorIs(t, err, receipts.ErrLeaseLost)
	require.NoError(t, nl.Abandon(bg))
	require.Equal(t, []ev{
		{claim, observe.OutcomeClaimed, 1, false, ""},
		{claim, observe.OutcomeInProgress, 0, false, ""},
		{claim, observe.OutcomeTookOver, 2, true, ""},
		{finish, observe.OutcomeLeaseLost, 1, false, ""}, // once per lease
		{finish, observe.OutcomeAbandoned, 2, true, ""},
	}, evs(rec.take()))

	// Release, a Do that fails permanently, a Do that is not performed.
	k3, k4, k5 := key("obs", "k3"), key("obs", "k4"), key("obs", "k5")
	require.NoError(t, e.claim(k3, "fp").Release(bg))
	_, err = db.Do(bg, k4, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
		return nil, receipts.Permanent(errors.New("card declined"))
	})
	require.ErrorIs(t, err, receipts.ErrFailed)
	_, err = db.Do(bg, k5, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
		return nil, receipts.NotPerformed(errors.New("validation"))
	})
	require.Error(t, err)
	require.Equal(t, []ev{
		{claim, observe.OutcomeClaimed, 1, false, ""},
		{finish, observe.OutcomeReleased, 1, false, ""},
		{claim, observe.OutcomeClaimed, 1, false, ""},
		{finish, observe.OutcomeFailed, 1, false, ""},
		{observe.DoEvent, observe.OutcomeFailed, 1, false, ""},
		{claim, observe.OutcomeClaimed, 1, false, ""},
		{finish, observe.OutcomeReleased, 1, false, ""},
		{observe.DoEvent, observe.OutcomeReleased, 0, false, ""},
	}, evs(rec.take()))
	_, err = db.Do(bg, k4, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
		panic("a replay must not run")
	})
	require.ErrorIs(t, err, receipts.ErrFailed)
	_, err = db.Do(bg, k5, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
		return nil, errors.New("timeout talking to the provider")
	})
	require.ErrorIs(t, err, receipts.ErrOutcomeUnknown)
	require.Equal(t, []ev{
		{claim, observe.OutcomeReplayed, 1, false, ""},
		{observe.DoEvent, observe.OutcomeReplayed, 1, false, ""},
		{claim, observe.OutcomeClaimed, 1, false, ""},
		{finish, observe.OutcomeAbandoned, 1, false, ""},
		{observe.DoEvent, observe.OutcomeAbandoned, 0, false, ""},
	}, evs(rec.take()))

	// Bad input is an error outcome, and changes nothing.
	_, _, err = db.Claim(bg, receipts.Key{Scope: "obs"}, []byte("fp"))
	require.ErrorIs(t, err, receipts.ErrInvalidKey)
	require.Equal(t, []ev{{claim, observe.OutcomeError, 0, false, ""}}, evs(rec.take()))
}

// A claim that waits reports the wait, with how it ended, before the claim.
func testObserveWaits(t *testing.T, s Store) {
	e, rec := newObservedEnv(t, s)
	k := key("obs", "wait")
	holder := e.claim(k, "fp")
	rec.take()
	claim, wait := observe.ClaimEvent, observe.WaitEvent

	// Bounded by WaitAtMost: it waits, then answers in progress.
	_, _, err := e.db.Claim(bg, k, []byte("fp"), receipts.WaitAtMost(200*time.Millisecond))
	require.ErrorIs(t, err, receipts.ErrInProgress)
	got := rec.take()
	if len(got) == 1 { // the first read itself outlasted the bound (a loaded machine): no wait began
		require.Equal(t, []ev{{claim, observe.OutcomeInProgress, 0, false, ""}}, evs(got))
	} else {
		require.Equal(t, []ev{{wait, observe.OutcomeInProgress, 0, false, ""}, {claim, observe.OutcomeInProgress, 0, false, ""}}, evs(got))
		require.Positive(t, got[0].Duration)
	}
	require.GreaterOrEqual(t, got[len(got)-1].Duration, 200*time.Millisecond, "the claim lasted its bound (process clock)")

	// Bounded by the context.
	ctx, cancel := context.WithTimeout(bg, 200*time.Millisecond)
	defer cancel()
	_, _, err = e.db.Claim(ctx, k, []byte("fp"), receipts.WaitForResult())
	require.ErrorIs(t, err, receipts.ErrInProgress)
	require.Equal(t, []ev{{wait, observe.OutcomeCanceled, 0, false, ""}, {claim, observe.OutcomeCanceled, 0, false, ""}}, evs(rec.take()))

	// Ended by the holder's commit: the waiter gets the receipt.
	done := make(chan error, 1)
	go func() {
		_, r, err := e.db.Claim(bg, k, []byte("fp"), receipts.WaitForResult())
		if err == nil && r == nil {
			err = errors.New("no receipt")
		}
		done <- err
	}()
	require.Eventually(t, func() bool { return e.db.Stats().Waiters == 1 }, 10*time.Second, time.Millisecond,
		"Stats.Waiters counts the waiting claim")
	require.Empty(t, rec.take(), "no event while the waiter waits")
	_, err = holder.Commit(bg, []byte("ok"))
	require.NoError(t, err)
	require.NoError(t, recv(t, done, "the waiter"))
	require.Zero(t, e.db.Stats().Waiters)
	// The holder's finish and the waiter's events come from two goroutines: the waiter is
	// woken as the commit lands, so either may be reported first. The waiter's own come in
	// order.
	var holderEvs, waiterEvs []observe.Event
	for _, x := range rec.take() {
		if x.Kind == observe.FinishEvent {
			holderEvs = append(holderEvs, x)
		} else {
			waiterEvs = append(waiterEvs, x)
		}
	}
	require.Equal(t, []ev{{observe.FinishEvent, observe.OutcomeSucceeded, 1, false, ""}}, evs(holderEvs))
	require.Equal(t, []ev{
		{wait, observe.OutcomeReplayed, 0, false, ""},
		{claim, observe.OutcomeReplayed, 1, false, ""},
	}, evs(waiterEvs))
}

var hexHash = regexp.MustCompile(`^[0-9a-f]{24}$`)

// KeyHash names a key without revealing it: the same for the same key
// (across a restart), different for different keys, and nothing in an
// Event shows the scope or the ID.
func testObserveKeyHash(t *testing.T, s Store) {
	e, rec := newObservedEnv(t, s)
	k1 := key("tenant-7f3a9", "order-51c2e")
	k2 := key("tenant-7f3a9", "order-51c2f")
	e.commit(k1, "fp", "ok")
	e.replay(k1, "fp")
	e.commit(k2, "fp", "ok")
	got := rec.take()
	require.Len(t, got, 5)
	h1 := got[0].KeyHash()
	require.Regexp(t, hexHash, h1)
	require.Equal(t, h1, got[1].KeyHash())
	require.Equal(t, h1, got[2].KeyHash())
	require.NotEqual(t, h1, got[3].KeyHash())
	require.Equal(t, got[3].KeyHash(), got[4].KeyHash())
	for _, x := range got {
		for _, f := range []string{"%v", "%+v", "%#v"} {
			s := fmt.Sprintf(f, x)
			require.NotContains(t, s, "tenant-7f3a9")
			require.NotContains(t, s, "order-51c2")
		}
		js, err := json.Marshal(x)
		require.NoError(t, err)
		require.NotContains(t, string(js), "tenant-7f3a9")
		require.NotContains(t, string(js), "order-51c2")
	}
	e.reopen()
	e.replay(k1, "fp")
	require.Equal(t, h1, rec.take()[0].KeyHash(), "the same after a restart")

	// Another store: another secret, another hash.
	e2, rec2 := newObservedEnv(t, s)
	e2.commit(k1, "fp", "ok")
	require.NotEqual(t, h1, rec2.take()[0].KeyHash(), "a hash is keyed by its store")
}

// GC reports what it dropped.
func testObserveGC(t *testing.T, s Store) {
	e, rec := newObservedEnv(t, s)
	for i := range 5 {
		e.commit(key("obs", fmt.Sprint(i)), "fp", "ok")
	}
	rec.take()
	e.gc()
	got := rec.take()
	require.Len(t, got, 1)
	require.Equal(t, observe.GCEvent, got[0].Kind)
	require.Equal(t, observe.OutcomeOK, got[0].Outcome)
	require.Zero(t, got[0].EpochsDropped)
	require.Empty(t, got[0].KeyHash())

	e.clock.Advance(3 * retention)
	e.gc()
	got = rec.take()
	require.Len(t, got, 1)
	require.Equal(t, observe.GCEvent, got[0].Kind)
	require.Equal(t, observe.OutcomeOK, got[0].Outcome)
	require.Positive(t, got[0].EpochsDropped)
}

// The logger gets one record per transition, at Info for the ones an
// operator looks for, naming the key by its hash unless LogKeys is set.
func testObserveLogs(t *testing.T, s Store) {
	for _, raw := range []bool{false, true} {
		t.Run(fmt.Sprintf("LogKeys=%v", raw), func(t *testing.T) {
			var mu sync.Mutex
			var buf bytes.Buffer
			h := slog.NewJSONHandler(&lockedWriter{mu: &mu, w: &buf}, &slog.HandlerOptions{Level: slog.LevelInfo})
			rec := &recorder{}
			e := newEnv(t, s, func(o *receipts.Options) {
				o.Logger, o.LogKeys, o.Observer = slog.New(h), raw, rec
			})
			k := key("tenant-9c1d", "charge-77ab")
			e.commit(k, "fp", "ok")
			e.replay(k, "fp")
			old := e.claim(key("tenant-9c1d", "charge-77ac"), "fp")
			e.clock.Advance(leaseTTL + time.Second)
			nl := e.claim(key("tenant-9c1d", "charge-77ac"), "fp")
			_, err := old.Commit(bg, []byte("late"))
			require.ErrorIs(t, err, receipts.ErrLeaseLost)
			require.NoError(t, nl.Abandon(bg))
			var hash string
			for _, x := range rec.take() {
				if x.Outcome == observe.OutcomeTookOver {
					hash = x.KeyHash()
				}
			}

			mu.Lock()
			out := buf.String()
			mu.Unlock()
			var outcomes []string
			for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
				var m map[string]any
				require.NoError(t, json.Unmarshal([]byte(line), &m), line)
				if m["msg"] == "receipts: claim" || m["msg"] == "receipts: finish" {
					require.Equal(t, "INFO", m["level"], line)
					outcomes = append(outcomes, fmt.Sprint(m["outcome"]))
					if raw {
						require.Equal(t, "tenant-9c1d", m["scope"], line)
						require.Equal(t, "charge-77ac", m["id"], line)
					} else {
						require.Equal(t, hash, m["key_hash"], line)
					}
				}
			}
			// Claims, commits and replays are Debug: not at Info.
			require.Equal(t, []string{"took_over", "lease_lost", "abandoned"}, outcomes, out)
			if !raw {
				require.NotContains(t, out, "tenant-9c1d")
				require.NotContains(t, out, "charge-77a")
			}
		})
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// beginner records what Begin saw and marks the context it returns.
type beginner struct {
	recorder
	begun []observe.EventKind // protected by recorder.mu
}

type beginMark struct{}

func (b *beginner) Begin(ctx context.Context, kind observe.EventKind) context.Context {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.begun = append(b.begun, kind)
	marks, _ := ctx.Value(beginMark{}).([]observe.EventKind)
	return context.WithValue(ctx, beginMark{}, append(append([]observe.EventKind(nil), marks...), kind))
}

// An observer that is a observe.Beginner sees a Do and its claim begin;
// the context it returns is the one fn runs with and the one the
// operation's events are observed with.
func testObserveBegin(t *testing.T, s Store) {
	b := &beginner{}
	var mu sync.Mutex
	var marks []string
	obs := struct {
		observe.Beginner
		observe.Observer
	}{b, observe.ObserverFunc(func(ctx context.Context, e observe.Event) {
		m, _ := ctx.Value(beginMark{}).([]observe.EventKind)
		mu.Lock()
		marks = append(marks, fmt.Sprint(e.Kind, m))
		mu.Unlock()
	})}
	e := newEnv(t, s, func(o *receipts.Options) { o.Observer = obs })
	var inFn []observe.EventKind
	_, err := e.db.Do(bg, key("obs", "begin"), []byte("fp"), func(ctx context.Context, _ *receipts.Lease) ([]byte, error) {
		inFn, _ = ctx.Value(beginMark{}).([]observe.EventKind)
		return []byte("ok"), nil
	})
	require.NoError(t, err)
	require.Equal(t, []observe.EventKind{observe.DoEvent, observe.ClaimEvent}, b.begun)
	require.Equal(t, []observe.EventKind{observe.DoEvent}, inFn, "fn runs with the context Begin(DoEvent) returned")
	require.Equal(t, []string{"claim [do claim]", "finish [do]", "do [do]"}, marks)
}

// A retry of a key past its retention, inside the tombstone window, is an
// expired claim, and Do reports it as such.
func testObserveExpired(t *testing.T, s Store) {
	rec := &recorder{}
	e := tombEnv(t, s, func(o *receipts.Options) { o.Observer = rec })
	k := key("obs", "late")
	e.commit(k, "fp", "ok")
	e.clock.Advance(retention + time.Minute)
	rec.take()
	_, _, err := e.db.Claim(bg, k, []byte("other"))
	require.ErrorIs(t, err, receipts.ErrExpired)
	_, err = e.db.Do(bg, k, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
		panic("a late retry must not run")
	})
	require.ErrorIs(t, err, receipts.ErrExpired)
	require.Equal(t, []ev{
		{observe.ClaimEvent, observe.OutcomeExpired, 0, false, ""},
		{observe.ClaimEvent, observe.OutcomeExpired, 0, false, ""},
		{observe.DoEvent, observe.OutcomeExpired, 0, false, ""},
	}, evs(rec.take()))
}

// noDo is a recorder that declines DoEvents (observe.KindFilter).
type noDo struct{ recorder }

func (*noDo) ObservesKind(k observe.EventKind) bool { return k != observe.DoEvent }

// An observer that is a KindFilter gets only the kinds it takes.
func testObserveKindFilter(t *testing.T, s Store) {
	rec := &noDo{}
	e := newEnv(t, s, func(o *receipts.Options) { o.Observer = rec })
	_, err := e.db.Do(bg, key("obs", "f"), []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) { return []byte("ok"), nil })
	require.NoError(t, err)
	require.Equal(t, []ev{
		{observe.ClaimEvent, observe.OutcomeClaimed, 1, false, ""},
		{observe.FinishEvent, observe.OutcomeSucceeded, 1, false, ""},
	}, evs(rec.take()), "no DoEvent")
}

// traceRecorder is a recorder that is also a observe.TraceRecorder: it
// stores the trace context the finishing call's context carries (traceIn).
type traceRecorder struct{ recorder }

type traceKey struct{}

func traceIn(ctx context.Context, trace string) context.Context {
	return context.WithValue(ctx, traceKey{}, []byte(trace))
}

func (r *traceRecorder) TraceContext(ctx context.Context) []byte {
	b, _ := ctx.Value(traceKey{}).([]byte)
	return b
}

// replayTraces returns the Trace of the replayed ClaimEvent and DoEvent
// among evs (nil: none of that kind).
func replayTraces(evs []observe.Event) (claim, do []byte) {
	for _, e := range evs {
		if e.Outcome != observe.OutcomeReplayed {
			continue
		}
		switch e.Kind {
		case observe.ClaimEvent:
			claim = e.Trace
		case observe.DoEvent:
			do = e.Trace
		}
	}
	return claim, do
}

// A TraceRecorder's trace context, taken when the lease is finished, is
// stored with the receipt and comes back on every replay's ClaimEvent and
// DoEvent, also after a restart (read from the store, not from memory):
// for Do (the context fn ran with) and for Commit. One longer than
// MaxTraceContext is not stored; nor is anything while the observer is not
// a TraceRecorder.
func testObserveTrace(t *testing.T, s Store) {
	rec := &traceRecorder{}
	e := newEnv(t, s, func(o *receipts.Options) { o.Observer = rec })
	fn := func(context.Context, *receipts.Lease) ([]byte, error) { return []byte("r"), nil }
	kDo, kCommit, kLong := key("trace", "do"), key("trace", "commit"), key("trace", "long")

	_, err := e.db.Do(traceIn(bg, "00-do"), kDo, []byte("fp"), fn)
	require.NoError(t, err)
	l, _, err := e.db.Claim(bg, kCommit, []byte("fp"))
	require.NoError(t, err)
	_, err = l.Commit(traceIn(bg, "00-commit"), []byte("r"))
	require.NoError(t, err)
	_, err = e.db.Do(traceIn(bg, strings.Repeat("x", observe.MaxTraceContext+1)), kLong, []byte("fp"), fn)
	require.NoError(t, err)

	for _, restarted := range []bool{false, true} {
		if restarted {
			e.reopen()
		}
		rec.take()
		_, err = e.db.Do(traceIn(bg, "00-retry"), kDo, []byte("fp"), fn) // the retry's own context is not stored
		require.NoError(t, err)
		claim, do := replayTraces(rec.take())
		require.Equal(t, "00-do", string(claim), "restarted %v: the replay's ClaimEvent", restarted)
		require.Equal(t, "00-do", string(do), "restarted %v: the replay's DoEvent", restarted)
		e.replay(kCommit, "fp")
		claim, _ = replayTraces(rec.take())
		require.Equal(t, "00-commit", string(claim), "restarted %v: a receipt recorded by Commit", restarted)
		e.replay(kLong, "fp")
		claim, _ = replayTraces(rec.take())
		require.Nil(t, claim, "restarted %v: a trace context longer than MaxTraceContext is not stored", restarted)
	}

	plain := &recorder{}
	e2 := newEnv(t, s, func(o *receipts.Options) { o.Observer = plain })
	k := key("trace", "plain")
	_, err = e2.db.Do(traceIn(bg, "00-plain"), k, []byte("fp"), fn)
	require.NoError(t, err)
	plain.take()
	e2.replay(k, "fp")
	claim, _ := replayTraces(plain.take())
	require.Nil(t, claim, "an observer that is not a TraceRecorder stores nothing")
}

// ObserverCalls makes, on db, the Do's an observer's tests compare two ways of observing
// with (package receiptsprom's and receiptsotel's TestReplayObserverMatchesEvents): in scope,
// with ctx (which may carry a class and a span) unless said otherwise, a first call and its
// replays, a replay with a bare context, a failed receipt and its replay, a mismatch, a Do
// nested in another's fn and the outer one's replay, and a replay after a wait (the holder
// commits while the Do waits). ok is the fn of the calls that succeed. It returns the keys'
// IDs, for a test that names keys by their hashes.
func ObserverCalls(t testing.TB, db *receipts.DB, ctx context.Context, scope string,
	ok func(context.Context, *receipts.Lease) ([]byte, error),
) []string {
	t.Helper()
	k := func(id string) receipts.Key { return receipts.Key{Scope: scope, ID: id} }
	for range 3 { // a first call, then its replays
		_, err := db.Do(ctx, k("a"), []byte("fp"), ok)
		require.NoError(t, err)
	}
	_, err := db.Do(context.Background(), k("a"), []byte("fp"), ok) // no class, no span
	require.NoError(t, err)
	for range 2 { // a failed receipt, then its replay
		_, err = db.Do(ctx, k("f"), []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
			return nil, receipts.Permanent(errors.New("declined"))
		})
		require.ErrorIs(t, err, receipts.ErrFailed)
	}
	_, err = db.Do(ctx, k("a"), []byte("other"), ok)
	require.ErrorIs(t, err, receipts.ErrIntentMismatch)
	for range 2 { // a nested Do, then the outer one's replay
		_, err = db.Do(ctx, k("outer"), []byte("fp"), func(ctx context.Context, _ *receipts.Lease) ([]byte, error) {
			r, err := db.Do(ctx, k("inner"), []byte("fp"), ok)
			if err != nil {
				return nil, err
			}
			return r.Result, nil
		})
		require.NoError(t, err)
	}
	l, _, err := db.Claim(ctx, k("w"), []byte("fp"))
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		_, err := db.Do(ctx, k("w"), []byte("fp"), ok)
		done <- err
	}()
	require.Eventually(t, func() bool { return db.Stats().Waiters == 1 }, 30*time.Second, time.Millisecond)
	_, err = l.Commit(ctx, []byte("ok"))
	require.NoError(t, err)
	require.NoError(t, <-done)
	return []string{"a", "f", "outer", "inner", "w"}
}
