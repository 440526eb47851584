package intents

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"
)

// Defaults of DispatcherOptions.
const (
	DefaultConcurrency    = 16
	DefaultAttemptTimeout = 30 * time.Second
	DefaultMinBackoff     = 100 * time.Millisecond
	DefaultMaxBackoff     = 30 * time.Second
)

// DispatcherOptions configures a Dispatcher.
type DispatcherOptions struct {
	// Transports delivers actions by their Target. Required. An action
	// whose Target has no Transport stays Approved (ErrNoTransport) and
	// turns Uncertain at its deadline.
	Transports map[string]Transport
	// Concurrency bounds the attempts in flight at once. Default
	// DefaultConcurrency.
	Concurrency int
	// AttemptTimeout bounds one attempt (and the action's deadline bounds
	// every attempt). Default DefaultAttemptTimeout.
	AttemptTimeout time.Duration
	// MinBackoff and MaxBackoff bound the wait between two attempts of one
	// action: exponential from MinBackoff, capped at MaxBackoff, with full
	// jitter, and at least what the service asked for (Retry-After).
	// Defaults DefaultMinBackoff, DefaultMaxBackoff.
	MinBackoff, MaxBackoff time.Duration
	// OnUncertain, if set, is called when an action turns Uncertain (its
	// deadline came without an answer): a reconcile hook, which may ask the
	// service by the action's key and call Journal.Settle or
	// Journal.Redeliver. It runs on the Dispatcher's goroutine for that
	// action, with a context that Close cancels. Uncertain actions are
	// listed by Journal.List(ctx, Uncertain) in any case.
	OnUncertain func(ctx context.Context, a *Action)
	// Logger receives attempts that failed and answers that could not be
	// recorded. Default: the journal's Options.Logger.
	Logger *slog.Logger
}

// Dispatcher delivers a Journal's Approved actions through their
// Transports until each has an answer or its deadline passes. It starts
// with every Approved action in the journal (so after a restart it resumes
// each with its own key), and picks up new approvals as they are made.
//
// Delivery is at-least-once and carries the action's key every time; the
// service makes it once. A retry never mints a key. An action is never
// dropped: it ends answered (Succeeded, Failed, Conflict, Expired) or
// Uncertain. The answer of an attempt whose recording a crash cut short
// is fetched again on restart: the service replays it.
//
// Several Dispatchers may share a journal on PostgreSQL (several hosts):
// each delivers every Approved action, which the key makes safe; the first
// answer recorded wins.
type Dispatcher struct {
	j   *Journal
	o   DispatcherOptions
	log *slog.Logger
	sem chan struct{} // one token per attempt in flight

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex      // protects active
	active map[string]bool // keys this Dispatcher is delivering
}

// NewDispatcher starts delivering j's Approved actions. Close stops it.
func NewDispatcher(j *Journal, opts DispatcherOptions) (*Dispatcher, error) {
	switch {
	case j == nil:
		return nil, bad(errors.New("intents: NewDispatcher needs a Journal"))
	case len(opts.Transports) == 0:
		return nil, bad(errors.New("intents: DispatcherOptions.Transports is empty"))
	}
	for name, t := range opts.Transports {
		if t == nil {
			return nil, bad(fmt.Errorf("intents: DispatcherOptions.Transports[%q] is nil", name))
		}
	}
	if opts.Concurrency == 0 {
		opts.Concurrency = DefaultConcurrency
	}
	if opts.AttemptTimeout == 0 {
		opts.AttemptTimeout = DefaultAttemptTimeout
	}
	if opts.MinBackoff == 0 {
		opts.MinBackoff = DefaultMinBackoff
	}
	if opts.MaxBackoff == 0 {
		opts.MaxBackoff = DefaultMaxBackoff
	}
	switch {
	case opts.Concurrency < 0:
		return nil, bad(fmt.Errorf("intents: DispatcherOptions.Concurrency %d < 0", opts.Concurrency))
	case opts.AttemptTimeout < 0 || opts.AttemptTimeout > maxDuration:
		return nil, bad(fmt.Errorf("intents: DispatcherOptions.AttemptTimeout %s out of (0, %s]", opts.AttemptTimeout, maxDuration))
	case opts.MinBackoff < 0 || opts.MaxBackoff < opts.MinBackoff || opts.MaxBackoff > maxDuration:
		return nil, bad(fmt.Errorf("intents: DispatcherOptions backoff %s..%s: want 0 < MinBackoff <= MaxBackoff <= %s", opts.MinBackoff, opts.MaxBackoff, maxDuration))
	}
	log := opts.Logger
	if log == nil {
		log = j.opts.Logger
	}
	ctx, cancel := context.WithCancel(context.Background())
	d := &Dispatcher{j: j, o: opts, log: log, sem: make(chan struct{}, opts.Concurrency),
		ctx: ctx, cancel: cancel, active: map[string]bool{}}
	d.wg.Add(1)
	go d.loop()
	return d, nil
}

// Close stops delivery and waits for the Dispatcher's goroutines. Actions
// in delivery stay Approved, with their keys: the next Dispatcher resumes
// them. An answer that has arrived is still recorded. A second Close
// returns nil.
func (d *Dispatcher) Close() error {
	d.cancel()
	d.wg.Wait()
	return nil
}

// loop starts a delivery for each Approved action not in delivery, at
// start, at every change made through the journal, and every
// PollInterval.
func (d *Dispatcher) loop() {
	defer d.wg.Done()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		changed := d.j.changes()
		d.scan()
		timer.Reset(d.j.opts.PollInterval)
		select {
		case <-d.ctx.Done():
			return
		case <-changed:
		case <-timer.C:
		}
	}
}

func (d *Dispatcher) scan() {
	for a, err := range d.j.List(d.ctx, Approved) {
		if err != nil {
			if d.ctx.Err() == nil && !errors.Is(err, ErrClosed) {
				d.log.Error("intents: listing approved actions failed", "err", err)
			}
			return
		}
		d.mu.Lock()
		if d.active[a.Key] {
			d.mu.Unlock()
			continue
		}
		d.active[a.Key] = true
		d.mu.Unlock()
		d.wg.Add(1)
		go d.deliver(a.Key)
	}
}

// deliver delivers a until it is answered, turns Uncertain, or d closes.
func (d *Dispatcher) deliver(key string) {
	defer d.wg.Done()
	defer func() {
		d.mu.Lock()
		delete(d.active, key)
		d.mu.Unlock()
	}()
	// Read it again: scan's copy may predate an answer this Dispatcher
	// just recorded. On an error (the store is restarting), the next scan
	// starts it again.
	a, err := d.j.Get(d.ctx, key)
	if err != nil || a.State != Approved {
		return
	}
	attempts := a.Attempts
	var last error
	for {
		left := a.Deadline.Sub(d.j.Now())
		if left <= 0 {
			d.giveUp(a, attempts, last)
			return
		}
		tr := d.o.Transports[a.Target]
		var ans *Answer
		var err error
		if tr == nil {
			err = fmt.Errorf("%w %q", ErrNoTransport, a.Target)
		} else {
			ans, err = d.attempt(tr, a, min(left, d.o.AttemptTimeout))
			attempts++
		}
		if d.ctx.Err() != nil && ans == nil {
			return // closing: the action stays Approved
		}
		if err == nil {
			if !ans.State.Answered() {
				err = fmt.Errorf("intents: transport for %q answered %v, not an answer", a.Target, ans.State)
			} else if d.record(a, ans, attempts) {
				return
			} else {
				err = errors.New("intents: recording the answer failed")
			}
		}
		last = err
		d.log.Debug("intents: attempt got no answer", "key", a.Key, "target", a.Target, "attempt", attempts, "err", err)
		if err := d.j.attempted(d.ctx, a.Key, attempts, err.Error()); err != nil {
			if errors.Is(err, ErrWrongState) || errors.Is(err, ErrNotFound) {
				return // settled elsewhere (another host, a person)
			}
			if d.ctx.Err() != nil || errors.Is(err, ErrClosed) {
				return
			}
			d.log.Warn("intents: recording an attempt failed", "key", a.Key, "err", err)
		}
		wait := min(d.backoff(attempts, err), a.Deadline.Sub(d.j.Now()))
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-d.ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
	}
}

// attempt runs one Deliver, holding a concurrency token.
func (d *Dispatcher) attempt(tr Transport, a *Action, timeout time.Duration) (*Answer, error) {
	select {
	case d.sem <- struct{}{}:
	case <-d.ctx.Done():
		return nil, d.ctx.Err()
	}
	defer func() { <-d.sem }()
	ctx, cancel := context.WithTimeout(d.ctx, timeout)
	defer cancel()
	return tr.Deliver(ctx, a.clone())
}

// record records ans, also while d closes: it arrived, and recording it
// saves a retry. It reports whether delivery of a is over.
func (d *Dispatcher) record(a *Action, ans *Answer, attempts uint32) bool {
	if len(ans.Body) > MaxAnswerSize {
		c := *ans
		c.Body, c.Truncated = c.Body[:MaxAnswerSize], true
		ans = &c
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(d.ctx), 30*time.Second)
	defer cancel()
	_, err := d.j.answer(ctx, a.Key, ans, attempts)
	switch {
	case err == nil, errors.Is(err, ErrWrongState), errors.Is(err, ErrNotFound):
		return true // recorded, or settled elsewhere first
	case errors.Is(err, ErrClosed):
		return true // the next process fetches it again
	}
	d.log.Error("intents: recording an answer failed; the service will replay it", "key", a.Key, "err", err)
	return false
}

// giveUp turns a Uncertain: its deadline came without an answer.
func (d *Dispatcher) giveUp(a *Action, attempts uint32, last error) {
	why := fmt.Sprintf("deadline %s passed after %d attempts without an answer", a.Deadline.Format(time.RFC3339), attempts)
	if last != nil {
		why += ": " + last.Error()
	}
	u, err := d.j.uncertain(d.ctx, a.Key, why, attempts)
	if err != nil {
		if d.ctx.Err() == nil && !errors.Is(err, ErrWrongState) && !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrClosed) {
			d.log.Error("intents: recording an uncertain action failed", "key", a.Key, "err", err)
		}
		return
	}
	d.log.Warn("intents: action is uncertain", "key", a.Key, "target", a.Target, "operation", a.Operation, "why", why)
	if d.o.OnUncertain != nil {
		d.o.OnUncertain(d.ctx, u)
	}
}

// backoff is the wait after the n-th attempt failed with err: exponential
// from MinBackoff with full jitter, capped at MaxBackoff, and at least the
// service's Retry-After.
func (d *Dispatcher) backoff(n uint32, err error) time.Duration {
	ceil := d.o.MinBackoff
	for i := uint32(1); i < n && ceil < d.o.MaxBackoff; i++ {
		ceil *= 2 // at most MaxBackoff*2 <= 2*maxDuration: no overflow
	}
	ceil = min(ceil, d.o.MaxBackoff)
	w := d.o.MinBackoff + rand.N(ceil-d.o.MinBackoff+1)
	if h := retryAfter(err); h > w {
		w = h + rand.N(h/10+1)
	}
	return w
}
