package intents

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"time"
)

// Defaults of DispatcherOptions.
const (
	DefaultConcurrency    = 16
	DefaultAttemptTimeout = 30 * time.Second
	DefaultMinBackoff     = 100 * time.Millisecond
	DefaultMaxBackoff     = 30 * time.Second
	DefaultLeaseMargin    = 5 * time.Second
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
	// HostName names this Dispatcher in the journal: the holder of the
	// delivery leases it takes (Action.Holder, receiptctl actions), at
	// most MaxFieldLen bytes. Dispatchers that run at the same time on one
	// journal need different names; a second live Dispatcher with the
	// same name in this process is refused (ErrHostNameInUse). A host
	// that restarts under the same name takes its own leases back at once.
	// Default: the machine's host name and the process id, "web-1:4711"
	// ("web-1:4711/2", "/3"... for more Dispatchers in the process).
	HostName string
	// LeaseMargin is how long a delivery lease outlasts what its holder is
	// doing: its attempt in flight (at most AttemptTimeout) or its wait
	// before the next attempt. If the host dies, another host takes the
	// action over that long after the attempt would have timed out or the
	// wait would have ended. It also absorbs the hosts' clock skew, which
	// should stay well below it. Default DefaultLeaseMargin.
	LeaseMargin time.Duration
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
// Several Dispatchers may share a journal (several hosts on PostgreSQL, or
// several Dispatchers on one Journal): at most one delivers an action at a
// time, under a lease in the journal that it claims atomically before each
// attempt and holds through the attempt and its wait before the next one
// (see DispatcherOptions.LeaseMargin). A host that dies is replaced when
// its lease ends; Close releases the leases at once. Every delivery by
// every host is counted in Action.Attempts. The key keeps a second
// delivery (hosts whose clocks disagree, a lease that ran out during a
// slow attempt) from being a second effect; the first answer recorded
// wins.
type Dispatcher struct {
	j    *Journal
	o    DispatcherOptions
	host string // the holder name of its leases
	log  *slog.Logger
	sem  chan struct{} // one token per attempt in flight

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex      // protects active
	active map[string]bool // keys this Dispatcher is delivering

	closeOnce sync.Once
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
	if opts.LeaseMargin == 0 {
		opts.LeaseMargin = DefaultLeaseMargin
	}
	switch {
	case opts.Concurrency < 0:
		return nil, bad(fmt.Errorf("intents: DispatcherOptions.Concurrency %d < 0", opts.Concurrency))
	case opts.AttemptTimeout < 0 || opts.AttemptTimeout > maxDuration:
		return nil, bad(fmt.Errorf("intents: DispatcherOptions.AttemptTimeout %s out of (0, %s]", opts.AttemptTimeout, maxDuration))
	case opts.MinBackoff < 0 || opts.MaxBackoff < opts.MinBackoff || opts.MaxBackoff > maxDuration:
		return nil, bad(fmt.Errorf("intents: DispatcherOptions backoff %s..%s: want 0 < MinBackoff <= MaxBackoff <= %s", opts.MinBackoff, opts.MaxBackoff, maxDuration))
	case opts.LeaseMargin < 0 || opts.LeaseMargin > maxDuration:
		return nil, bad(fmt.Errorf("intents: DispatcherOptions.LeaseMargin %s out of (0, %s]", opts.LeaseMargin, maxDuration))
	case len(opts.HostName) > MaxFieldLen:
		return nil, bad(fmt.Errorf("%w: DispatcherOptions.HostName of %d bytes (max %d)", ErrTooLong, len(opts.HostName), MaxFieldLen))
	}
	host, err := takeHostName(opts.HostName)
	if err != nil {
		return nil, err
	}
	log := opts.Logger
	if log == nil {
		log = j.opts.Logger
	}
	ctx, cancel := context.WithCancel(context.Background())
	d := &Dispatcher{j: j, o: opts, host: host, log: log, sem: make(chan struct{}, opts.Concurrency),
		ctx: ctx, cancel: cancel, active: map[string]bool{}}
	j.addHost(host)
	d.wg.Add(1)
	go d.loop()
	return d, nil
}

// Close stops delivery and waits for the Dispatcher's goroutines. Actions
// in delivery stay Approved, with their keys, and their leases are
// released: another Dispatcher (or the next one) resumes them at once. An
// answer that has arrived is still recorded. A second Close returns nil.
func (d *Dispatcher) Close() error {
	d.cancel()
	d.wg.Wait()
	d.closeOnce.Do(func() {
		d.j.dropHost(d.host)
		dropHostName(d.host)
	})
	return nil
}

// HostName returns the name the Dispatcher holds its leases under
// (DispatcherOptions.HostName, or the default it made).
func (d *Dispatcher) HostName() string { return d.host }

// hostNames are the HostNames of this process's open Dispatchers.
var hostNames = struct {
	sync.Mutex
	live map[string]bool
	n    int // default names made
}{live: map[string]bool{}}

// takeHostName reserves name for a new Dispatcher, or makes the default.
func takeHostName(name string) (string, error) {
	hostNames.Lock()
	defer hostNames.Unlock()
	if name != "" {
		if hostNames.live[name] {
			return "", bad(fmt.Errorf("%w: %q", ErrHostNameInUse, name))
		}
		hostNames.live[name] = true
		return name, nil
	}
	h, err := os.Hostname()
	if err != nil || h == "" {
		h = "host"
	}
	base := fmt.Sprintf("%s:%d", h, os.Getpid())
	for {
		hostNames.n++
		name = base
		if hostNames.n > 1 {
			name = fmt.Sprintf("%s/%d", base, hostNames.n)
		}
		if !hostNames.live[name] {
			hostNames.live[name] = true
			return name, nil
		}
	}
}

func dropHostName(name string) {
	hostNames.Lock()
	defer hostNames.Unlock()
	delete(hostNames.live, name)
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

// scan starts a delivery of each Approved action that no other host
// holds a lease on (the claim before each attempt decides).
func (d *Dispatcher) scan() {
	now := d.j.Now()
	for a, err := range d.j.List(d.ctx, Approved) {
		if err != nil {
			if d.ctx.Err() == nil && !errors.Is(err, ErrClosed) {
				d.log.Error("intents: listing approved actions failed", "err", err)
			}
			return
		}
		if !d.j.free(a, d.host, now) {
			continue // another host delivers it; looked at again after its lease
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

// deliver delivers the action key until it is answered, turns Uncertain,
// another host takes it over, or d closes.
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
	if err != nil || a.State != Approved || !d.j.free(a, d.host, d.j.Now()) {
		return
	}
	held := false // d may hold a lease on it: release it when leaving
	defer func() {
		if held {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(d.ctx), 5*time.Second)
			defer cancel()
			if err := d.j.release(ctx, key, d.host); err != nil && !errors.Is(err, ErrClosed) {
				d.log.Warn("intents: releasing a delivery lease failed; it ends on its own", "key", key, "err", err)
			}
		}
	}()
	var last error
	for {
		if !a.Deadline.After(d.j.Now()) {
			d.giveUp(a, last)
			held = false // Uncertain, or another host's
			return
		}
		tr := d.o.Transports[a.Target]
		var ans *Answer
		var err error
		if tr == nil {
			// Not this host's to deliver, and maybe another's: no lease.
			err = fmt.Errorf("%w %q", ErrNoTransport, a.Target)
		} else {
			var claimed *Action
			claimed, ans, err = d.attempt(tr, a)
			if claimed == nil {
				switch {
				case err == nil: // its deadline passed while it waited
					continue
				case errors.Is(err, errHeld), errors.Is(err, ErrWrongState), errors.Is(err, ErrNotFound),
					errors.Is(err, ErrClosed), d.ctx.Err() != nil:
					return // another host has it, it was settled, or d closes
				}
				// The journal failed: wait, and claim it again.
			} else {
				a, held = claimed, true
			}
		}
		if d.ctx.Err() != nil && ans == nil {
			return // closing: the action stays Approved, its lease released
		}
		if err == nil {
			if !ans.State.Answered() {
				err = fmt.Errorf("intents: transport for %q answered %v, not an answer", a.Target, ans.State)
			} else if d.record(a, ans) {
				held = false
				return
			} else {
				err = errors.New("intents: recording the answer failed")
			}
		}
		// An attempt that the deadline cut while it waited for its reply learned nothing: the
		// action turns Uncertain with the last thing the service did say (a 503 naming the
		// step that was uncertain, say), not with the cut.
		if last == nil || !errors.Is(err, context.DeadlineExceeded) || a.Deadline.After(d.j.Now()) {
			last = err
		}
		d.log.Debug("intents: attempt got no answer", "key", a.Key, "target", a.Target, "attempt", a.Attempts, "err", err)
		wait := min(d.backoff(a.Attempts, err), a.Deadline.Sub(d.j.Now()))
		var until time.Time
		if held {
			// Hold it through the wait: no other host sends it sooner
			// than this one would (a Retry-After binds them all).
			until = d.j.Now().Add(max(wait, 0) + d.o.LeaseMargin)
		}
		if err := d.j.attempted(d.ctx, a.Key, d.host, err.Error(), uncertainStep(err), until); err != nil {
			if errors.Is(err, errHeld) || errors.Is(err, ErrWrongState) || errors.Is(err, ErrNotFound) {
				held = false
				return // taken over, or settled elsewhere (another host, a person)
			}
			if d.ctx.Err() != nil || errors.Is(err, ErrClosed) {
				return
			}
			d.log.Warn("intents: recording an attempt failed", "key", a.Key, "err", err)
		}
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

// attempt claims a's lease, counting the delivery, and sends it once,
// holding a concurrency token. It returns the claimed action (nil when the
// claim failed, or a's deadline passed while it waited for a token), and
// the transport's answer or error.
func (d *Dispatcher) attempt(tr Transport, a *Action) (*Action, *Answer, error) {
	select {
	case d.sem <- struct{}{}:
	case <-d.ctx.Done():
		return nil, nil, d.ctx.Err()
	}
	defer func() { <-d.sem }()
	now := d.j.Now()
	timeout := min(a.Deadline.Sub(now), d.o.AttemptTimeout)
	if timeout <= 0 {
		return nil, nil, nil
	}
	claimed, err := d.j.claim(d.ctx, a.Key, d.host, now.Add(timeout+d.o.LeaseMargin))
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithTimeout(d.ctx, timeout)
	defer cancel()
	ans, err := tr.Deliver(ctx, claimed.clone())
	return claimed, ans, err
}

// record records ans, also while d closes: it arrived, and recording it
// saves a retry. It reports whether delivery of a is over.
func (d *Dispatcher) record(a *Action, ans *Answer) bool {
	if len(ans.Body) > MaxAnswerSize {
		c := *ans
		c.Body, c.Truncated = c.Body[:MaxAnswerSize], true
		ans = &c
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(d.ctx), 30*time.Second)
	defer cancel()
	_, err := d.j.answer(ctx, a.Key, ans)
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
func (d *Dispatcher) giveUp(a *Action, last error) {
	why := fmt.Sprintf("deadline %s passed after %d attempts without an answer", a.Deadline.Format(time.RFC3339), a.Attempts)
	if last != nil {
		why += ": " + last.Error()
	}
	u, err := d.j.uncertain(d.ctx, a.Key, d.host, why, uncertainStep(last))
	if err != nil {
		if d.ctx.Err() == nil && !errors.Is(err, ErrWrongState) && !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrClosed) && !errors.Is(err, errHeld) {
			d.log.Error("intents: recording an uncertain action failed", "key", a.Key, "err", err)
		}
		return
	}
	d.log.Warn("intents: action is uncertain", "key", a.Key, "target", a.Target, "operation", a.Operation, "step", u.UncertainStep, "why", why)
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
