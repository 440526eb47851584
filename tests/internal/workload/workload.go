package workload

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
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/internal/peek"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/receiptstore/receipts/receiptstest"
)

// Start is the fake clock's start.
var Start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Store options of the harnesses: nothing expires during a run. Retention
// is the receipts' retention, TTL the lease TTL.
const (
	Retention = 100000 * time.Hour
	TTL       = 10 * time.Second
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

// FP is the fingerprint of k's intent: distinct for every key, even
// for keys that collide under naive concatenation.
func FP(k receipts.Key) []byte {
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

// Event kinds (Event.Kind): EvGrant, EvGrantBatch, EvAttempt, EvCommitted,
// EvObserved, EvReleased, EvReleasing, EvRejected.
const (
	EvGrant      = 'G' // a lease was handed out (its claim is durable)
	EvGrantBatch = 'g' // a DoBatch lease (its claim is not synced)
	EvAttempt    = 'A' // a holder is about to commit or fail with Result
	EvCommitted  = 'C' // a Commit/Fail/Do/DoBatch returned this receipt
	evObserved   = 'O' // a replay or Lookup showed this finished receipt
	evReleased   = 'R' // Release of Token returned nil
	EvReleasing  = 'r' // Token is about to be released (Release, or Do after NotPerformed)
	EvRejected   = 'L' // the commit of Result by Token got ErrLeaseLost
)

// Event is one acknowledged (or, for evAttempt, attempted) call.
type Event struct {
	Kind   byte
	Gen    int
	Key    receipts.Key
	Token  uint64
	State  receipts.State
	Result []byte
}

func (e Event) line() []byte {
	return fmt.Appendf(nil, "%c %d %x %x %d %d %x\n", e.Kind, e.Gen, e.Key.Scope, e.Key.ID, e.Token, e.State, e.Result)
}

// ParseEvent parses a line written by Event.line.
func ParseEvent(line string) (Event, error) {
	f := strings.Split(line, " ")
	if len(f) != 7 || len(f[0]) != 1 {
		return Event{}, fmt.Errorf("malformed event %q", line)
	}
	gen, err1 := strconv.Atoi(f[1])
	s, err2 := hex.DecodeString(f[2])
	id, err3 := hex.DecodeString(f[3])
	tok, err4 := strconv.ParseUint(f[4], 10, 64)
	st, err5 := strconv.ParseUint(f[5], 10, 8)
	res, err6 := hex.DecodeString(f[6])
	if err := errors.Join(err1, err2, err3, err4, err5, err6); err != nil {
		return Event{}, fmt.Errorf("malformed event %q: %w", line, err)
	}
	return Event{Kind: f[0][0], Gen: gen, Key: receipts.Key{Scope: string(s), ID: string(id)}, Token: tok, State: receipts.State(st), Result: res}, nil
}

// Recorder keeps the event history, in memory and optionally in an
// append-only file (one write per event, so a killed process never leaves a
// torn line behind a complete one).
type Recorder struct {
	mu  sync.Mutex
	Evs []Event
	F   *os.File
	Err error
}

func (r *Recorder) add(e Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Evs = append(r.Evs, e)
	if r.F != nil && r.Err == nil {
		_, r.Err = r.F.Write(e.line())
	}
}

// Mark returns the number of events so far.
func (r *Recorder) Mark() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.Evs)
}

// Cut keeps what the world saw before a crash: every event before mark,
// and after it only attempts and rejections (harmless: they only widen or
// narrow what a commit may have written, and are true either way).
func (r *Recorder) Cut(mark int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	kept := r.Evs[:mark:mark]
	for _, e := range r.Evs[mark:] {
		if e.Kind == EvAttempt || e.Kind == EvRejected || e.Kind == EvReleasing {
			kept = append(kept, e)
		}
	}
	r.Evs = kept
}

// Events returns a copy of the history.
func (r *Recorder) Events() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Event(nil), r.Evs...)
}

// Effect is one effect the provider performed.
type Effect struct {
	PK    string // the lease's ProviderKey
	Key   receipts.Key
	Token uint64 // the lease that performed it
	Gen   int
}

func (e Effect) line() []byte {
	return fmt.Appendf(nil, "%s %x %x %d %d\n", e.PK, e.Key.Scope, e.Key.ID, e.Token, e.Gen)
}

// ParseEffect parses a line written by Effect.line.
func ParseEffect(line string) (Effect, error) {
	f := strings.Split(line, " ")
	if len(f) != 5 {
		return Effect{}, fmt.Errorf("malformed effect %q", line)
	}
	s, err1 := hex.DecodeString(f[1])
	id, err2 := hex.DecodeString(f[2])
	tok, err3 := strconv.ParseUint(f[3], 10, 64)
	gen, err4 := strconv.Atoi(f[4])
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return Effect{}, fmt.Errorf("malformed effect %q: %w", line, err)
	}
	return Effect{PK: f[0], Key: receipts.Key{Scope: string(s), ID: string(id)}, Token: tok, Gen: gen}, nil
}

// Provider is the external system the effects go to. It survives every
// crash of the store. If F is set, every effect is appended and fsynced
// there before perform returns (the process-kill harness).
type Provider struct {
	mu     sync.Mutex
	byPK   map[string]Effect
	all    []Effect
	F      *os.File
	frozen bool // the world ended (power loss): nothing more happens
}

// NewProvider returns a provider that has seen no effect.
func NewProvider() *Provider { return &Provider{byPK: make(map[string]Effect)} }

var errCrashWorldEnded = errors.New("crash harness: the world ended")

func (p *Provider) find(pk string) (Effect, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok := p.byPK[pk]
	return e, ok
}

func (p *Provider) perform(e Effect) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.frozen {
		return errCrashWorldEnded
	}
	if p.F != nil {
		if _, err := p.F.Write(e.line()); err != nil {
			return err
		}
		if err := p.F.Sync(); err != nil {
			return err
		}
	}
	p.Load(e)
	return nil
}

// Load records e as performed without writing it anywhere (an effect read
// back from a provider log).
func (p *Provider) Load(e Effect) {
	if _, ok := p.byPK[e.PK]; !ok {
		p.byPK[e.PK] = e
	}
	p.all = append(p.all, e)
}

// Freeze ends the world (power loss): every later effect fails.
func (p *Provider) Freeze() {
	p.mu.Lock()
	p.frozen = true
	p.mu.Unlock()
}

// Thaw lets effects happen again, after the restart.
func (p *Provider) Thaw() {
	p.mu.Lock()
	p.frozen = false
	p.mu.Unlock()
}

// Effects returns every effect performed so far, in order.
func (p *Provider) Effects() []Effect {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Effect(nil), p.all...)
}

// Bad collects violations. onAdd, if set, sees each one as it happens
// (the kill harness's child writes them to a file).
type Bad struct {
	mu    sync.Mutex
	n     int
	msgs  []string
	OnAdd func(string)
}

func (b *Bad) addf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.n++
	if len(b.msgs) < 30 {
		b.msgs = append(b.msgs, msg)
	}
	if b.OnAdd != nil {
		b.OnAdd(msg)
	}
}

// Count is the number of violations so far.
func (b *Bad) Count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.n
}

// String lists the first violations.
func (b *Bad) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return fmt.Sprintf("%d violations:\n  %s", b.n, strings.Join(b.msgs, "\n  "))
}

// LoadStats counts what a workload did.
type LoadStats struct {
	ops, grants, Takeovers, Effects, reconciled, Commits, fails, releases,
	replays, zombiesFenced, doCalls, batchCommits, jumps atomic.Int64
}

// String is the counts on one line.
func (s *LoadStats) String() string {
	return fmt.Sprintf("ops=%d grants=%d takeovers=%d effects=%d reconciled=%d commits=%d fails=%d releases=%d replays=%d zombies-fenced=%d batch-commits=%d clock-jumps=%d",
		s.ops.Load(), s.grants.Load(), s.Takeovers.Load(), s.Effects.Load(), s.reconciled.Load(), s.Commits.Load(), s.fails.Load(),
		s.releases.Load(), s.replays.Load(), s.zombiesFenced.Load(), s.batchCommits.Load(), s.jumps.Load())
}

// Add adds o's counts to s.
func (s *LoadStats) Add(o *LoadStats) {
	s.ops.Add(o.ops.Load())
	s.grants.Add(o.grants.Load())
	s.Takeovers.Add(o.Takeovers.Load())
	s.Effects.Add(o.Effects.Load())
	s.reconciled.Add(o.reconciled.Load())
	s.Commits.Add(o.Commits.Load())
	s.fails.Add(o.fails.Load())
	s.releases.Add(o.releases.Load())
	s.replays.Add(o.replays.Load())
	s.zombiesFenced.Add(o.zombiesFenced.Load())
	s.batchCommits.Add(o.batchCommits.Load())
	s.jumps.Add(o.jumps.Load())
}

// Load is one generation's workload against one open DB.
type Load struct {
	DB       *receipts.DB
	Clock    *receiptstest.Clock
	Gen      int
	Prov     *Provider
	Rec      *Recorder
	Bad      *Bad
	St       *LoadStats
	Window   int64 // keys are drawn from [base+ops/8, base+ops/8+window)
	Base     int64
	MaxJumps int64
	DoWait   time.Duration // how long Do waits for another holder

	// expected, if set, says which errors the harness injected on purpose:
	// such an error stops the workload (fail-stop) instead of counting as a
	// violation.
	Expected func(error) bool

	gate  sync.RWMutex // a clock jump excludes every lease-check-then-effect section
	nonce atomic.Uint64
	Stop  atomic.Bool
	// onOps, if set, is called by the worker whose op brings the count to
	// onOpsAt.
	OnOpsAt int64
	OnOps   func()
}

type crashHeld struct {
	l  *receipts.Lease
	fx uint64 // the effect this lease reports (0: none yet)
}

func (w *Load) keyIndex(rng *rand.Rand) int64 {
	return w.Base + w.St.ops.Load()/8 + rng.Int64N(w.Window)
}

var (
	errCrashUnknown      = errors.New("crash harness: outcome unknown")
	errCrashNotPerformed = errors.New("crash harness: not performed")
	errCrashDeclined     = errors.New("crash harness: declined by provider")
)

// Worker runs ops until stopped or limit ops (0: no limit) are done.
func (w *Load) Worker(id int, rng *rand.Rand, limit int) {
	var held []crashHeld
	ctx := context.Background()
	for i := 0; !w.Stop.Load() && (limit == 0 || i < limit); i++ {
		w.Clock.Advance(time.Millisecond)
		if n := w.St.ops.Add(1); w.OnOps != nil && n == w.OnOpsAt {
			w.OnOps()
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
					w.fail(err, "gen %d: renew %s: %v", w.Gen, held[j].l.Key(), err)
				}
				w.St.zombiesFenced.Add(1)
				held = append(held[:j], held[j+1:]...)
			}
		case x < 62:
			w.doOp(ctx, rng)
		case x < 74:
			w.doBatchOp(ctx, rng)
		case x < 97:
			w.lookupOp(ctx, rng)
		default:
			if w.St.jumps.Load() < w.MaxJumps {
				w.gate.Lock()
				w.Clock.Advance(TTL + time.Second)
				w.gate.Unlock()
				w.St.jumps.Add(1)
			}
		}
	}
	// Held leases are dropped: their holders "died" with this generation.
}

// fail reports an unexpected error from the store, unless the harness
// injected it: then the workload stops, as a fail-stop process would.
func (w *Load) fail(err error, format string, args ...any) {
	if err != nil && w.Expected != nil && w.Expected(err) {
		w.Stop.Store(true)
		return
	}
	w.Bad.addf(format, args...)
}

func (w *Load) granted(l *receipts.Lease, durable bool) {
	e := Event{Kind: EvGrant, Gen: w.Gen, Key: l.Key(), Token: l.Token()}
	if !durable {
		e.Kind = EvGrantBatch
	}
	if l.Recovered() {
		e.State = receipts.Pending // marks a takeover
	}
	w.Rec.add(e)
	w.St.grants.Add(1)
	if l.Recovered() {
		w.St.Takeovers.Add(1)
	}
}

// reconcile asks the provider, by ProviderKey, whether a previous attempt's
// effect happened; it returns that effect's token or 0.
func (w *Load) reconcile(l *receipts.Lease) uint64 {
	if fx, ok := w.Prov.find(l.ProviderKey()); ok {
		w.St.reconciled.Add(1)
		return fx.Token
	}
	return 0
}

// effect checks that l still holds its key (Renew, fenced) and performs the
// effect at the provider. No clock jump happens in between, so a lease that
// passed the check is live while the effect runs. It returns the effect's
// token, or 0 if the lease was lost (nothing happened).
func (w *Load) effect(l *receipts.Lease) (uint64, error) {
	w.gate.RLock()
	defer w.gate.RUnlock()
	if err := l.Renew(context.Background()); err != nil {
		if errors.Is(err, receipts.ErrLeaseLost) {
			w.St.zombiesFenced.Add(1)
			return 0, nil
		}
		return 0, err
	}
	if err := w.Prov.perform(Effect{PK: l.ProviderKey(), Key: l.Key(), Token: l.Token(), Gen: w.Gen}); err != nil {
		return 0, err
	}
	w.St.Effects.Add(1)
	return l.Token(), nil
}

func (w *Load) result(l *receipts.Lease, fx uint64) []byte {
	return crashResult{Key: l.Key(), Token: l.Token(), Fx: fx, Gen: w.Gen, Nonce: w.nonce.Add(1)}.encode()
}

// claimOp claims a key; with a lease, it reconciles if recovered and maybe
// performs the effect.
func (w *Load) claimOp(ctx context.Context, rng *rand.Rand) (crashHeld, bool) {
	k := crashKey(w.keyIndex(rng))
	l, r, err := w.DB.Claim(ctx, k, FP(k))
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
					w.fail(err, "gen %d: effect of %s: %v", w.Gen, k, err)
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
		w.fail(err, "gen %d: claim %s: %v", w.Gen, k, err)
	}
	return crashHeld{}, false
}

// finish ends a held lease: commit, fail, release, or drop (the holder dies).
func (w *Load) finish(ctx context.Context, rng *rand.Rand, h crashHeld) {
	x := rng.IntN(100)
	if h.fx == 0 {
		switch {
		case x < 70:
			w.Rec.add(Event{Kind: EvReleasing, Gen: w.Gen, Key: h.l.Key(), Token: h.l.Token()})
			err := h.l.Release(ctx)
			switch {
			case err == nil:
				w.Rec.add(Event{Kind: evReleased, Gen: w.Gen, Key: h.l.Key(), Token: h.l.Token()})
				w.St.releases.Add(1)
			case errors.Is(err, receipts.ErrLeaseLost):
				w.St.zombiesFenced.Add(1)
			default:
				w.fail(err, "gen %d: release %s: %v", w.Gen, h.l.Key(), err)
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

func (w *Load) commit(ctx context.Context, h crashHeld, st receipts.State) {
	k := h.l.Key()
	res := w.result(h.l, h.fx)
	w.Rec.add(Event{Kind: EvAttempt, Gen: w.Gen, Key: k, Token: h.l.Token(), State: st, Result: res})
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
		w.Rec.add(Event{Kind: EvRejected, Gen: w.Gen, Key: k, Token: h.l.Token(), State: st, Result: res})
		w.St.zombiesFenced.Add(1)
	default:
		w.fail(err, "gen %d: commit %s: %v", w.Gen, k, err)
	}
}

// committed checks and records the receipt of l's own commit.
func (w *Load) committed(l *receipts.Lease, r *receipts.Receipt, st receipts.State, res []byte) {
	k := l.Key()
	if r == nil || r.Key != k || r.Token != l.Token() || r.State != st || !bytes.Equal(r.Result, res) {
		w.Bad.addf("gen %d: commit of %s by token %d (%s %q) returned %s", w.Gen, k, l.Token(), st, res, FmtReceipt(r))
		return
	}
	w.Rec.add(Event{Kind: EvCommitted, Gen: w.Gen, Key: k, Token: r.Token, State: r.State, Result: r.Result})
	if st == receipts.Succeeded {
		w.St.Commits.Add(1)
	} else {
		w.St.fails.Add(1)
	}
}

// observe checks and records a finished receipt someone was shown.
func (w *Load) observe(k receipts.Key, r *receipts.Receipt, src string) {
	w.St.replays.Add(1)
	if r.State != receipts.Succeeded && r.State != receipts.Failed {
		w.Bad.addf("gen %d: %s of %s returned a %s receipt", w.Gen, src, k, r.State)
		return
	}
	if err := crashCheckReceipt(k, r); err != nil {
		w.Bad.addf("gen %d: %s: %v", w.Gen, src, err)
		return
	}
	w.Rec.add(Event{Kind: evObserved, Gen: w.Gen, Key: k, Token: r.Token, State: r.State, Result: r.Result})
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

// FmtReceipt formats r for violation messages.
func FmtReceipt(r *receipts.Receipt) string {
	if r == nil {
		return "<nil>"
	}
	return fmt.Sprintf("{%s %s token=%d attempts=%d result=%q}", r.Key, r.State, r.Token, r.Attempts, r.Result)
}

func (w *Load) doOp(ctx context.Context, rng *rand.Rand) {
	k := crashKey(w.keyIndex(rng))
	ctx, cancel := context.WithTimeout(ctx, w.DoWait)
	defer cancel()
	var (
		lease   *receipts.Lease
		want    []byte
		wantSt  receipts.State
		outcome error
	)
	r, err := w.DB.Do(ctx, k, FP(k), func(_ context.Context, l *receipts.Lease) ([]byte, error) {
		lease = l
		w.granted(l, true)
		var fx uint64
		if l.Recovered() {
			fx = w.reconcile(l)
		}
		x := rng.IntN(100)
		if fx == 0 && x < 8 {
			w.Rec.add(Event{Kind: EvReleasing, Gen: w.Gen, Key: k, Token: l.Token()})
			outcome = errCrashNotPerformed
			return nil, receipts.NotPerformed(outcome)
		}
		if fx == 0 {
			var err error
			if fx, err = w.effect(l); err != nil || fx == 0 {
				if err != nil && !errors.Is(err, errCrashWorldEnded) {
					w.fail(err, "gen %d: effect of %s: %v", w.Gen, k, err)
				}
				w.Rec.add(Event{Kind: EvReleasing, Gen: w.Gen, Key: k, Token: l.Token()})
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
		w.Rec.add(Event{Kind: EvAttempt, Gen: w.Gen, Key: k, Token: l.Token(), State: wantSt, Result: want})
		if wantSt == receipts.Failed {
			outcome = errCrashDeclined
			return res, receipts.Permanent(outcome)
		}
		return res, nil
	})
	w.St.doCalls.Add(1)
	w.doDone(k, lease, want, wantSt, outcome, r, err)
}

// doDone checks what Do or DoBatch returned.
func (w *Load) doDone(k receipts.Key, lease *receipts.Lease, want []byte, wantSt receipts.State, outcome error, r *receipts.Receipt, err error) {
	switch {
	case lease == nil && r != nil && (err == nil || errors.Is(err, receipts.ErrFailed)):
		if (r.State == receipts.Failed) != (err != nil) {
			w.Bad.addf("gen %d: Do replay of %s: %s receipt with error %v", w.Gen, k, r.State, err)
		}
		w.observe(k, r, "Do replay")
	case lease == nil && (errors.Is(err, receipts.ErrInProgress) || errors.Is(err, context.DeadlineExceeded)):
	case lease == nil:
		w.fail(err, "gen %d: Do %s: %s, %v", w.Gen, k, FmtReceipt(r), err)
	case want != nil && r != nil && (err == nil) == (wantSt == receipts.Succeeded):
		w.committed(lease, r, wantSt, want)
	case want != nil && r == nil && errors.Is(err, receipts.ErrLeaseLost):
		w.Rec.add(Event{Kind: EvRejected, Gen: w.Gen, Key: k, Token: lease.Token(), State: wantSt, Result: want})
		w.St.zombiesFenced.Add(1)
	case want == nil && r == nil && outcome != nil && errors.Is(err, outcome):
		if errors.Is(err, receipts.ErrLeaseLost) {
			w.St.zombiesFenced.Add(1)
		}
	case want == nil && r == nil && errors.Is(err, receipts.ErrLeaseLost):
		w.St.zombiesFenced.Add(1)
	default:
		w.fail(err, "gen %d: Do %s (token %d, wanted %s %q, fn said %v): %s, %v", w.Gen, k, lease.Token(), wantSt, want, outcome, FmtReceipt(r), err)
	}
}

func (w *Load) doBatchOp(ctx context.Context, rng *rand.Rand) {
	k := crashBatchKey(w.keyIndex(rng))
	ctx, cancel := context.WithTimeout(ctx, w.DoWait)
	defer cancel()
	var (
		lease   *receipts.Lease
		want    []byte
		outcome error
	)
	r, err := pebblestore.DoBatch(ctx, w.DB, k, FP(k), func(_ context.Context, l *receipts.Lease, b *pebble.Batch) ([]byte, error) {
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
				if v, closer, err := peek.Pebble(w.DB).Get(crashAppKey(k)); err == nil {
					w.Bad.addf("gen %d: DoBatch %s recovered (token %d) with its effect %x already stored", w.Gen, k, l.Token(), v)
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
		w.Rec.add(Event{Kind: EvAttempt, Gen: w.Gen, Key: k, Token: l.Token(), State: receipts.Succeeded, Result: want})
		return want, nil
	})
	if lease != nil && want != nil && err == nil {
		w.St.batchCommits.Add(1)
	}
	w.doDone(k, lease, want, receipts.Succeeded, outcome, r, err)
}

func (w *Load) lookupOp(ctx context.Context, rng *rand.Rand) {
	i := w.keyIndex(rng)
	k := crashKey(i)
	if rng.IntN(4) == 0 {
		k = crashBatchKey(i)
	}
	r, err := w.DB.Lookup(ctx, k)
	switch {
	case errors.Is(err, receipts.ErrNotFound):
	case err != nil:
		w.fail(err, "gen %d: lookup %s: %v", w.Gen, k, err)
	case r.State == receipts.Pending:
		if r.Key != k {
			w.Bad.addf("gen %d: lookup %s returned %s", w.Gen, k, FmtReceipt(r))
		}
	default:
		w.observe(k, r, "lookup")
	}
}

// crashProbeSeq makes every probe key of Check new.
var crashProbeSeq atomic.Int64

// CheckStats is what one check looked at.
type CheckStats struct {
	Records, committed, pending, effects, Duplicates, LostAcks, LostClaims int
}

// Check compares the store with the history of acknowledged events and
// the provider's effects. gen names the check in messages.
//
// It scans the whole store; Stats (a second scan) runs only if withStats.
func Check(ctx context.Context, db *receipts.DB, evs []Event, effects []Effect, bad *Bad, gen int, withStats bool) CheckStats {
	var cs CheckStats
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
	cs.Records = len(recs)

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
		case EvGrant:
			ki := get(e.Key)
			ki.maxGrant = max(ki.maxGrant, e.Token)
		case evReleased:
			get(e.Key).released[e.Token] = true
		case EvReleasing:
			get(e.Key).releasing[e.Token] = true
		case EvAttempt:
			attempts[aKey(e.Key, e.Token, e.State, e.Result)] = true
		case EvRejected:
			rejected[aKey(e.Key, e.Token, e.State, e.Result)] = true
		case EvCommitted, evObserved:
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
			v, closer, err := peek.Pebble(db).Get(crashAppKey(k))
			switch {
			case err == nil:
				tok := binary.BigEndian.Uint64(append(make([]byte, 8-min(len(v), 8)), v...))
				_ = closer.Close()
				if r.State != receipts.Succeeded || tok != r.Token {
					bad.addf("check %d: DoBatch effect of %s (token %d) stored, receipt is %s", gen, k, tok, FmtReceipt(r))
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
				cs.LostAcks++
				bad.addf("check %d: acknowledged receipt of %s (%s token %d %q) lost: store has %s", gen, k, ki.out.st, ki.out.tok, ki.out.res, FmtReceipt(r))
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
				bad.addf("check %d: %s was released at token %d, store has %s", gen, k, ki.maxGrant, FmtReceipt(r))
			}
			continue
		}
		if r == nil && ki.releasing[ki.maxGrant] {
			continue // a release in flight at the crash may have landed
		}
		if r == nil || r.Token < ki.maxGrant {
			cs.LostClaims++
			bad.addf("check %d: acknowledged claim of %s (token %d) lost: store has %s", gen, k, ki.maxGrant, FmtReceipt(r))
		}
	}
	// DoBatch effects without a record.
	it, err := peek.Pebble(db).NewIter(&pebble.IterOptions{LowerBound: []byte("fx/"), UpperBound: []byte("fx0")})
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
	byKey := make(map[receipts.Key][]Effect)
	for _, e := range effects {
		byKey[e.Key] = append(byKey[e.Key], e)
	}
	cs.effects = len(effects)
	for k, fx := range byKey {
		if len(fx) > 1 {
			cs.Duplicates += len(fx) - 1
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

// ReadLines reads the complete lines of a file, truncating a torn last
// line (a write cut short) so that later appends start on a fresh line.
func ReadLines(path string) ([]string, error) {
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

// KeyIndex is the index i of crashKey(i) or crashBatchKey(i) (for the
// odd key of a colliding pair, i-1), from the digits that end the ID.
func KeyIndex(k receipts.Key) int64 {
	id := strings.TrimLeft(k.ID, "abcdefghijklmnopqrstuvwxyz-")
	n, _ := strconv.ParseInt(id, 10, 64)
	return n
}

// TestLogger is a Pebble logger for tests: Fatalf panics (in the
// calling goroutine) instead of exiting the process, after recording the
// message.
type TestLogger struct {
	mu     sync.Mutex
	Fatals []string
}

// Infof drops the message.
func (l *TestLogger) Infof(string, ...any) {}

// Errorf drops the message.
func (l *TestLogger) Errorf(string, ...any) {}

// Fatalf records the message and panics with it as a Fatal.
func (l *TestLogger) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	l.mu.Lock()
	l.Fatals = append(l.Fatals, msg)
	l.mu.Unlock()
	panic(Fatal(msg))
}

// Count is the number of Fatalf calls so far.
func (l *TestLogger) Count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.Fatals)
}

// Fatal is the panic value of TestLogger.Fatalf.
type Fatal string

// Open opens the harnesses' store in directory "db" of fs: the
// harnesses' Retention and TTL, no background GC, clock's time and the
// given Pebble logger. It fails the test if Open fails.
func Open(t testing.TB, fs vfs.FS, clock *receiptstest.Clock, logger pebble.Logger) *receipts.DB {
	t.Helper()
	db, err := pebblestore.Open("db", &pebblestore.Options{
		Options: receipts.Options{
			Retention:  Retention,
			LeaseTTL:   TTL,
			GCInterval: -1,
			Now:        clock.Now,
		},
		Pebble: &pebble.Options{FS: fs, Logger: logger},
	})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	return db
}
