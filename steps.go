package receipts

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/internal/detach"
	"github.com/receiptstore/receipts/internal/journal"
	"github.com/receiptstore/receipts/internal/keys"
	"github.com/receiptstore/receipts/internal/mutate"
	"github.com/receiptstore/receipts/internal/seal"
)

// Steps: a retry resumes the work. A key may guard an action of several steps (reserve a
// seat, charge a card, send an itinerary). Each finished step is recorded under the key,
// fenced by the lease's token, before Lease.Step returns, and is never run again for the
// key: a later attempt (a takeover after a crash, a retry on another node) gets its result
// without calling its fn, and runs only what is not done.
//
// The record is the claim's step journal (driver.Journals), kept with the claim's record:
// retention, tombstones, erasure, Options.HashKeys and GC treat it as they treat the
// receipt, and with Options.Keyring each step's result is sealed under the scope's data
// key. Before a step's fn runs, the journal records that it started (one durable write),
// and when fn returns, its outcome (a second): so the next attempt tells a step that never
// started from one whose outcome is unknown, and tells fn the truth (Step.Recovered).

// Limits on steps. A result too large to record is known only after the step ran: it is
// recorded as a failed step (its text says why), never run again.
const (
	// MaxSteps is the number of steps one key's action may take.
	MaxSteps = 64
	// MaxStepResultSize bounds a step's result. The whole journal (every step's name,
	// fingerprint and result) is bounded by MaxResultSize.
	MaxStepResultSize = 64 << 10
)

// ErrStepMismatch is returned by Lease.Step when the key's journal holds another step at
// this position (another name, or the same name with another fingerprint): a retry must
// call the same steps, in the same order, with the same fingerprints. Nothing runs and
// nothing is written; the journal stays as recorded, and the lease's later steps return it
// too. Under Do the claim is then abandoned, and stays so until an operator settles it (the
// code changed while the action was in flight).
var ErrStepMismatch = errors.New("receipts: step mismatch: a retry must call the same steps in the same order with the same fingerprints")

// Step is one step of an action, as its fn sees it (Lease.Step).
type Step struct {
	l         *Lease
	index     int
	name      string
	recovered bool

	mu     sync.Mutex
	staged []Effect
}

// Name returns the step's name.
func (s *Step) Name() string { return s.name }

// Index returns the step's position in the action, from 0.
func (s *Step) Index() int { return s.index }

// Recovered reports that this step started in an earlier attempt whose outcome is unknown
// (its holder crashed, or the step's fn failed in an unknown way): ask the provider, with
// ProviderKey, whether its effect happened before doing it again.
func (s *Step) Recovered() bool { return s.recovered }

// ProviderKey returns the idempotency key to forward to an external provider for this
// step: the same for every attempt of the key, on every node and across restarts, different
// for every other step and key, revealing nothing ("rk_" and 43 characters of
// [A-Za-z0-9_-], as Lease.ProviderKey, of which it is independent).
func (s *Step) ProviderKey() string { return s.l.db.stepKey(s.l.key, s.name) }

// Stage adds an effect that commits atomically with the step's record, in the engine's unit
// of atomic work (the Pebble batch, the PostgreSQL transaction), as Lease.Stage does with a
// receipt: Brandur Leach's atomic phase. It is run only if the step succeeds.
func (s *Step) Stage(effect Effect) {
	if effect == nil {
		return
	}
	s.mu.Lock()
	s.staged = append(s.staged, effect)
	s.mu.Unlock()
}

// effect is the step's staged effects as one.
func (s *Step) effect() Effect {
	s.mu.Lock()
	defer s.mu.Unlock()
	return joinEffects(s.staged)
}

// stepKey is Step.ProviderKey for k's step name.
func (db *DB) stepKey(k Key, name string) string {
	if sk, err := db.storedKey(k); err == nil { // Options.HashKeys: the same for a listed key
		k = Key(sk)
	}
	var sum [sha256.Size]byte
	return "rk_" + base64.RawURLEncoding.EncodeToString(keys.StepMAC(sum[:0], db.secret, k.Scope, k.ID, name))
}

// leaseSteps is a lease's view of its key's journal.
type leaseSteps struct {
	mu      sync.Mutex
	raw     []byte // the journal as the claim found it, until decoded
	loaded  bool
	entries []journal.Entry // as stored: finished steps, and maybe a started one last
	next    int             // the position of this attempt's next step
	broken  error           // a mismatch or an unknown outcome ended this attempt's steps
}

// journalSteps returns how many steps l's claim has in its journal, and how many of them
// are finished. A step that runs now (Release or Forget called from its fn) counts as one of
// each, and so does a journal that does not decode: what they did may have happened. Release
// keeps a claim that has any (its steps happened, or may have), Forget refuses one with a
// finished step.
func (l *Lease) journalSteps() (steps, finished int) {
	st := &l.steps
	if !st.mu.TryLock() {
		return 1, 1
	}
	defer st.mu.Unlock()
	entries := st.entries
	if !st.loaded {
		var err error
		if entries, err = journal.Decode(st.raw); err != nil {
			return 1, 1
		}
	}
	for i := range entries {
		if entries[i].State != driver.Pending {
			finished++
		}
	}
	return len(entries), finished
}

// Step runs fn as the action's next step, unless the key's journal holds it finished: then
// it returns the recorded result without calling fn. Steps are matched by position, and
// the name (non-empty, at most MaxKeyPartLen bytes, unique within the action) and the
// fingerprint (what the step's arguments are; nil for none, at most MaxFingerprintLen
// bytes) are checked: another step at this position returns ErrStepMismatch, and nothing
// runs. Steps run one at a time.
//
// fn's error decides what is recorded, as for Do:
//   - nil: the step is recorded as succeeded with its result, together with the effects
//     fn staged (Step.Stage), durably before Step returns.
//   - NotPerformed(err): nothing is recorded; Step returns err, and this step may run
//     again.
//   - Permanent(err): the step is recorded as failed (its result, or err's text) and
//     Step returns err; every later attempt gets the result and an error wrapping
//     ErrFailed, marked Permanent, without calling fn.
//   - any other error, a panic, or a record that fails: the outcome is unknown. The claim
//     is abandoned at once; Step returns an error wrapping ErrOutcomeUnknown, and the next
//     attempt runs this step again with Step.Recovered() == true and the same ProviderKey.
//
// A result larger than MaxStepResultSize, or one that would make the journal larger than
// MaxResultSize, is recorded as a failed step whose result says so, and Step returns an
// error marked Permanent: the step ran, so it is settled, never run again. Step returns
// ErrUnsupported on an engine that keeps no journal, and ErrInvalidArgument beyond
// MaxSteps, for a name used twice, or while another step of the lease runs.
func (l *Lease) Step(ctx context.Context, name string, fingerprint []byte, fn func(ctx context.Context, s *Step) ([]byte, error)) ([]byte, error) {
	if err := l.db.enter(); err != nil {
		return nil, err
	}
	defer l.db.exit()
	if name == "" || len(name) > MaxKeyPartLen {
		return nil, fmt.Errorf("%w: a step name of %d bytes (want 1 to %d)", ErrInvalidArgument, len(name), MaxKeyPartLen)
	}
	if len(fingerprint) > MaxFingerprintLen {
		return nil, fmt.Errorf("%w: step %q: a fingerprint of %d bytes (at most %d)", ErrInvalidFingerprint, name, len(fingerprint), MaxFingerprintLen)
	}
	jn, ok := l.db.eng.(driver.Journals)
	if !ok {
		return nil, fmt.Errorf("%w: steps on the %s engine", ErrUnsupported, l.db.eng.Name())
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	st := &l.steps
	if !st.mu.TryLock() {
		return nil, fmt.Errorf("%w: step %q: the steps of one action run one at a time", ErrInvalidArgument, name)
	}
	defer st.mu.Unlock()
	if !st.loaded {
		entries, err := journal.Decode(st.raw)
		if err != nil {
			return nil, fmt.Errorf("receipts: %s: %w", l.db.keyName(l.key), err)
		}
		st.entries, st.raw, st.loaded = entries, nil, true
	}
	if st.broken != nil {
		return nil, fmt.Errorf("receipts: %s: step %q not run: %w", l.db.keyName(l.key), name, st.broken)
	}
	i := st.next
	for j := range i {
		if st.entries[j].Name == name {
			return nil, fmt.Errorf("%w: step %q: the name is used twice in one action (steps %d and %d)", ErrInvalidArgument, name, j, i)
		}
	}
	recovered := false
	switch {
	case i < len(st.entries):
		e := &st.entries[i]
		if mutate.Name == mutate.StepAnyPos {
			e = stepAnyPos(st.entries, e)
		}
		if mutate.Name != mutate.StepAnyPos && (e.Name != name || !bytes.Equal(e.Fingerprint, fingerprint)) {
			what := "another fingerprint"
			if e.Name != name {
				what = fmt.Sprintf("another name (%q)", e.Name)
			}
			st.broken = fmt.Errorf("%w: %s: step %d is %q, recorded with %s", ErrStepMismatch, l.db.keyName(l.key), i, name, what)
			return nil, st.broken
		}
		if e.State != driver.Pending && mutate.Name != mutate.StepRerun { // finished: its recorded outcome, without fn
			res, err := l.db.openStep(ctx, l.skey, i, e)
			if err != nil {
				return nil, err
			}
			st.next++
			if e.State == driver.Failed {
				return res, Permanent(fmt.Errorf("receipts: %s: step %d %q: %w", l.db.keyName(l.key), i, name, ErrFailed))
			}
			return res, nil
		}
		recovered = true // it started in an earlier attempt, outcome unknown
	case i >= MaxSteps:
		return nil, fmt.Errorf("%w: step %q would be step %d (at most MaxSteps = %d)", ErrInvalidArgument, name, i+1, MaxSteps)
	default: // the intent: a durable "started" before fn runs
		started := append(st.entries[:i:i], journal.Entry{Name: name, Fingerprint: bytes.Clone(fingerprint), State: driver.Pending, Token: l.token, At: l.db.clock().UnixNano()})
		if _, err := jn.Journal(ctx, l.skey, l.token, journal.Append(nil, started), nil); err != nil {
			return nil, fmt.Errorf("receipts: %s: step %q not run: recording its start: %w", l.db.keyName(l.key), name, err)
		}
		st.entries = started
	}
	return l.runStep(ctx, jn, &Step{l: l, index: i, name: name, recovered: recovered}, fingerprint, fn)
}

// stepAnyPos is the stepanypos mutation's lookup: the journal's last finished entry, whatever
// e's position (internal/mutate).
func stepAnyPos(entries []journal.Entry, e *journal.Entry) *journal.Entry {
	for j := len(entries) - 1; j >= 0; j-- {
		if entries[j].State != driver.Pending {
			return &entries[j]
		}
	}
	return e
}

// runStep runs the started step s and records its outcome (Step).
func (l *Lease) runStep(ctx context.Context, jn driver.Journals, s *Step, fingerprint []byte, fn func(ctx context.Context, s *Step) ([]byte, error)) ([]byte, error) {
	st, i := &l.steps, s.index
	detached := detach.Context(ctx)
	unknown := func(why string, causes ...error) error {
		l.stepUnknown.Store(true) // what it did may have happened: the claim is never released
		st.broken = fmt.Errorf("%w: step %d %q", ErrOutcomeUnknown, i, s.name)
		if aerr := l.abandonUnknown(detached); aerr != nil {
			causes = append(causes, aerr)
		}
		return l.outcomeUnknown(fmt.Sprintf("step %d %q: %s", i, s.name, why), causes...)
	}
	finished := false
	defer func() {
		if !finished { // fn panicked (or called runtime.Goexit)
			_ = unknown("it panicked")
		}
	}()
	res, ferr := fn(ctx, s)
	finished = true

	state, effect := driver.Succeeded, Effect(nil)
	switch verdictOf(ferr) {
	case verdictRelease: // nothing happened: the start is taken back
		if _, err := jn.Journal(detached, l.skey, l.token, journalBytes(st.entries[:i]), nil); err != nil {
			// The start stays: the next attempt runs the step as Recovered, which is safe.
			l.settleFailed("taking back a step's start", err)
			return res, ferr
		}
		st.entries = st.entries[:i]
		return res, ferr
	case verdictUnknown:
		return nil, unknown("its outcome is unknown", ferr)
	case verdictFail:
		state = driver.Failed
		if res == nil {
			res = []byte(ferr.Error())
		}
	default:
		effect = s.effect()
	}
	if res == nil {
		res = []byte{}
	}
	size := 0
	for j := range st.entries[:i] {
		size += st.entries[j].Size()
	}
	entry := journal.Entry{Name: s.name, Fingerprint: bytes.Clone(fingerprint), Token: l.token, At: l.db.clock().UnixNano()}
	var tooLarge string
	switch {
	case len(res) > MaxStepResultSize:
		tooLarge = fmt.Sprintf("a result of %d bytes exceeds MaxStepResultSize (%d)", len(res), MaxStepResultSize)
	case size+entry.Size()+len(res)+seal.Overhead > MaxResultSize:
		tooLarge = fmt.Sprintf("a result of %d bytes would make the key's journal larger than MaxResultSize (%d)", len(res), MaxResultSize)
	}
	if tooLarge != "" { // it ran: settled as failed, never run again
		state, effect, res = driver.Failed, nil, []byte("receipts: step not recorded: "+tooLarge)
		ferr = Permanent(fmt.Errorf("receipts: %s: step %d %q: %s; recorded as failed", l.db.keyName(l.key), i, s.name, tooLarge))
	}
	entry.State = state
	sealed, err := l.sealStep(detached, i, state, res)
	if err != nil {
		return nil, unknown("sealing its result failed", ferr, err)
	}
	entry.Result = sealed
	entries := append(st.entries[:i:i], entry)
	var fx func(ctx context.Context, tx any) error
	if effect != nil {
		fx = effect
	}
	if _, err := jn.Journal(detached, l.skey, l.token, journal.Append(nil, entries), fx); err != nil {
		return nil, unknown("recording it failed", ferr, err)
	}
	st.entries, st.next = entries, i+1
	return res, ferr
}

// journalBytes encodes entries, nil for none (the record keeps no journal).
func journalBytes(entries []journal.Entry) []byte {
	if len(entries) == 0 {
		return nil
	}
	return journal.Append(nil, entries)
}

// stepSealState is what a step's sealed result is bound to in place of a record's state: a
// value no record has, distinct for every position and outcome, so a step's envelope opens
// neither as a receipt's result nor as another step's.
func stepSealState(i int, state driver.State) driver.State {
	return driver.State(0x80 | i<<1 | int(state&1))
}

// sealStep is what l stores for step i's result: its envelope with a Keyring.
func (l *Lease) sealStep(ctx context.Context, i int, state driver.State, res []byte) ([]byte, error) {
	return l.sealResult(ctx, stepSealState(i, state), res)
}

// openStep returns step i's result in the clear.
func (db *DB) openStep(ctx context.Context, sk driver.Key, i int, e *journal.Entry) ([]byte, error) {
	if !seal.IsSealed(e.Result) {
		return bytes.Clone(e.Result), nil
	}
	rec := driver.Record{Key: sk, Token: e.Token, State: stepSealState(i, e.State), Result: e.Result}
	if err := db.seal.Open(ctx, &rec); err != nil {
		return nil, err
	}
	return rec.Result, nil
}

// StepRecord is one step of a key's journal, as DB.Steps reports it.
type StepRecord struct {
	Index       int
	Name        string
	Fingerprint []byte
	// State is Succeeded or Failed once the step is recorded. Pending means it started and
	// has no outcome yet: it runs now if the claim's lease is live, and otherwise its outcome
	// is unknown (the next attempt runs it again, Recovered).
	State State
	// Result is the step's result in the clear (nil while Pending).
	Result []byte
	// At is when it was recorded (for Pending: when it started).
	At time.Time
	// ProviderKey is Step.ProviderKey: what the step forwarded to its provider.
	ProviderKey string
}

// Steps returns k's step journal, in order: what the steps of its action recorded, for
// operators (receiptctl get), as Inspect is: no Options.BeforeReplay, results in the
// clear. A key without steps has none; a key with no record returns ErrNotFound.
func (db *DB) Steps(ctx context.Context, k Key) ([]StepRecord, error) {
	if err := db.enter(); err != nil {
		return nil, err
	}
	defer db.exit()
	if err := k.validate(); err != nil {
		return nil, err
	}
	sk, err := db.storedKey(k)
	if err != nil {
		return nil, err
	}
	rec, found, _, err := db.eng.Lookup(ctx, sk)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, db.keyName(k))
	}
	entries, err := journal.Decode(rec.Journal)
	if err != nil {
		return nil, fmt.Errorf("receipts: %s: %w", db.keyName(k), err)
	}
	out := make([]StepRecord, len(entries))
	for i := range entries {
		e := &entries[i]
		s := StepRecord{Index: i, Name: e.Name, Fingerprint: bytes.Clone(e.Fingerprint), State: State(e.State),
			At: time.Unix(0, e.At), ProviderKey: db.stepKey(k, e.Name)}
		if e.State != driver.Pending {
			if s.Result, err = db.openStep(ctx, sk, i, e); err != nil {
				return nil, err
			}
		}
		out[i] = s
	}
	return out, nil
}

// SettleStep settles the step named name that the key's journal holds as started, its
// outcome unknown (the last step, DB.Steps reports it Pending), without running it: what an
// operator does after asking the provider, by the step's ProviderKey, what happened. Call it
// on a lease that took the claim over (DB.TakeOver, or Claim of an abandoned claim).
//   - Succeeded or Failed: the step is recorded with result, as if its fn had returned it
//     (nil or Permanent); the next attempt gets it without running the step.
//   - Pending: the step did not happen; its start is taken back, and the next attempt runs
//     it as never started (not Recovered).
//
// It returns ErrNotFound if the journal's last step is not name started, ErrInvalidArgument
// for another state or a result larger than MaxStepResultSize, and ErrLeaseLost if the lease
// is lost; nothing is written then.
func (l *Lease) SettleStep(ctx context.Context, name string, state State, result []byte) error {
	if err := l.db.enter(); err != nil {
		return err
	}
	defer l.db.exit()
	if state != Succeeded && state != Failed && state != Pending {
		return fmt.Errorf("%w: settle step %q as %s (want succeeded, failed or pending)", ErrInvalidArgument, name, state)
	}
	if len(result) > MaxStepResultSize {
		return fmt.Errorf("%w: settle step %q: a result of %d bytes (at most MaxStepResultSize = %d)", ErrInvalidArgument, name, len(result), MaxStepResultSize)
	}
	jn, ok := l.db.eng.(driver.Journals)
	if !ok {
		return fmt.Errorf("%w: steps on the %s engine", ErrUnsupported, l.db.eng.Name())
	}
	st := &l.steps
	if !st.mu.TryLock() {
		return fmt.Errorf("%w: settle step %q while a step of the lease runs", ErrInvalidArgument, name)
	}
	defer st.mu.Unlock()
	if !st.loaded {
		entries, err := journal.Decode(st.raw)
		if err != nil {
			return fmt.Errorf("receipts: %s: %w", l.db.keyName(l.key), err)
		}
		st.entries, st.raw, st.loaded = entries, nil, true
	}
	n := len(st.entries)
	if n == 0 || st.entries[n-1].State != driver.Pending || st.entries[n-1].Name != name {
		return fmt.Errorf("%w: %s: no step %q started with its outcome unknown", ErrNotFound, l.db.keyName(l.key), name)
	}
	entries := st.entries[: n-1 : n-1]
	if state != Pending {
		if result == nil {
			result = []byte{}
		}
		sealed, err := l.sealStep(ctx, n-1, driver.State(state), result)
		if err != nil {
			return err
		}
		e := st.entries[n-1]
		e.State, e.Token, e.At, e.Result = driver.State(state), l.token, l.db.clock().UnixNano(), sealed
		entries = append(entries, e)
	}
	if _, err := jn.Journal(ctx, l.skey, l.token, journalBytes(entries), nil); err != nil {
		return err
	}
	st.entries = entries
	return nil
}
