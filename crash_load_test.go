package receipts_test

// The workload and the checker shared by the crash harnesses (power loss in
// crash_test.go, process kills in kill_test.go, I/O faults in fault_test.go).
//
// Workers run Claim/Commit/Fail/Release/Renew/Do/DoBatch/Lookup on a sliding
// window of keys. Effects go to an external "provider" that survives every
// crash of the store. Every acknowledged call is recorded as an event; after
// a crash the checker compares the reopened store with the events and the
// provider:
//
//   - every acknowledged commit (and every committed outcome a caller saw)
//     is present with its result: lost acknowledged receipts = 0;
//   - no key has two committed outcomes, and a committed result is one some
//     holder of that very token tried to commit, never one the store
//     rejected (ErrLeaseLost);
//   - every acknowledged claim survives (its token, or a newer one), so no
//     fencing token goes backwards, and fresh tokens exceed every token seen;
//   - the provider saw at most one effect per key (duplicate effects = 0),
//     the key of every effect is still claimed, and the receipt names the
//     effect;
//   - DoBatch effects are in the store exactly when their receipt is;
//   - every record decodes (Scan yields no error, Stats.Corrupt == 0).
//
// Leases only run out when the fake clock jumps; a jump waits for every
// holder that is between its lease check (Renew) and its effect, so a holder
// whose lease ran out is a zombie that must be fenced off, never a false
// duplicate. A holder that was taken over reconciles with the provider by
// ProviderKey, as the API tells users to.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/receiptstore/receipts"
)

// crashClock is the fake clock of the crash harnesses.
type crashClock struct{ ns atomic.Int64 }

func newCrashClock(start time.Time) *crashClock {
	c := &crashClock{}
	c.ns.Store(start.UnixNano())
	return c
}

func (c *crashClock) Now() time.Time          { return time.Unix(0, c.ns.Load()).UTC() }
func (c *crashClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// crashStart is the fake clock's start.
var crashStart = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Store options of the harnesses: nothing expires during a run.
const (
	crashRetention = 100000 * time.Hour
	crashTTL       = 10 * time.Second
)

// crashKey is the i-th key of the provider workload. Every fourth pair of
// keys collides under naive concatenation: ("ab","c8") and ("a","bc8").
func crashKey(i int64) receipts.Key {
	switch i % 4 {
	case 0:
		return receipts.Key{Scope: "ab", ID: "c" + strconv.FormatInt(i, 10)}
	case 1:
		return receipts.Key{Scope: "a", ID: "bc" + strconv.FormatInt(i-1, 10)}
	}
	return receipts.Key{Scope: "tenant-" + strconv.FormatInt(i%3, 10), ID: "op-" + strconv.FormatInt(i, 10)}
}

// crashBatchKey is the i-th key of the DoBatch workload.
func crashBatchKey(i int64) receipts.Key {
	if i%4 == 0 {
		return receipts.Key{Scope: "bb", ID: "c" + strconv.FormatInt(i, 10)}
	}
	return receipts.Key{Scope: "b", ID: "bc" + strconv.FormatInt(i-1, 10)}
}

func crashIsBatchKey(k receipts.Key) bool { return k.Scope == "b" || k.Scope == "bb" }

// crashFP is the fingerprint of k's intent: distinct for every key, even
// for keys that collide under naive concatenation.
func crashFP(k receipts.Key) []byte {
	h := sha256.Sum256(fmt.Appendf(nil, "%d:%s|%s", len(k.Scope), k.Scope, k.ID))
	return h[:]
}

// crashAppKey is where DoBatch writes a key's effect (application data,
// outside the store's reserved prefix).
func crashAppKey(k receipts.Key) []byte {
	return fmt.Appendf(nil, "fx/%d/%s/%s", len(k.Scope), k.Scope, k.ID)
}

// crashResult is what a holder commits: who it is for, which token commits
// it, which effect (token of the lease that performed it; 0 = none) it
// reports, and a nonce that makes every attempt's result unique.
type crashResult struct {
	Key   receipts.Key
	Token uint64
	Fx    uint64
	Gen   int
	Nonce uint64
}

func (r crashResult) encode() []byte {
	return fmt.Appendf(nil, "%x|%x|%d|%d|%d|%d", r.Key.Scope, r.Key.ID, r.Token, r.Fx, r.Gen, r.Nonce)
}

func parseCrashResult(b []byte) (crashResult, error) {
	f := strings.Split(string(b), "|")
	if len(f) != 6 {
		return crashResult{}, fmt.Errorf("malformed result %q", b)
	}
	var r crashResult
	s, err1 := hex.DecodeString(f[0])
	id, err2 := hex.DecodeString(f[1])
	tok, err3 := strconv.ParseUint(f[2], 10, 64)
	fx, err4 := strconv.ParseUint(f[3], 10, 64)
	gen, err5 := strconv.Atoi(f[4])
	nonce, err6 := strconv.ParseUint(f[5], 10, 64)
	if err := errors.Join(err1, err2, err3, err4, err5, err6); err != nil {
		return crashResult{}, fmt.Errorf("malformed result %q: %w", b, err)
	}
	r.Key, r.Token, r.Fx, r.Gen, r.Nonce = receipts.Key{Scope: string(s), ID: string(id)}, tok, fx, gen, nonce
	return r, nil
}

// Event kinds.
const (
	evGrant      = 'G' // a lease was handed out (its claim is durable)
	evGrantBatch = 'g' // a DoBatch lease (its claim is not synced)
	evAttempt    = 'A' // a holder is about to commit or fail with Result
	evCommitted  = 'C' // a Commit/Fail/Do/DoBatch returned this receipt
	evObserved   = 'O' // a replay or Lookup showed this finished receipt
	evReleased   = 'R' // Release of Token returned nil
	evReleasing  = 'r' // Token is about to be released (Release, or Do after NotPerformed)
	evRejected   = 'L' // the commit of Result by Token got ErrLeaseLost
)

// crashEvent is one acknowledged (or, for evAttempt, attempted) call.
type crashEvent struct {
	Kind   byte
	Gen    int
	Key    receipts.Key
	Token  uint64
	State  receipts.State
	Result []byte
}

func (e crashEvent) line() []byte {
	return fmt.Appendf(nil, "%c %d %x %x %d %d %x\n", e.Kind, e.Gen, e.Key.Scope, e.Key.ID, e.Token, e.State, e.Result)
}

func parseCrashEvent(line string) (crashEvent, error) {
	f := strings.Split(line, " ")
	if len(f) != 7 || len(f[0]) != 1 {
		return crashEvent{}, fmt.Errorf("malformed event %q", line)
	}
	gen, err1 := strconv.Atoi(f[1])
	s, err2 := hex.DecodeString(f[2])
	id, err3 := hex.DecodeString(f[3])
	tok, err4 := strconv.ParseUint(f[4], 10, 64)
	st, err5 := strconv.ParseUint(f[5], 10, 8)
	res, err6 := hex.DecodeString(f[6])
	if err := errors.Join(err1, err2, err3, err4, err5, err6); err != nil {
		return crashEvent{}, fmt.Errorf("malformed event %q: %w", line, err)
	}
	return crashEvent{Kind: f[0][0], Gen: gen, Key: receipts.Key{Scope: string(s), ID: string(id)}, Token: tok, State: receipts.State(st), Result: res}, nil
}

// crashRecorder keeps the event history, in memory and optionally in an
// append-only file (one write per event, so a killed process never leaves a
// torn line behind a complete one).
type crashRecorder struct {
	mu  sync.Mutex
	evs []crashEvent
	f   *os.File
	err error
}

func (r *crashRecorder) add(e crashEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.evs = append(r.evs, e)
	if r.f != nil && r.err == nil {
		_, r.err = r.f.Write(e.line())
	}
}

// mark returns the number of events so far.
func (r *crashRecorder) mark() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.evs)
}

// cut keeps what the world saw before a crash: every event before mark,
// and after it only attempts and rejections (harmless: they only widen or
// narrow what a commit may have written, and are true either way).
func (r *crashRecorder) cut(mark int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	kept := r.evs[:mark:mark]
	for _, e := range r.evs[mark:] {
		if e.Kind == evAttempt || e.Kind == evRejected || e.Kind == evReleasing {
			kept = append(kept, e)
		}
	}
	r.evs = kept
}

func (r *crashRecorder) events() []crashEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]crashEvent(nil), r.evs...)
}

// crashEffect is one effect the provider performed.
type crashEffect struct {
	PK    string // the lease's ProviderKey
	Key   receipts.Key
	Token uint64 // the lease that performed it
	Gen   int
}

func (e crashEffect) line() []byte {
	return fmt.Appendf(nil, "%s %x %x %d %d\n", e.PK, e.Key.Scope, e.Key.ID, e.Token, e.Gen)
}

func parseCrashEffect(line string) (crashEffect, error) {
	f := strings.Split(line, " ")
	if len(f) != 5 {
		return crashEffect{}, fmt.Errorf("malformed effect %q", line)
	}
	s, err1 := hex.DecodeString(f[1])
	id, err2 := hex.DecodeString(f[2])
	tok, err3 := strconv.ParseUint(f[3], 10, 64)
	gen, err4 := strconv.Atoi(f[4])
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return crashEffect{}, fmt.Errorf("malformed effect %q: %w", line, err)
	}
	return crashEffect{PK: f[0], Key: receipts.Key{Scope: string(s), ID: string(id)}, Token: tok, Gen: gen}, nil
}

// crashProvider is the external system the effects go to. It survives every
// crash of the store. If f is set, every effect is appended and fsynced
// there before perform returns (the process-kill harness).
type crashProvider struct {
	mu     sync.Mutex
	byPK   map[string]crashEffect
	all    []crashEffect
	f      *os.File
	frozen bool // the world ended (power loss): nothing more happens
}

func newCrashProvider() *crashProvider { return &crashProvider{byPK: make(map[string]crashEffect)} }

var errCrashWorldEnded = errors.New("crash harness: the world ended")

func (p *crashProvider) find(pk string) (crashEffect, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok := p.byPK[pk]
	return e, ok
}

func (p *crashProvider) perform(e crashEffect) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.frozen {
		return errCrashWorldEnded
	}
	if p.f != nil {
		if _, err := p.f.Write(e.line()); err != nil {
			return err
		}
		if err := p.f.Sync(); err != nil {
			return err
		}
	}
	p.load(e)
	return nil
}

func (p *crashProvider) load(e crashEffect) {
	if _, ok := p.byPK[e.PK]; !ok {
		p.byPK[e.PK] = e
	}
	p.all = append(p.all, e)
}

func (p *crashProvider) freeze() {
	p.mu.Lock()
	p.frozen = true
	p.mu.Unlock()
}

func (p *crashProvider) thaw() {
	p.mu.Lock()
	p.frozen = false
	p.mu.Unlock()
}

func (p *crashProvider) effects() []crashEffect {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]crashEffect(nil), p.all...)
}

// crashBad collects violations. onAdd, if set, sees each one as it happens
// (the kill harness's child writes them to a file).
type crashBad struct {
	mu    sync.Mutex
	n     int
	msgs  []string
	onAdd func(string)
}

func (b *crashBad) addf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.n++
	if len(b.msgs) < 30 {
		b.msgs = append(b.msgs, msg)
	}
	if b.onAdd != nil {
		b.onAdd(msg)
	}
}

func (b *crashBad) count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.n
}

func (b *crashBad) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return fmt.Sprintf("%d violations:\n  %s", b.n, strings.Join(b.msgs, "\n  "))
}

// crashLoadStats counts what a workload did.
type crashLoadStats struct {
	ops, grants, takeovers, effects, reconciled, commits, fails, releases,
	replays, zombiesFenced, doCalls, batchCommits, jumps atomic.Int64
}

func (s *crashLoadStats) String() string {
	return fmt.Sprintf("ops=%d grants=%d takeovers=%d effects=%d reconciled=%d commits=%d fails=%d releases=%d replays=%d zombies-fenced=%d batch-commits=%d clock-jumps=%d",
		s.ops.Load(), s.grants.Load(), s.takeovers.Load(), s.effects.Load(), s.reconciled.Load(), s.commits.Load(), s.fails.Load(),
		s.releases.Load(), s.replays.Load(), s.zombiesFenced.Load(), s.batchCommits.Load(), s.jumps.Load())
}

func (s *crashLoadStats) add(o *crashLoadStats) {
	s.ops.Add(o.ops.Load())
	s.grants.Add(o.grants.Load())
	s.takeovers.Add(o.takeovers.Load())
	s.effects.Add(o.effects.Load())
	s.reconciled.Add(o.reconciled.Load())
	s.commits.Add(o.commits.Load())
	s.fails.Add(o.fails.Load())
	s.releases.Add(o.releases.Load())
	s.replays.Add(o.replays.Load())
	s.zombiesFenced.Add(o.zombiesFenced.Load())
	s.batchCommits.Add(o.batchCommits.Load())
	s.jumps.Add(o.jumps.Load())
}

// crashLoad is one generation's workload against one open DB.
type crashLoad struct {
	db       *receipts.DB
	clock    *crashClock
	gen      int
	prov     *crashProvider
	rec      *crashRecorder
	bad      *crashBad
	st       *crashLoadStats
	window   int64 // keys are drawn from [base+ops/8, base+ops/8+window)
	base     int64
	maxJumps int64
	doWait   time.Duration // how long Do waits for another holder

	// expected, if set, says which errors the harness injected on purpose:
	// such an error stops the workload (fail-stop) instead of counting as a
	// violation.
	expected func(error) bool

	gate  sync.RWMutex // a clock jump excludes every lease-check-then-effect section
	nonce atomic.Uint64
	stop  atomic.Bool
	// onOps, if set, is called by the worker whose op brings the count to
	// onOpsAt.
	onOpsAt int64
	onOps   func()
}

type crashHeld struct {
	l  *receipts.Lease
	fx uint64 // the effect this lease reports (0: none yet)
}

func (w *crashLoad) keyIndex(rng *rand.Rand) int64 {
	return w.base + w.st.ops.Load()/8 + rng.Int64N(w.window)
}

var (
	errCrashUnknown      = errors.New("crash harness: outcome unknown")
	errCrashNotPerformed = errors.New("crash harness: not performed")
	errCrashDeclined     = errors.New("crash harness: declined by provider")
)

// worker runs ops until stopped or limit ops (0: no limit) are done.
func (w *crashLoad) worker(id int, rng *rand.Rand, limit int) {
	var held []crashHeld
	ctx := context.Background()
	for i := 0; !w.stop.Load() && (limit == 0 || i < limit); i++ {
		w.clock.Advance(time.Millisecond)
		if n := w.st.ops.Add(1); w.onOps != nil && n == w.onOpsAt {
			w.onOps()
		}
		x := rng.IntN(100)
		switch {
		case x < 25:
			if h, ok := w.claimOp(ctx, rng); ok {
				if rng.IntN(100) < 60 || len(held) >= 2 {
					w.finish(ctx, rng, h)
				} else {
					held = append(held, h)
				}
			}
		case x < 37 && len(held) > 0:
			j := rng.IntN(len(held))
			h := held[j]
			held = append(held[:j], held[j+1:]...)
			w.finish(ctx, rng, h)
		case x < 42 && len(held) > 0:
			j := rng.IntN(len(held))
			if err := held[j].l.Renew(ctx); err != nil {
				if !errors.Is(err, receipts.ErrLeaseLost) {
					w.fail(err, "gen %d: renew %s: %v", w.gen, held[j].l.Key(), err)
				}
				w.st.zombiesFenced.Add(1)
				held = append(held[:j], held[j+1:]...)
			}
		case x < 62:
			w.doOp(ctx, rng)
		case x < 74:
			w.doBatchOp(ctx, rng)
		case x < 97:
			w.lookupOp(ctx, rng)
		default:
			if w.st.jumps.Load() < w.maxJumps {
				w.gate.Lock()
				w.clock.Advance(crashTTL + time.Second)
				w.gate.Unlock()
				w.st.jumps.Add(1)
			}
		}
	}
	// Held leases are dropped: their holders "died" with this generation.
}

// fail reports an unexpected error from the store, unless the harness
// injected it: then the workload stops, as a fail-stop process would.
func (w *crashLoad) fail(err error, format string, args ...any) {
	if err != nil && w.expected != nil && w.expected(err) {
		w.stop.Store(true)
		return
	}
	w.bad.addf(format, args...)
}

func (w *crashLoad) granted(l *receipts.Lease, durable bool) {
	e := crashEvent{Kind: evGrant, Gen: w.gen, Key: l.Key(), Token: l.Token()}
	if !durable {
		e.Kind = evGrantBatch
	}
	if l.Recovered() {
		e.State = receipts.Pending // marks a takeover
	}
	w.rec.add(e)
	w.st.grants.Add(1)
	if l.Recovered() {
		w.st.takeovers.Add(1)
	}
}

// reconcile asks the provider, by ProviderKey, whether a previous attempt's
// effect happened; it returns that effect's token or 0.
func (w *crashLoad) reconcile(l *receipts.Lease) uint64 {
	if fx, ok := w.prov.find(l.ProviderKey()); ok {
		w.st.reconciled.Add(1)
		return fx.Token
	}
	return 0
}

// effect checks that l still holds its key (Renew, fenced) and performs the
// effect at the provider. No clock jump happens in between, so a lease that
// passed the check is live while the effect runs. It returns the effect's
// token, or 0 if the lease was lost (nothing happened).
func (w *crashLoad) effect(l *receipts.Lease) (uint64, error) {
	w.gate.RLock()
	defer w.gate.RUnlock()
	if err := l.Renew(context.Background()); err != nil {
		if errors.Is(err, receipts.ErrLeaseLost) {
			w.st.zombiesFenced.Add(1)
			return 0, nil
		}
		return 0, err
	}
	if err := w.prov.perform(crashEffect{PK: l.ProviderKey(), Key: l.Key(), Token: l.Token(), Gen: w.gen}); err != nil {
		return 0, err
	}
	w.st.effects.Add(1)
	return l.Token(), nil
}

func (w *crashLoad) result(l *receipts.Lease, fx uint64) []byte {
	return crashResult{Key: l.Key(), Token: l.Token(), Fx: fx, Gen: w.gen, Nonce: w.nonce.Add(1)}.encode()
}

// claimOp claims a key; with a lease, it reconciles if recovered and maybe
// performs the effect.
func (w *crashLoad) claimOp(ctx context.Context, rng *rand.Rand) (crashHeld, bool) {
	k := crashKey(w.keyIndex(rng))
	l, r, err := w.db.Claim(ctx, k, crashFP(k))
	switch {
	case err == nil && l != nil:
		w.granted(l, true)
		h := crashHeld{l: l}
		if l.Recovered() {
			h.fx = w.reconcile(l)
		}
		if h.fx == 0 && rng.IntN(100) < 70 {
			fx, err := w.effect(l)
			if err != nil {
				if !errors.Is(err, errCrashWorldEnded) {
					w.fail(err, "gen %d: effect of %s: %v", w.gen, k, err)
				}
				return h, false
			}
			if fx == 0 {
				return h, false // lease lost before the effect: a zombie, dropped
			}
			h.fx = fx
		}
		return h, true
	case err == nil && r != nil:
		w.observe(k, r, "claim replay")
	case errors.Is(err, receipts.ErrInProgress):
	default:
		w.fail(err, "gen %d: claim %s: %v", w.gen, k, err)
	}
	return crashHeld{}, false
}

// finish ends a held lease: commit, fail, release, or drop (the holder dies).
func (w *crashLoad) finish(ctx context.Context, rng *rand.Rand, h crashHeld) {
	x := rng.IntN(100)
	if h.fx == 0 {
		switch {
		case x < 70:
			w.rec.add(crashEvent{Kind: evReleasing, Gen: w.gen, Key: h.l.Key(), Token: h.l.Token()})
			err := h.l.Release(ctx)
			switch {
			case err == nil:
				w.rec.add(crashEvent{Kind: evReleased, Gen: w.gen, Key: h.l.Key(), Token: h.l.Token()})
				w.st.releases.Add(1)
			case errors.Is(err, receipts.ErrLeaseLost):
				w.st.zombiesFenced.Add(1)
			default:
				w.fail(err, "gen %d: release %s: %v", w.gen, h.l.Key(), err)
			}
		case x < 90:
			w.commit(ctx, h, receipts.Succeeded)
		}
		return
	}
	switch {
	case x < 85:
		w.commit(ctx, h, receipts.Succeeded)
	case x < 95:
		w.commit(ctx, h, receipts.Failed)
	}
}

func (w *crashLoad) commit(ctx context.Context, h crashHeld, st receipts.State) {
	k := h.l.Key()
	res := w.result(h.l, h.fx)
	w.rec.add(crashEvent{Kind: evAttempt, Gen: w.gen, Key: k, Token: h.l.Token(), State: st, Result: res})
	var r *receipts.Receipt
	var err error
	if st == receipts.Succeeded {
		r, err = h.l.Commit(ctx, res)
	} else {
		r, err = h.l.Fail(ctx, res)
	}
	switch {
	case err == nil:
		w.committed(h.l, r, st, res)
	case errors.Is(err, receipts.ErrLeaseLost):
		w.rec.add(crashEvent{Kind: evRejected, Gen: w.gen, Key: k, Token: h.l.Token(), State: st, Result: res})
		w.st.zombiesFenced.Add(1)
	default:
		w.fail(err, "gen %d: commit %s: %v", w.gen, k, err)
	}
}

// committed checks and records the receipt of l's own commit.
func (w *crashLoad) committed(l *receipts.Lease, r *receipts.Receipt, st receipts.State, res []byte) {
	k := l.Key()
	if r == nil || r.Key != k || r.Token != l.Token() || r.State != st || !bytes.Equal(r.Result, res) {
		w.bad.addf("gen %d: commit of %s by token %d (%s %q) returned %s", w.gen, k, l.Token(), st, res, crashFmtReceipt(r))
		return
	}
	w.rec.add(crashEvent{Kind: evCommitted, Gen: w.gen, Key: k, Token: r.Token, State: r.State, Result: r.Result})
	if st == receipts.Succeeded {
		w.st.commits.Add(1)
	} else {
		w.st.fails.Add(1)
	}
}

// observe checks and records a finished receipt someone was shown.
func (w *crashLoad) observe(k receipts.Key, r *receipts.Receipt, src string) {
	w.st.replays.Add(1)
	if r.State != receipts.Succeeded && r.State != receipts.Failed {
		w.bad.addf("gen %d: %s of %s returned a %s receipt", w.gen, src, k, r.State)
		return
	}
	if err := crashCheckReceipt(k, r); err != nil {
		w.bad.addf("gen %d: %s: %v", w.gen, src, err)
		return
	}
	w.rec.add(crashEvent{Kind: evObserved, Gen: w.gen, Key: k, Token: r.Token, State: r.State, Result: r.Result})
}

// crashCheckReceipt checks that a finished receipt of k is k's and was
// committed by the token it carries.
func crashCheckReceipt(k receipts.Key, r *receipts.Receipt) error {
	if r.Key != k {
		return fmt.Errorf("receipt of %s carries key %s", k, r.Key)
	}
	res, err := parseCrashResult(r.Result)
	if err != nil {
		return fmt.Errorf("receipt of %s: %v", k, err)
	}
	if res.Key != k {
		return fmt.Errorf("receipt of %s holds the result of %s", k, res.Key)
	}
	if res.Token != r.Token {
		return fmt.Errorf("receipt of %s has token %d but was committed by token %d", k, r.Token, res.Token)
	}
	return nil
}

func crashFmtReceipt(r *receipts.Receipt) string {
	if r == nil {
		return "<nil>"
	}
	return fmt.Sprintf("{%s %s token=%d attempts=%d result=%q}", r.Key, r.State, r.Token, r.Attempts, r.Result)
}

func (w *crashLoad) doOp(ctx context.Context, rng *rand.Rand) {
	k := crashKey(w.keyIndex(rng))
	ctx, cancel := context.WithTimeout(ctx, w.doWait)
	defer cancel()
	var (
		lease   *receipts.Lease
		want    []byte
		wantSt  receipts.State
		outcome error
	)
	r, err := w.db.Do(ctx, k, crashFP(k), func(_ context.Context, l *receipts.Lease) ([]byte, error) {
		lease = l
		w.granted(l, true)
		var fx uint64
		if l.Recovered() {
			fx = w.reconcile(l)
		}
		x := rng.IntN(100)
		if fx == 0 && x < 8 {
			w.rec.add(crashEvent{Kind: evReleasing, Gen: w.gen, Key: k, Token: l.Token()})
			outcome = errCrashNotPerformed
			return nil, receipts.NotPerformed(outcome)
		}
		if fx == 0 {
			var err error
			if fx, err = w.effect(l); err != nil || fx == 0 {
				if err != nil && !errors.Is(err, errCrashWorldEnded) {
					w.fail(err, "gen %d: effect of %s: %v", w.gen, k, err)
				}
				w.rec.add(crashEvent{Kind: evReleasing, Gen: w.gen, Key: k, Token: l.Token()})
				outcome = errCrashNotPerformed
				return nil, receipts.NotPerformed(outcome)
			}
		}
		res := w.result(l, fx)
		switch {
		case x < 16:
			want, wantSt = res, receipts.Failed
		case x < 26:
			outcome = errCrashUnknown
			return nil, outcome // the claim is abandoned; the next attempt reconciles
		default:
			want, wantSt = res, receipts.Succeeded
		}
		w.rec.add(crashEvent{Kind: evAttempt, Gen: w.gen, Key: k, Token: l.Token(), State: wantSt, Result: want})
		if wantSt == receipts.Failed {
			outcome = errCrashDeclined
			return res, receipts.Permanent(outcome)
		}
		return res, nil
	})
	w.st.doCalls.Add(1)
	w.doDone(k, lease, want, wantSt, outcome, r, err)
}

// doDone checks what Do or DoBatch returned.
func (w *crashLoad) doDone(k receipts.Key, lease *receipts.Lease, want []byte, wantSt receipts.State, outcome error, r *receipts.Receipt, err error) {
	switch {
	case lease == nil && r != nil && (err == nil || errors.Is(err, receipts.ErrFailed)):
		if (r.State == receipts.Failed) != (err != nil) {
			w.bad.addf("gen %d: Do replay of %s: %s receipt with error %v", w.gen, k, r.State, err)
		}
		w.observe(k, r, "Do replay")
	case lease == nil && (errors.Is(err, receipts.ErrInProgress) || errors.Is(err, context.DeadlineExceeded)):
	case lease == nil:
		w.fail(err, "gen %d: Do %s: %s, %v", w.gen, k, crashFmtReceipt(r), err)
	case want != nil && r != nil && (err == nil) == (wantSt == receipts.Succeeded):
		w.committed(lease, r, wantSt, want)
	case want != nil && r == nil && errors.Is(err, receipts.ErrLeaseLost):
		w.rec.add(crashEvent{Kind: evRejected, Gen: w.gen, Key: k, Token: lease.Token(), State: wantSt, Result: want})
		w.st.zombiesFenced.Add(1)
	case want == nil && r == nil && outcome != nil && errors.Is(err, outcome):
		if errors.Is(err, receipts.ErrLeaseLost) {
			w.st.zombiesFenced.Add(1)
		}
	case want == nil && r == nil && errors.Is(err, receipts.ErrLeaseLost):
		w.st.zombiesFenced.Add(1)
	default:
		w.fail(err, "gen %d: Do %s (token %d, wanted %s %q, fn said %v): %s, %v", w.gen, k, lease.Token(), wantSt, want, outcome, crashFmtReceipt(r), err)
	}
}

func (w *crashLoad) doBatchOp(ctx context.Context, rng *rand.Rand) {
	k := crashBatchKey(w.keyIndex(rng))
	ctx, cancel := context.WithTimeout(ctx, w.doWait)
	defer cancel()
	var (
		lease   *receipts.Lease
		want    []byte
		outcome error
	)
	r, err := w.db.DoBatch(ctx, k, crashFP(k), func(_ context.Context, l *receipts.Lease, b *pebble.Batch) ([]byte, error) {
		lease = l
		w.granted(l, false)
		if l.Recovered() {
			// The effect commits with the receipt: a claim left pending
			// can never have an effect behind it. Checked while the lease
			// is surely held (Renew, no clock jump until done): a DoBatch
			// whose lease ran out and was taken over while fn ran (a
			// zombie, fenced at commit) may well see its successor's.
			w.gate.RLock()
			if err := l.Renew(context.Background()); err == nil {
				if v, closer, err := w.db.Pebble().Get(crashAppKey(k)); err == nil {
					w.bad.addf("gen %d: DoBatch %s recovered (token %d) with its effect %x already stored", w.gen, k, l.Token(), v)
					_ = closer.Close()
				}
			}
			w.gate.RUnlock()
		}
		if rng.IntN(100) < 10 {
			outcome = errCrashUnknown
			return nil, outcome
		}
		if err := b.Set(crashAppKey(k), binary.BigEndian.AppendUint64(nil, l.Token()), nil); err != nil {
			return nil, err
		}
		want = w.result(l, l.Token())
		w.rec.add(crashEvent{Kind: evAttempt, Gen: w.gen, Key: k, Token: l.Token(), State: receipts.Succeeded, Result: want})
		return want, nil
	})
	if lease != nil && want != nil && err == nil {
		w.st.batchCommits.Add(1)
	}
	w.doDone(k, lease, want, receipts.Succeeded, outcome, r, err)
}

func (w *crashLoad) lookupOp(ctx context.Context, rng *rand.Rand) {
	i := w.keyIndex(rng)
	k := crashKey(i)
	if rng.IntN(4) == 0 {
		k = crashBatchKey(i)
	}
	r, err := w.db.Lookup(ctx, k)
	switch {
	case errors.Is(err, receipts.ErrNotFound):
	case err != nil:
		w.fail(err, "gen %d: lookup %s: %v", w.gen, k, err)
	case r.State == receipts.Pending:
		if r.Key != k {
			w.bad.addf("gen %d: lookup %s returned %s", w.gen, k, crashFmtReceipt(r))
		}
	default:
		w.observe(k, r, "lookup")
	}
}

// crashProbeSeq makes every probe key of crashCheck new.
var crashProbeSeq atomic.Int64

// crashCheckStats is what one check looked at.
type crashCheckStats struct {
	records, committed, pending, effects, duplicates, lostAcks, lostClaims int
}

// crashCheck compares the store with the history of acknowledged events and
// the provider's effects. gen names the check in messages.
//
// It scans the whole store; Stats (a second scan) runs only if withStats.
func crashCheck(ctx context.Context, db *receipts.DB, evs []crashEvent, effects []crashEffect, bad *crashBad, gen int, withStats bool) crashCheckStats {
	var cs crashCheckStats
	recs := make(map[receipts.Key]*receipts.Receipt)
	var maxTok uint64
	for r, err := range db.Scan(ctx, receipts.Filter{}) {
		if err != nil {
			bad.addf("check %d: scan: %v", gen, err)
			continue
		}
		if _, dup := recs[r.Key]; dup {
			bad.addf("check %d: scan returned %s twice", gen, r.Key)
		}
		recs[r.Key] = r
		maxTok = max(maxTok, r.Token)
	}
	if withStats {
		if st, err := db.Count(context.Background()); err != nil {
			bad.addf("check %d: Count: %v", gen, err)
		} else if st.Corrupt != 0 {
			bad.addf("check %d: %d corrupt records", gen, st.Corrupt)
		}
	}
	cs.records = len(recs)

	type outcome struct {
		st  receipts.State
		tok uint64
		res string
	}
	type keyInfo struct {
		out       *outcome
		maxGrant  uint64
		released  map[uint64]bool // acknowledged releases
		releasing map[uint64]bool // attempted releases
	}
	info := make(map[receipts.Key]*keyInfo)
	get := func(k receipts.Key) *keyInfo {
		ki := info[k]
		if ki == nil {
			ki = &keyInfo{released: make(map[uint64]bool), releasing: make(map[uint64]bool)}
			info[k] = ki
		}
		return ki
	}
	type attempt struct {
		k   receipts.Key
		tok uint64
		st  receipts.State
		res string
	}
	attempts := make(map[attempt]bool)
	rejected := make(map[attempt]bool)
	aKey := func(k receipts.Key, tok uint64, st receipts.State, res []byte) attempt {
		return attempt{k, tok, st, string(res)}
	}
	for _, e := range evs {
		maxTok = max(maxTok, e.Token)
		switch e.Kind {
		case evGrant:
			ki := get(e.Key)
			ki.maxGrant = max(ki.maxGrant, e.Token)
		case evReleased:
			get(e.Key).released[e.Token] = true
		case evReleasing:
			get(e.Key).releasing[e.Token] = true
		case evAttempt:
			attempts[aKey(e.Key, e.Token, e.State, e.Result)] = true
		case evRejected:
			rejected[aKey(e.Key, e.Token, e.State, e.Result)] = true
		case evCommitted, evObserved:
			ki := get(e.Key)
			o := outcome{e.State, e.Token, string(e.Result)}
			switch {
			case ki.out == nil:
				ki.out = &o
			case *ki.out != o:
				bad.addf("check %d: %s has two committed outcomes: %s token %d %q and %s token %d %q",
					gen, e.Key, ki.out.st, ki.out.tok, ki.out.res, o.st, o.tok, o.res)
			}
			ki.maxGrant = max(ki.maxGrant, e.Token)
		}
	}

	// Every record: finished ones are results some holder of that token
	// tried to commit, never rejected ones.
	for k, r := range recs {
		switch r.State {
		case receipts.Pending:
			cs.pending++
		case receipts.Succeeded, receipts.Failed:
			cs.committed++
			if err := crashCheckReceipt(k, r); err != nil {
				bad.addf("check %d: %v", gen, err)
				continue
			}
			ak := aKey(k, r.Token, r.State, r.Result)
			if !attempts[ak] {
				bad.addf("check %d: %s is %s with %q, which no holder of token %d tried to record", gen, k, r.State, r.Result, r.Token)
			}
			if rejected[ak] {
				bad.addf("check %d: %s holds %q, whose commit was rejected (ErrLeaseLost)", gen, k, r.Result)
			}
		default:
			bad.addf("check %d: %s in state %d", gen, k, r.State)
		}
		if crashIsBatchKey(k) {
			v, closer, err := db.Pebble().Get(crashAppKey(k))
			switch {
			case err == nil:
				tok := binary.BigEndian.Uint64(append(make([]byte, 8-min(len(v), 8)), v...))
				_ = closer.Close()
				if r.State != receipts.Succeeded || tok != r.Token {
					bad.addf("check %d: DoBatch effect of %s (token %d) stored, receipt is %s", gen, k, tok, crashFmtReceipt(r))
				}
			case errors.Is(err, pebble.ErrNotFound):
				if r.State == receipts.Succeeded {
					bad.addf("check %d: DoBatch receipt of %s committed without its effect", gen, k)
				}
			default:
				bad.addf("check %d: read effect of %s: %v", gen, k, err)
			}
		}
	}

	// Every acknowledged outcome and claim survived.
	for k, ki := range info {
		r := recs[k]
		if ki.out != nil {
			if r == nil || r.State != ki.out.st || r.Token != ki.out.tok || string(r.Result) != ki.out.res {
				cs.lostAcks++
				bad.addf("check %d: acknowledged receipt of %s (%s token %d %q) lost: store has %s", gen, k, ki.out.st, ki.out.tok, ki.out.res, crashFmtReceipt(r))
			}
			continue
		}
		if ki.maxGrant == 0 {
			continue
		}
		if ki.released[ki.maxGrant] {
			// A released Recovered lease (Attempts > 1) keeps its claim,
			// abandoned; a first attempt's release deletes it.
			kept := r != nil && r.Token == ki.maxGrant && r.State == receipts.Pending && r.Attempts > 1
			if r != nil && r.Token <= ki.maxGrant && !kept {
				bad.addf("check %d: %s was released at token %d, store has %s", gen, k, ki.maxGrant, crashFmtReceipt(r))
			}
			continue
		}
		if r == nil && ki.releasing[ki.maxGrant] {
			continue // a release in flight at the crash may have landed
		}
		if r == nil || r.Token < ki.maxGrant {
			cs.lostClaims++
			bad.addf("check %d: acknowledged claim of %s (token %d) lost: store has %s", gen, k, ki.maxGrant, crashFmtReceipt(r))
		}
	}
	// DoBatch effects without a record.
	it, err := db.Pebble().NewIter(&pebble.IterOptions{LowerBound: []byte("fx/"), UpperBound: []byte("fx0")})
	if err != nil {
		bad.addf("check %d: %v", gen, err)
	} else {
		for it.First(); it.Valid(); it.Next() {
			var n int
			var rest string
			if _, err := fmt.Sscanf(string(it.Key()), "fx/%d/", &n); err == nil {
				rest = strings.TrimPrefix(string(it.Key()), "fx/"+strconv.Itoa(n)+"/")
			}
			if n <= 0 || n >= len(rest) {
				bad.addf("check %d: malformed effect key %q", gen, it.Key())
				continue
			}
			k := receipts.Key{Scope: rest[:n], ID: rest[n+1:]}
			if recs[k] == nil {
				bad.addf("check %d: DoBatch effect of %s stored without a receipt", gen, k)
			}
		}
		if err := errors.Join(it.Error(), it.Close()); err != nil {
			bad.addf("check %d: effects scan: %v", gen, err)
		}
	}

	// Effects: one per key, under a claim the store still knows, and named by
	// its receipt.
	byKey := make(map[receipts.Key][]crashEffect)
	for _, e := range effects {
		byKey[e.Key] = append(byKey[e.Key], e)
	}
	cs.effects = len(effects)
	for k, fx := range byKey {
		if len(fx) > 1 {
			cs.duplicates += len(fx) - 1
			toks := make([]string, len(fx))
			for i, e := range fx {
				toks[i] = fmt.Sprintf("token %d (gen %d)", e.Token, e.Gen)
			}
			bad.addf("check %d: duplicate effect of %s: %s", gen, k, strings.Join(toks, ", "))
		}
		r := recs[k]
		switch {
		case r == nil:
			bad.addf("check %d: %s had its effect (token %d) but the store forgot the claim", gen, k, fx[0].Token)
		case r.State != receipts.Pending:
			if res, err := parseCrashResult(r.Result); err == nil && res.Fx != fx[0].Token {
				bad.addf("check %d: receipt of %s reports effect %d, the provider performed %d", gen, k, res.Fx, fx[0].Token)
			}
		}
	}
	for k, r := range recs {
		if crashIsBatchKey(k) || r.State == receipts.Pending {
			continue
		}
		if res, err := parseCrashResult(r.Result); err == nil && res.Fx != 0 && len(byKey[k]) == 0 {
			bad.addf("check %d: receipt of %s reports effect %d the provider never saw", gen, k, res.Fx)
		}
	}

	// Fresh tokens exceed every token seen.
	probe := receipts.Key{Scope: "probe", ID: fmt.Sprintf("gen-%d-%d", gen, crashProbeSeq.Add(1))}
	l, _, err := db.Claim(ctx, probe, []byte("probe"))
	if err != nil {
		bad.addf("check %d: probe claim: %v", gen, err)
	} else {
		if l.Token() <= maxTok {
			bad.addf("check %d: fresh token %d does not exceed token %d already used", gen, l.Token(), maxTok)
		}
		if err := l.Release(ctx); err != nil {
			bad.addf("check %d: probe release: %v", gen, err)
		}
	}
	return cs
}

// crashReadLines reads the complete lines of a file, truncating a torn last
// line (a write cut short) so that later appends start on a fresh line.
func crashReadLines(path string) ([]string, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(f)
	if err != nil {
		return nil, err
	}
	if i := bytes.LastIndexByte(data, '\n'); i+1 != len(data) {
		if err := f.Truncate(int64(i + 1)); err != nil {
			return nil, err
		}
		data = data[:i+1]
	}
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if sc.Text() != "" {
			lines = append(lines, sc.Text())
		}
	}
	return lines, sc.Err()
}

// crashKeyIndex is the index i of crashKey(i) or crashBatchKey(i) (for the
// odd key of a colliding pair, i-1), from the digits that end the ID.
func crashKeyIndex(k receipts.Key) int64 {
	id := strings.TrimLeft(k.ID, "abcdefghijklmnopqrstuvwxyz-")
	n, _ := strconv.ParseInt(id, 10, 64)
	return n
}
