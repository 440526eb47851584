package intents

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"sync"
	"time"

	"github.com/receiptstore/receipts/internal/uuidv7"
)

// Journal keeps approved actions, each with its operation key, until they
// are answered. Approve records an action; a Dispatcher delivers it. A
// Journal is safe for concurrent use.
type Journal struct {
	store Store
	opts  Options

	mu sync.Mutex // protects closed, calls and changed
	// closed is set by Close; calls counts the calls into the store in
	// progress, which Close waits for (idle is signalled when it drops to
	// zero). A call that starts after Close began gets ErrClosed, also
	// inside a List loop: nothing waits for Close while Close waits for it.
	closed bool
	calls  int
	idle   *sync.Cond
	// changed is closed (and replaced) whenever this Journal changes an
	// action: it wakes Wait and the Dispatcher.
	changed chan struct{}
	// hosts are the HostNames of the Dispatchers open on this Journal.
	// On a store no other process can open (exclusive: Pebble), a lease
	// held by any other name is a dead process's, and free.
	hosts     map[string]bool
	exclusive bool
}

// New returns a Journal that keeps its actions in s (see Store). Open is
// New with the Pebble store.
func New(s Store, opts *Options) (*Journal, error) {
	if s == nil {
		return nil, bad(errors.New("intents: New needs a Store"))
	}
	o, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	_, exclusive := s.(*pebbleStore)
	j := &Journal{store: s, opts: o, changed: make(chan struct{}), hosts: map[string]bool{}, exclusive: exclusive}
	j.idle = sync.NewCond(&j.mu)
	return j, nil
}

// Close closes the journal and its store, after the calls in progress.
// Close the Dispatchers that use it first. A second Close returns nil.
func (j *Journal) Close() error {
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		return nil
	}
	j.closed = true
	close(j.changed) // wake every Wait: it sees ErrClosed
	for j.calls > 0 {
		j.idle.Wait()
	}
	j.mu.Unlock()
	return j.store.Close()
}

// enter starts a call into the store; leave ends it.
func (j *Journal) enter() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return ErrClosed
	}
	j.calls++
	return nil
}

func (j *Journal) leave() {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.calls--; j.calls == 0 {
		j.idle.Broadcast()
	}
}

// changes returns a channel that is closed at the next change made through
// j (or when j closes).
func (j *Journal) changes() <-chan struct{} {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.changed
}

func (j *Journal) notify() {
	j.mu.Lock()
	defer j.mu.Unlock()
	if !j.closed {
		close(j.changed)
		j.changed = make(chan struct{})
	}
}

// Now returns the journal's time (Options.Now).
func (j *Journal) Now() time.Time { return j.opts.Now() }

// Approve records an approved action with a fresh operation key (a
// UUIDv7) and returns it. The key and the request are durable before
// Approve returns: from then on, the action is delivered under that key
// until it is answered or its deadline passes, across restarts.
//
// Every Approve is a new action with a new key, even with the same
// arguments as another: two approvals mean two intended effects. The one
// exception is a.Ref: an approval whose Ref the journal holds returns the
// action approved under it (the same key, the stored deadline), since it
// is the same approval seen again; with another request it fails with
// ErrRefConflict.
//
// An error that is not bad input leaves the approval unknown only on a
// store that can lose a commit's reply (PostgreSQL: the connection broke
// as it committed): call Approve again with the same Ref (and a deadline
// still in the future), which returns the action if it was recorded, with
// its own deadline, and records it if not. Without a Ref, a second Approve
// is a second action.
//
// Bad input fails with an error wrapping ErrInvalid and one of
// ErrEmptyTarget, ErrEmptyOperation, ErrNoApprover, ErrBadArguments,
// ErrDeadlinePassed or ErrTooLong, and records nothing.
func (j *Journal) Approve(ctx context.Context, a Approval) (*Action, error) {
	args, err := checkApproval(&a)
	if err != nil {
		return nil, err
	}
	now := j.opts.Now()
	deadline := a.Deadline
	if deadline.IsZero() {
		deadline = now.Add(j.opts.DeliverFor)
	} else if !deadline.After(now) {
		return nil, bad(fmt.Errorf("%w: %s is not after now (%s)", ErrDeadlinePassed,
			deadline.Format(time.RFC3339Nano), now.Format(time.RFC3339Nano)))
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	act := &Action{
		Key:        uuidv7.New(now),
		Target:     a.Target,
		Operation:  a.Operation,
		Arguments:  args,
		ApprovedBy: a.ApprovedBy,
		Ref:        a.Ref,
		ApprovedAt: now,
		Deadline:   deadline,
		State:      Approved,
		UpdatedAt:  now,
	}
	if err := j.enter(); err != nil {
		return nil, err
	}
	stored, created, err := j.store.Create(ctx, act)
	j.leave()
	if err != nil {
		return nil, fmt.Errorf("intents: approve: %w", err)
	}
	if !created {
		if stored.Target != act.Target || stored.Operation != act.Operation || !bytes.Equal(stored.Arguments, act.Arguments) {
			return nil, fmt.Errorf("%w: ref %q is action %s (%s %s)", ErrRefConflict, a.Ref, stored.Key, stored.Target, stored.Operation)
		}
		return stored, nil
	}
	j.notify()
	return stored, nil
}

// checkApproval validates a and returns its arguments as compact JSON.
func checkApproval(a *Approval) (json.RawMessage, error) {
	switch {
	case a.Target == "":
		return nil, bad(ErrEmptyTarget)
	case a.Operation == "":
		return nil, bad(ErrEmptyOperation)
	case a.ApprovedBy == "":
		return nil, bad(ErrNoApprover)
	}
	for _, f := range []struct{ name, v string }{{"Target", a.Target}, {"Operation", a.Operation}, {"ApprovedBy", a.ApprovedBy}, {"Ref", a.Ref}} {
		if len(f.v) > MaxFieldLen {
			return nil, bad(fmt.Errorf("%w: %s of %d bytes (max %d)", ErrTooLong, f.name, len(f.v), MaxFieldLen))
		}
	}
	return encodeArguments(a.Arguments)
}

// encodeArguments returns v as compact JSON.
func encodeArguments(v any) (json.RawMessage, error) {
	var raw []byte
	switch x := v.(type) {
	case nil:
		return json.RawMessage("null"), nil
	case json.RawMessage:
		raw = x
	case *json.RawMessage:
		if x == nil {
			return json.RawMessage("null"), nil
		}
		raw = *x
	default:
		b, err := json.Marshal(v)
		if err != nil {
			return nil, bad(fmt.Errorf("%w: %w", ErrBadArguments, err))
		}
		raw = b
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return nil, bad(fmt.Errorf("%w: not JSON: %w", ErrBadArguments, err))
	}
	if buf.Len() > MaxArgumentsSize {
		return nil, bad(fmt.Errorf("%w: %d bytes (max %d)", ErrBadArguments, buf.Len(), MaxArgumentsSize))
	}
	return json.RawMessage(buf.Bytes()), nil
}

// Get returns the action with the operation key key, or ErrNotFound.
func (j *Journal) Get(ctx context.Context, key string) (*Action, error) {
	if err := j.enter(); err != nil {
		return nil, err
	}
	defer j.leave()
	return j.store.Get(ctx, key)
}

// List yields the actions in state (0: every state) in approval order.
// List(ctx, Uncertain) is the list a person or a reconcile hook works
// through.
func (j *Journal) List(ctx context.Context, state State) iter.Seq2[*Action, error] {
	return func(yield func(*Action, error) bool) {
		if state != 0 && (state < Approved || state > Uncertain) {
			yield(nil, bad(fmt.Errorf("intents: List: unknown %v", state)))
			return
		}
		if err := j.enter(); err != nil {
			yield(nil, err)
			return
		}
		defer j.leave()
		for a, err := range j.store.List(ctx, state) {
			if !yield(a, err) || err != nil {
				return
			}
		}
	}
}

// Wait waits until the action key is done (answered or Uncertain: see
// State.Done) and returns it, or until ctx ends. Changes made through this
// Journal wake it at once; changes by other processes are seen within
// Options.PollInterval.
func (j *Journal) Wait(ctx context.Context, key string) (*Action, error) {
	var timer *time.Timer
	for {
		ch := j.changes()
		a, err := j.Get(ctx, key)
		if err != nil {
			return nil, err
		}
		if a.State.Done() {
			return a, nil
		}
		if timer == nil {
			timer = time.NewTimer(j.opts.PollInterval)
			defer timer.Stop()
		} else {
			timer.Reset(j.opts.PollInterval)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-ch:
		case <-timer.C:
		}
	}
}

// Settle records what happened to an Uncertain action, found out by a
// person or a reconcile hook (asking the service by the action's key, say):
// state is Succeeded or Failed (or Conflict, Expired), by says who settled
// it, body is what they found (may be nil). Settle applies to Uncertain
// actions only (ErrWrongState otherwise).
func (j *Journal) Settle(ctx context.Context, key string, state State, by string, body []byte) (*Action, error) {
	switch {
	case !state.Answered():
		return nil, bad(fmt.Errorf("intents: Settle: %v is not an answer (want succeeded, failed, conflict or expired)", state))
	case by == "":
		return nil, bad(fmt.Errorf("%w: Settle needs who settled", ErrNoApprover))
	case len(by) > MaxFieldLen:
		return nil, bad(fmt.Errorf("%w: settled by %d bytes (max %d)", ErrTooLong, len(by), MaxFieldLen))
	case len(body) > MaxAnswerSize:
		return nil, bad(fmt.Errorf("%w: body of %d bytes (max %d)", ErrInvalid, len(body), MaxAnswerSize))
	}
	now := j.opts.Now()
	return j.update(ctx, key, []State{Uncertain}, true, func(a *Action) error {
		a.State = state
		a.Answer = &Answer{State: state, Body: append([]byte(nil), body...), SettledBy: by, At: now}
		a.UpdatedAt = now
		return nil
	})
}

// Redeliver puts an Uncertain action back into delivery, under its own key,
// until deadline: the service runs it if it never did, and answers with
// what it stored if it did. Redeliver applies to Uncertain actions only
// (ErrWrongState otherwise); the deadline must be in the future
// (ErrDeadlinePassed).
func (j *Journal) Redeliver(ctx context.Context, key string, deadline time.Time) (*Action, error) {
	now := j.opts.Now()
	if !deadline.After(now) {
		return nil, bad(fmt.Errorf("%w: %s is not after now (%s)", ErrDeadlinePassed,
			deadline.Format(time.RFC3339Nano), now.Format(time.RFC3339Nano)))
	}
	return j.update(ctx, key, []State{Uncertain}, true, func(a *Action) error {
		a.State = Approved
		a.Deadline = deadline
		a.UpdatedAt = now
		return nil
	})
}

// Forget removes an answered action (and its Ref) from the journal. It
// applies to answered actions only (ErrWrongState otherwise): an action
// that may still take effect is never dropped.
func (j *Journal) Forget(ctx context.Context, key string) error {
	if err := j.enter(); err != nil {
		return err
	}
	err := j.store.Delete(ctx, key, []State{Succeeded, Failed, Conflict, Expired})
	j.leave()
	if err == nil {
		j.notify()
	}
	return err
}

// update runs Store.Update and wakes waiters after a change.
func (j *Journal) update(ctx context.Context, key string, from []State, sync bool, change func(*Action) error) (*Action, error) {
	if err := j.enter(); err != nil {
		return nil, err
	}
	a, err := j.store.Update(ctx, key, from, sync, change)
	j.leave()
	if err != nil {
		return nil, err
	}
	j.notify()
	return a, nil
}

// answer records a definitive answer to an Approved or Uncertain action,
// whoever holds it: an answer is the service's, and ends the lease.
func (j *Journal) answer(ctx context.Context, key string, ans *Answer) (*Action, error) {
	now := j.opts.Now()
	return j.update(ctx, key, []State{Approved, Uncertain}, true, func(a *Action) error {
		c := *ans
		c.At = now
		a.State = c.State
		a.Answer = &c
		a.LastError, a.UncertainStep = "", ""
		a.Holder, a.LeaseUntil = "", time.Time{}
		a.UpdatedAt = now
		return nil
	})
}

// errHeld: another host holds the action's delivery lease.
var errHeld = errors.New("intents: another host holds the action's delivery lease")

// free reports whether host may deliver a at now: no other host holds a
// lease on it that has not ended. On an exclusive store, only this
// Journal's Dispatchers can hold one.
func (j *Journal) free(a *Action, host string, now time.Time) bool {
	if a.Holder == "" || a.Holder == host || !now.Before(a.LeaseUntil) {
		return true
	}
	if !j.exclusive {
		return false
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	return !j.hosts[a.Holder]
}

// addHost and dropHost register a Dispatcher's HostName.
func (j *Journal) addHost(host string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.hosts[host] = true
}

func (j *Journal) dropHost(host string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	delete(j.hosts, host)
}

func heldBy(a *Action) error {
	return fmt.Errorf("%w: %s holds %s until %s", errHeld, a.Holder, a.Key, a.LeaseUntil.Format(time.RFC3339Nano))
}

// uncertain turns an Approved action Uncertain, unless another host holds
// it. A non-empty step is the step the service last reported uncertain.
func (j *Journal) uncertain(ctx context.Context, key, host, why, step string) (*Action, error) {
	now := j.opts.Now()
	return j.update(ctx, key, []State{Approved}, true, func(a *Action) error {
		if !j.free(a, host, now) {
			return heldBy(a)
		}
		a.State = Uncertain
		a.LastError = why
		if step != "" {
			a.UncertainStep = step
		}
		a.Holder, a.LeaseUntil = "", time.Time{}
		a.UpdatedAt = now
		return nil
	})
}

// claim takes (or keeps) host's delivery lease on the Approved action key,
// until until, and counts the delivery host is about to make: Attempts
// counts every host's. It fails with errHeld while another host's lease
// runs. Like attempted, it does not wait for the disk.
func (j *Journal) claim(ctx context.Context, key, host string, until time.Time) (*Action, error) {
	if err := j.enter(); err != nil {
		return nil, err
	}
	defer j.leave()
	now := j.opts.Now()
	return j.store.Update(ctx, key, []State{Approved}, false, func(a *Action) error {
		if !j.free(a, host, now) {
			return heldBy(a)
		}
		a.Holder, a.LeaseUntil = host, until
		a.Attempts++
		a.UpdatedAt = now
		return nil
	})
}

// attempted records, without waiting for the disk, why an attempt got no
// answer, unless another host holds the action. With a non-zero until,
// host holds the action until then (its wait before the next attempt). A
// non-empty step is the step the service reported uncertain.
func (j *Journal) attempted(ctx context.Context, key, host, why, step string, until time.Time) error {
	if err := j.enter(); err != nil {
		return err
	}
	defer j.leave()
	now := j.opts.Now()
	_, err := j.store.Update(ctx, key, []State{Approved}, false, func(a *Action) error {
		if !j.free(a, host, now) {
			return heldBy(a)
		}
		if !until.IsZero() {
			a.Holder, a.LeaseUntil = host, until
		}
		a.LastError = why
		if step != "" {
			a.UncertainStep = step
		}
		a.UpdatedAt = now
		return nil
	})
	return err
}

// errNotHeld: release found the action not held by the host.
var errNotHeld = errors.New("intents: not held")

// release ends host's lease on the Approved action key, if it holds it,
// so that another host takes it over at once.
func (j *Journal) release(ctx context.Context, key, host string) error {
	if err := j.enter(); err != nil {
		return err
	}
	defer j.leave()
	_, err := j.store.Update(ctx, key, []State{Approved}, false, func(a *Action) error {
		if a.Holder != host {
			return errNotHeld
		}
		a.Holder, a.LeaseUntil = "", time.Time{}
		return nil
	})
	switch {
	case err == nil:
		j.notify() // another Dispatcher of this journal may take it now
	case errors.Is(err, errNotHeld), errors.Is(err, ErrWrongState), errors.Is(err, ErrNotFound):
		return nil
	}
	return err
}
