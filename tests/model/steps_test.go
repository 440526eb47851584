package model_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/internal/pgtest"
	"github.com/receiptstore/receipts/internal/testkit"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/receiptstore/receipts/pgstore"
	"github.com/receiptstore/receipts/receiptstest"
	"github.com/receiptstore/receipts/tests/pgnodes"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// TestModelSteps is the model test of steps (Lease.Step, issue 45): actions of three steps,
// each step's fn calling a provider that deduplicates by the step's ProviderKey, with a
// fault at any point of an attempt, on both engines:
//
//   - a crash (the process dies: on Pebble a crash image of the crashable vfs keeps what was
//     synced; on PostgreSQL the process's connections are cut and it never reconnects) before
//     a step, inside a step's fn before or after its provider call, after the last step, or
//     after Do returned;
//   - a lost reply: the provider's (its effect happened, fn returns an unknown error), or on
//     PostgreSQL the database's (the connections cut at that point or a random moment later,
//     so a statement's reply is lost whether or not it committed);
//   - a cancelled context (at a point, or on PostgreSQL at a random moment);
//   - NotPerformed from a step's fn before its provider call.
//
// Every point where the durable state can change is between two of these points (a step's
// start is written before its fn, its outcome after), so a crash "anywhere" is one of them.
// After the faults every key is retried without faults until its receipt is recorded.
//
// The properties, checked on every run of every fn and at the end:
//
//   - each step's fn runs with its step key (the same on every attempt and node, different
//     for every other step and key) until one run is recorded; a recorded step (its Step
//     returned nil, or DB.Steps shows it finished) never runs again, and no fn runs after
//     the receipt is recorded;
//
//   - fn is told Recovered whenever the provider may have seen its key (a step the engine
//     calls never started has never reached the provider);
//
//   - the provider sees at most one effect per step (deduplicating by the key it gets), and
//     exactly one at the end;
//
//   - a step's result, run or replayed, is its provider's; the receipt is recorded once,
//     every later Do replays it, and its result is the concatenation of the steps' results.
//
//     go test -run TestModelSteps ./tests/model                          # CI: a few seconds
//     RECEIPTS_STEPS_CHECKS=5000 go test -run TestModelSteps ./tests/model # a longer soak
//     go test -run TestModelSteps/pebble -rapid.seed=N ./tests/model     # replay one failure
func TestModelSteps(t *testing.T) {
	defer func() {
		t.Logf("%d fault attempts, %d fn runs, %d resumed attempts (a recorded step replayed)",
			stepsTotals.faults.Load(), stepsTotals.runs.Load(), stepsTotals.resumed.Load())
	}()
	t.Run("pebble", func(t *testing.T) {
		stepsRapid(t, stepsChecks(200), func(rt *rapid.T) {
			w := newPebbleSteps(rt)
			defer w.close()
			runStepsModel(rt, w)
		})
	})
	t.Run("postgres", func(t *testing.T) {
		dsn, schema := pgtest.Schema(t)
		u, err := url.Parse(dsn)
		if err != nil || u.Host == "" {
			t.Skipf("want a URL DSN, got %q", dsn)
		}
		target := u.Host
		if _, _, err := net.SplitHostPort(target); err != nil {
			target = net.JoinHostPort(target, "5432")
		}
		var run atomic.Int64
		// One clock for every check: the store keeps its time's high-water mark in the schema.
		clock := receiptstest.NewClock(receiptstest.DefaultStart)
		stepsRapid(t, stepsChecks(12), func(rt *rapid.T) {
			w := &pgSteps{dsn: u, target: target, schema: schema, clock: clock}
			w.prefix = fmt.Sprintf("r%d-", run.Add(1))
			w.open(rt)
			defer w.close()
			runStepsModel(rt, w)
		})
	})
}

// stepsChecks is the number of checks: def in CI (less under -race), RECEIPTS_STEPS_CHECKS,
// or 50 times def with RECEIPTS_SOAK=1.
func stepsChecks(def int) int {
	switch {
	case testkit.Soak():
		def *= 50
	case testkit.RaceEnabled:
		def = max(def/10, 5)
	}
	return testkit.EnvInt("RECEIPTS_STEPS_CHECKS", def)
}

// stepsRapid runs prop for n checks: -rapid.checks when given, else n.
func stepsRapid(t *testing.T, n int, prop func(*rapid.T)) {
	if f := flag.Lookup("rapid.checks"); f != nil && f.Value.String() == f.DefValue && n < 100 {
		require.NoError(t, flag.Set("rapid.checks", strconv.Itoa(n)))
		defer func() { _ = flag.Set("rapid.checks", f.DefValue) }()
	}
	testkit.RunRapid(t, n, prop)
}

// stepsWorld is one engine as the model test drives it: a process that may die.
type stepsWorld interface {
	db() *receipts.DB
	now() *receiptstest.Clock
	keyPrefix() string
	// crash kills the process now: nothing it does from here on reaches the store.
	crash(rt *rapid.T)
	// afterAttempt ends an attempt: a crashed process is replaced by a new one.
	afterAttempt(rt *rapid.T)
	// cut loses the replies of the store's statements (PostgreSQL: the connections are cut
	// now, or delay later); false if the engine has no network.
	cut(delay time.Duration) bool
	close()
}

// pebbleSteps is the Pebble engine on a crashable in-memory vfs.
type pebbleSteps struct {
	fs      *vfs.MemFS
	clock   *receiptstest.Clock
	opts    pebblestore.Options
	d       *receipts.DB
	image   *vfs.MemFS // the crash image, once the process died
	rng     *rand.Rand
	unsyncd int
}

func newPebbleSteps(rt *rapid.T) *pebbleSteps {
	w := &pebbleSteps{fs: vfs.NewCrashableMem(), clock: receiptstest.NewClock(receiptstest.DefaultStart)}
	w.unsyncd = rapid.SampledFrom([]int{0, 50, 100}).Draw(rt, "unsyncedDataPercent")
	w.rng = rand.New(rand.NewPCG(rapid.Uint64().Draw(rt, "crashSeed"), 1))
	w.opts = pebblestore.Options{Options: receipts.Options{
		Retention: 30 * 24 * time.Hour, LeaseTTL: time.Minute, GCInterval: -1, Now: w.clock.Now,
	}}
	w.open(rt)
	return w
}

func (w *pebbleSteps) open(rt *rapid.T) {
	o := w.opts
	o.Pebble = &pebble.Options{FS: w.fs}
	d, err := pebblestore.Open("db", &o)
	if err != nil {
		rt.Fatalf("open: %v", err)
	}
	w.d = d
}

func (w *pebbleSteps) db() *receipts.DB         { return w.d }
func (w *pebbleSteps) now() *receiptstest.Clock { return w.clock }
func (w *pebbleSteps) keyPrefix() string        { return "" }
func (w *pebbleSteps) cut(time.Duration) bool   { return false }

func (w *pebbleSteps) crash(*rapid.T) {
	if w.image == nil {
		w.image = w.fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: w.unsyncd, RNG: rand.New(rand.NewPCG(w.rng.Uint64(), 2))})
	}
}

func (w *pebbleSteps) afterAttempt(rt *rapid.T) {
	if w.image == nil {
		return
	}
	_ = w.d.Close() // the dead process's writes go to the old vfs, thrown away
	w.fs, w.image = w.image, nil
	w.open(rt)
}

func (w *pebbleSteps) close() {
	if w.d != nil {
		_ = w.d.Close()
	}
}

// pgSteps is the PostgreSQL engine; each process reaches the server through a proxy of its
// own, so a crash (the proxy closed) keeps everything the process does after it from the
// server, and a cut loses the replies of the statements in flight.
type pgSteps struct {
	dsn            *url.URL
	target, schema string
	prefix         string
	clock          *receiptstest.Clock
	proxy          *pgnodes.Proxy
	pool           *pgxpool.Pool
	d              *receipts.DB
	dead           bool

	mu     sync.Mutex
	timers []*time.Timer
}

func (w *pgSteps) open(rt *rapid.T) {
	p, err := pgnodes.NewProxy(w.target)
	if err != nil {
		rt.Fatalf("proxy: %v", err)
	}
	u := *w.dsn
	u.Host = p.Addr()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		rt.Fatalf("pool: %v", err)
	}
	cfg.MaxConns = 4
	cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	pgstore.Configure(cfg)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		_ = p.Close()
		rt.Fatalf("pool: %v", err)
	}
	d, err := pgstore.Open(ctx, pool, &pgstore.Options{Schema: w.schema, Options: receipts.Options{
		Logger:    slog.New(slog.DiscardHandler), // a dead process's failed abandons are expected
		Retention: 30 * 24 * time.Hour, LeaseTTL: time.Minute, GCInterval: -1, Now: w.clock.Now,
	}})
	if err != nil {
		pool.Close()
		_ = p.Close()
		rt.Fatalf("open: %v", err)
	}
	w.proxy, w.pool, w.d, w.dead = p, pool, d, false
}

func (w *pgSteps) db() *receipts.DB         { return w.d }
func (w *pgSteps) now() *receiptstest.Clock { return w.clock }
func (w *pgSteps) keyPrefix() string        { return w.prefix }

func (w *pgSteps) crash(*rapid.T) {
	w.dead = true
	_ = w.proxy.Close()
	w.pool.Close() // what the dead process tries next fails at once
}

func (w *pgSteps) cut(delay time.Duration) bool {
	if delay <= 0 {
		w.proxy.Cut()
		return true
	}
	p := w.proxy
	w.mu.Lock()
	w.timers = append(w.timers, time.AfterFunc(delay, func() { p.Cut() }))
	w.mu.Unlock()
	return true
}

func (w *pgSteps) stopTimers() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, tm := range w.timers {
		tm.Stop()
	}
	w.timers = nil
}

func (w *pgSteps) shut() {
	w.stopTimers()
	_ = w.d.Close()
	w.pool.Close()
	_ = w.proxy.Close()
}

func (w *pgSteps) afterAttempt(rt *rapid.T) {
	w.stopTimers()
	if !w.dead {
		return
	}
	w.shut()
	w.open(rt)
}

func (w *pgSteps) close() {
	if w.d != nil {
		w.shut()
	}
}

var stepsNames = [3]string{"reserve", "charge", "notify"}

// The points of an attempt where a fault strikes: before step i's Step (3i), in its fn before
// the provider call (3i+1) and after it (3i+2), after the last step (9), after Do returned (10).
const stepsPoints = 11

type stepsFault struct {
	kind  string // "", crash, cancel, cut, lost, notperformed
	point int
	delay time.Duration // cut and cancel on PostgreSQL: at a random moment
}

// stepsKey is the model of one key's action.
type stepsKey struct {
	k        receipts.Key
	provKey  [3]string // the step keys, as first seen
	recorded [3]bool   // the step's run is recorded: it never runs again
	done     bool      // the receipt is recorded
	result   []byte
}

// provEffect is what the provider did for one step key.
type provEffect struct {
	result string
	key    receipts.Key
	step   int
}

type stepsRun struct {
	rt      *rapid.T
	w       stepsWorld
	keys    []*stepsKey
	prov    map[string]*provEffect   // the provider, by step key
	effects map[receipts.Key]*[3]int // effects per step of each key
	seq     int
	runs    int // fn runs
	resumed int // attempts that replayed a recorded step
}

// stepsTotals counts, over a run's checks, what was exercised.
var stepsTotals struct{ runs, resumed, faults atomic.Int64 }

var errCrashed = errors.New("the process died")

func runStepsModel(rt *rapid.T, w stepsWorld) {
	r := &stepsRun{rt: rt, w: w, prov: map[string]*provEffect{}, effects: map[receipts.Key]*[3]int{}}
	for i := range 2 {
		k := receipts.Key{Scope: "trips", ID: fmt.Sprintf("%strip-%d", w.keyPrefix(), i)}
		r.keys = append(r.keys, &stepsKey{k: k})
		r.effects[k] = &[3]int{}
	}
	_, pg := w.(*pgSteps)
	kinds := []string{"", "crash", "cancel", "lost", "notperformed"}
	if pg {
		kinds = append(kinds, "cut", "cut")
	}
	n := rapid.IntRange(1, 6).Draw(rt, "attempts")
	for range n {
		km := rapid.SampledFrom(r.keys).Draw(rt, "key")
		f := stepsFault{kind: rapid.SampledFrom(kinds).Draw(rt, "fault"), point: rapid.IntRange(0, stepsPoints-1).Draw(rt, "point")}
		if pg && (f.kind == "cut" || f.kind == "cancel") && rapid.Bool().Draw(rt, "atRandomMoment") {
			f.delay = time.Duration(rapid.IntRange(1, 3000).Draw(rt, "delayMicros")) * time.Microsecond
		}
		r.attempt(km, f)
	}
	for _, km := range r.keys {
		r.finish(km)
	}
	stepsTotals.runs.Add(int64(r.runs))
	stepsTotals.resumed.Add(int64(r.resumed))
	stepsTotals.faults.Add(int64(n))
}

// observe marks the steps DB.Steps shows finished as recorded, and checks that every step
// acknowledged as recorded is there (durably, after a crash).
func (r *stepsRun) observe(km *stepsKey) {
	steps, err := r.w.db().Steps(context.Background(), km.k)
	if errors.Is(err, receipts.ErrNotFound) {
		steps, err = nil, nil
	}
	if err != nil {
		return // a cut connection: nothing learned
	}
	for i := range 3 {
		if km.recorded[i] && (i >= len(steps) || steps[i].State != receipts.Succeeded) {
			r.rt.Fatalf("%v: step %d was recorded, DB.Steps shows %+v", km.k, i, steps)
		}
	}
	for i, s := range steps {
		if i >= 3 || s.Name != stepsNames[i] {
			r.rt.Fatalf("%v: DB.Steps %+v", km.k, steps)
		}
		if km.provKey[i] != "" && s.ProviderKey != km.provKey[i] {
			r.rt.Fatalf("%v: step %d's ProviderKey %q in DB.Steps, its fn got %q", km.k, i, s.ProviderKey, km.provKey[i])
		}
		if s.State == receipts.Succeeded {
			r.checkResult(km, i, s.Result, "DB.Steps")
			km.recorded[i] = true
		}
	}
}

// checkResult checks that res is step i's provider's result.
func (r *stepsRun) checkResult(km *stepsKey, i int, res []byte, how string) {
	pk := km.provKey[i]
	e := r.prov[pk]
	if pk == "" || e == nil {
		r.rt.Fatalf("%v: step %d: %s gives %q, but no run of it reached its provider", km.k, i, how, res)
	}
	if string(res) != e.result {
		r.rt.Fatalf("%v: step %d: %s gives %q, its provider's result is %q (a step replayed from another key or position)", km.k, i, how, res, e.result)
	}
}

// stepFn is step i's fn in an attempt with fault f.
func (r *stepsRun) stepFn(km *stepsKey, i int, f stepsFault, at func(int) error) func(context.Context, *receipts.Step) ([]byte, error) {
	return func(ctx context.Context, s *receipts.Step) ([]byte, error) {
		rt := r.rt
		r.runs++
		pk := s.ProviderKey()
		switch {
		case km.done:
			rt.Fatalf("%v: step %d ran after the receipt was recorded", km.k, i)
		case km.recorded[i]:
			rt.Fatalf("%v: step %d ran again after a run of it was recorded", km.k, i)
		case s.Index() != i || s.Name() != stepsNames[i]:
			rt.Fatalf("%v: step %d's fn got Index %d, Name %q", km.k, i, s.Index(), s.Name())
		}
		if km.provKey[i] == "" {
			if e := r.prov[pk]; e != nil {
				rt.Fatalf("%v: step %d's key %q is step %d of %v's", km.k, i, pk, e.step, e.key)
			}
			for _, o := range r.keys {
				for j, opk := range o.provKey {
					if opk == pk {
						rt.Fatalf("%v: step %d's key %q is step %d of %v's", km.k, i, pk, j, o.k)
					}
				}
			}
			km.provKey[i] = pk
		} else if pk != km.provKey[i] {
			rt.Fatalf("%v: step %d ran with the key %q, before with %q", km.k, i, pk, km.provKey[i])
		}
		if err := at(3*i + 1); err != nil {
			return nil, err
		}
		e := r.prov[pk]
		switch {
		case e != nil && !s.Recovered():
			rt.Fatalf("%v: step %d's fn is told it never started, but its provider saw its key", km.k, i)
		case e == nil && f.kind == "notperformed" && f.point == 3*i+1:
			// Truthful: a Recovered fn asks the provider first, and only what it never saw
			// is NotPerformed.
			return nil, receipts.NotPerformed(errors.New("the provider declined"))
		case e == nil: // the provider does it (and deduplicates by pk from now on)
			r.seq++
			e = &provEffect{result: fmt.Sprintf("%s:%s#%d", km.k.ID, stepsNames[i], r.seq), key: km.k, step: i}
			r.prov[pk] = e
			r.effects[km.k][i]++
			if n := r.effects[km.k][i]; n > 1 {
				rt.Fatalf("%v: step %d has %d effects at its provider", km.k, i, n)
			}
		}
		if err := at(3*i + 2); err != nil {
			return nil, err
		}
		if f.kind == "lost" && f.point == 3*i+2 {
			return nil, errors.New("the provider's reply was lost")
		}
		return []byte(e.result), nil
	}
}

// attempt runs one attempt of km's action with fault f.
func (r *stepsRun) attempt(km *stepsKey, f stepsFault) error {
	rt, w := r.rt, r.w
	w.now().Advance(2 * time.Minute) // every earlier lease (of a dead process) has run out
	r.observe(km)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if f.kind == "cancel" && f.delay > 0 {
		tm := time.AfterFunc(f.delay, cancel)
		defer tm.Stop()
	}
	if f.kind == "cut" && f.delay > 0 {
		w.cut(f.delay)
	}
	dead := false
	at := func(p int) error {
		if dead {
			rt.Fatalf("%v: the attempt went on after its process died", km.k)
		}
		if f.point != p || f.delay > 0 {
			return nil
		}
		switch f.kind {
		case "crash":
			w.crash(rt)
			dead = true
			return errCrashed
		case "cancel":
			cancel()
		case "cut":
			w.cut(0)
		}
		return nil
	}
	replayed := false
	action := func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
		parts := make([]string, 0, 3)
		for i := range 3 {
			if err := at(3 * i); err != nil {
				return nil, err
			}
			before := r.runs
			res, err := l.Step(ctx, stepsNames[i], []byte("args-"+stepsNames[i]), r.stepFn(km, i, f, at))
			if errors.Is(err, receipts.ErrStepMismatch) {
				rt.Fatalf("%v: step %d: %v", km.k, i, err)
			}
			if err != nil {
				return nil, err
			}
			if dead {
				rt.Fatalf("%v: step %d returned after its process died", km.k, i)
			}
			if r.runs == before {
				replayed = true
			}
			r.checkResult(km, i, res, "Step")
			km.recorded[i] = true
			parts = append(parts, string(res))
		}
		if err := at(9); err != nil {
			return nil, err
		}
		return []byte(strings.Join(parts, "|")), nil
	}
	rec, err := w.db().Do(ctx, km.k, []byte("book"), action, receipts.WaitAtMost(time.Second))
	switch {
	case err == nil && !dead:
		r.checkReceipt(km, rec.Result)
	case errors.Is(err, receipts.ErrStepMismatch), errors.Is(err, receipts.ErrCorrupt):
		rt.Fatalf("%v: %v", km.k, err)
	}
	if replayed {
		r.resumed++
	}
	if !dead {
		_ = at(10)
	}
	w.afterAttempt(rt)
	return err
}

// checkReceipt checks a receipt Do returned.
func (r *stepsRun) checkReceipt(km *stepsKey, res []byte) {
	var want []string
	for i := range 3 {
		e := r.prov[km.provKey[i]]
		if km.provKey[i] == "" || e == nil {
			r.rt.Fatalf("%v: a receipt %q, but step %d never reached its provider", km.k, res, i)
		}
		want = append(want, e.result)
	}
	if w := strings.Join(want, "|"); string(res) != w {
		r.rt.Fatalf("%v: the receipt's result is %q, the steps' results are %q", km.k, res, w)
	}
	if km.done && !bytes.Equal(res, km.result) {
		r.rt.Fatalf("%v: the receipt's result is %q, recorded before as %q", km.k, res, km.result)
	}
	km.done, km.result = true, bytes.Clone(res)
}

// finish retries km's action without faults until its receipt is recorded, and checks the
// end state: one effect per step at the provider, the steps recorded with their results,
// and the receipt replayed without running anything.
func (r *stepsRun) finish(km *stepsKey) {
	rt := r.rt
	for try := 0; !km.done; try++ {
		if try == 10 {
			rt.Fatalf("%v: no receipt after %d retries without faults", km.k, try)
		}
		if err := r.attempt(km, stepsFault{}); try == 9 {
			ins, ierr := r.w.db().Inspect(context.Background(), km.k)
			rt.Logf("%v: the last retry: %v; the record: %+v %v; now %v", km.k, err, ins, ierr, r.w.now().Now())
		}
	}
	r.attempt(km, stepsFault{}) // a replay: no fn runs (stepFn fails if one does)
	for i := range 3 {
		if n := r.effects[km.k][i]; n != 1 {
			rt.Fatalf("%v: step %d has %d effects at its provider, want 1", km.k, i, n)
		}
	}
	r.observe(km)
	for i := range 3 {
		if !km.recorded[i] {
			rt.Fatalf("%v: step %d not recorded after the receipt", km.k, i)
		}
	}
}
