// Package reconcile settles abandoned claims in the background: a
// Reconciler lists the unknown outcomes (receipts.DB.Scan with
// receipts.Filter{Abandoned: true}), takes each over, asks the user's Check
// whether its effect happened, and records the answer, as Do records fn's.
//
// Start one with New; Close stops it.
package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/internal/detach"
	"github.com/receiptstore/receipts/internal/private"
)

// Defaults and bounds of Options.
const (
	DefaultInterval    = time.Minute
	DefaultConcurrency = 4
	DefaultMaxBackoff  = time.Hour
	// MaxConcurrency bounds Options.Concurrency.
	MaxConcurrency = 1024
)

// Options configure a Reconciler.
type Options struct {
	// Check is the user's reconciliation: it asks the provider, by
	// l.ProviderKey() (the same for every attempt of the key), whether the
	// abandoned operation r's effect happened, and answers as
	// receipts.DB.Do's fn does:
	//   - nil: it happened; the result is committed as a Succeeded receipt,
	//     which every retry of the key then gets.
	//   - receipts.Permanent(err): a definitive failure, stored as a Failed
	//     receipt (its result is what Check returned, or err's text).
	//   - receipts.NotPerformed(err): no attempt's effect happened; the
	//     claim is forgotten (Lease.Forget) and the key is free.
	//   - any other error, or a panic: still unknown; the claim is abandoned
	//     again and checked again after a backoff.
	// Check runs under the lease, renewed in the background; its context
	// ends if the lease is lost or when the Reconciler or the DB closes
	// (the check then counts as unknown). Required.
	Check func(ctx context.Context, l *receipts.Lease, r *receipts.Receipt) ([]byte, error)
	// Scope limits the reconciler to one scope; "" means all.
	Scope string
	// Interval is the time between background passes (the first starts at
	// once). Zero means DefaultInterval; negative disables background
	// passes (call Reconciler.Run yourself); a positive value must be
	// between receipts.MinGCInterval (1ms) and receipts.MaxRetention.
	Interval time.Duration
	// Concurrency bounds the checks running at once. Zero means
	// DefaultConcurrency (4); at most MaxConcurrency.
	Concurrency int
	// MinBackoff is how long, by the store's clock (receipts.Options.Now),
	// a claim whose check was unknown waits before it is checked again;
	// each further unknown doubles it, up to MaxBackoff. Zero means the
	// Interval (DefaultInterval if background passes are off).
	MinBackoff time.Duration
	// MaxBackoff caps the backoff. Zero means DefaultMaxBackoff (1h), or
	// MinBackoff if that is longer; at most receipts.MaxRetention.
	MaxBackoff time.Duration
	// LeaseFor is the length of the leases the reconciler takes (see
	// receipts.LeaseFor); zero means receipts.Options.LeaseTTL.
	LeaseFor time.Duration
	// OnSettle, if set, is told of every claim the reconciler took over and
	// of what became of it. It may be called from several goroutines at
	// once, and must not block for long: a check's slot waits for it.
	OnSettle func(Settlement)
}

// Settlement is what a Reconciler did with one abandoned claim.
type Settlement struct {
	Key receipts.Key
	// Attempt is the attempt the reconciler made (its lease's, one more
	// than the abandoned claim's), 0 if it took nothing over.
	Attempt uint32
	Outcome Outcome
	// Receipt is the receipt written (Committed, Failed).
	Receipt *receipts.Receipt
	// Err is why: Check's error (Unknown, Forgotten, Failed), or the
	// store's (Skipped: receipts.ErrLeaseLost or *receipts.InProgressError;
	// Error).
	Err error
}

// Outcome is what became of an abandoned claim in a Reconciler pass.
type Outcome uint8

// Outcomes of a reconciliation.
const (
	// Committed: the effect had happened; a Succeeded receipt is stored.
	Committed Outcome = iota + 1
	// Failed: a definitive failure; a Failed receipt is stored.
	Failed
	// Forgotten: no attempt's effect happened; the key is free.
	Forgotten
	// Unknown: the check could not tell; the claim is abandoned again and
	// backs off.
	Unknown
	// Skipped: the claim was not taken over: another caller took it over,
	// settled it, or renewed its lease since it was listed.
	Skipped
	// Error: the store failed (the claim, if taken over, stays pending
	// until its lease runs out, then is listed again).
	Error
)

// String names the outcome.
func (o Outcome) String() string {
	switch o {
	case Committed:
		return "committed"
	case Failed:
		return "failed"
	case Forgotten:
		return "forgotten"
	case Unknown:
		return "unknown"
	case Skipped:
		return "skipped"
	case Error:
		return "error"
	}
	return fmt.Sprintf("Outcome(%d)", uint8(o))
}

// Stats counts what Reconciler passes did.
type Stats struct {
	Passes   int // passes run
	Listed   int // abandoned claims listed
	Deferred int // listed but still backing off: not checked
	Checked  int // Check calls (one per claim taken over)
	// By outcome.
	Committed, Failed, Forgotten, Unknown, Skipped, Errors int
	Duration                                               time.Duration // time spent in passes
}

func (s *Stats) add(o Stats) {
	s.Passes += o.Passes
	s.Listed += o.Listed
	s.Deferred += o.Deferred
	s.Checked += o.Checked
	s.Committed += o.Committed
	s.Failed += o.Failed
	s.Forgotten += o.Forgotten
	s.Unknown += o.Unknown
	s.Skipped += o.Skipped
	s.Errors += o.Errors
	s.Duration += o.Duration
}

func (s *Stats) count(o Outcome) {
	switch o {
	case Committed:
		s.Committed++
	case Failed:
		s.Failed++
	case Forgotten:
		s.Forgotten++
	case Unknown:
		s.Unknown++
	case Skipped:
		s.Skipped++
	default:
		s.Errors++
	}
}

// A Reconciler settles abandoned claims (the unknown outcomes
// receipts.DB.Scan lists with receipts.Filter{Abandoned: true}) without
// waiting for a client's retry: in each pass it lists them, takes each over
// as receipts.DB.TakeOver does (so that no other attempt can interleave),
// runs the user's Check under the lease, at most Concurrency at a time, and
// records what Check found. Claims whose check stays unknown back off.
// Several reconcilers, on one node or many, may run at once: each claim is
// taken over by one of them.
//
// Start one with New; Close stops it. The DB's Close stops it too (checks
// in flight see their context end).
type Reconciler struct {
	db      *receipts.DB
	opts    Options
	closing <-chan struct{}  // the DB's: closed when its Close starts
	now     func() time.Time // the DB's Options.Now (nil: the process's clock)
	logger  *slog.Logger     // the DB's Options.Logger

	stop     chan struct{} // closed by Close
	stopOnce sync.Once
	wg       sync.WaitGroup // the background loop
	runMu    sync.Mutex     // serializes passes

	mu      sync.Mutex // protects backoff and total
	backoff map[receipts.Key]backoff
	total   Stats
	closed  atomic.Bool
}

// backoff is a claim's state after unknown checks: not before next (store
// clock), and the delay that led there.
type backoff struct {
	next  time.Time
	delay time.Duration
}

// New starts a Reconciler of db's abandoned claims with opts (see Options;
// Check is required). It returns receipts.ErrInvalidOptions for options
// outside their bounds and receipts.ErrClosed after the DB's Close.
func New(db *receipts.DB, opts Options) (*Reconciler, error) {
	closing, err := enter(db)
	if err != nil {
		return nil, err
	}
	defer exit(db)
	o, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	dbo := db.Options()
	rc := &Reconciler{db: db, opts: o, closing: closing, now: dbo.Now, logger: dbo.Logger,
		stop: make(chan struct{}), backoff: map[receipts.Key]backoff{}}
	if o.LeaseFor != 0 {
		if err := checkLeaseFor(db, o.LeaseFor); err != nil {
			return nil, err
		}
	}
	if o.Interval > 0 {
		// Inside the gate: Close waits for its background goroutines only
		// after every call has left it, so this one is registered first.
		rc.wg.Add(1)
		background(db, rc.loop)
	}
	return rc, nil
}

func (o Options) resolve() (Options, error) {
	bad := func(format string, args ...any) (Options, error) {
		return o, fmt.Errorf("%w: reconcile.Options: "+format, append([]any{receipts.ErrInvalidOptions}, args...)...)
	}
	if o.Check == nil {
		return bad("Check is required")
	}
	if o.Interval == 0 {
		o.Interval = DefaultInterval
	}
	if o.Concurrency == 0 {
		o.Concurrency = DefaultConcurrency
	}
	if o.MinBackoff == 0 {
		o.MinBackoff = o.Interval
		if o.MinBackoff < 0 {
			o.MinBackoff = DefaultInterval
		}
	}
	if o.MaxBackoff == 0 {
		o.MaxBackoff = max(DefaultMaxBackoff, o.MinBackoff)
	}
	switch {
	case o.Interval > 0 && (o.Interval < receipts.MinGCInterval || o.Interval > receipts.MaxRetention):
		return bad("Interval %s must be negative, zero, or between %s and %s", o.Interval, receipts.MinGCInterval, receipts.MaxRetention)
	case o.Concurrency < 0 || o.Concurrency > MaxConcurrency:
		return bad("Concurrency %d must be between 1 and %d", o.Concurrency, MaxConcurrency)
	case o.MinBackoff < 0 || o.MinBackoff > receipts.MaxRetention:
		return bad("MinBackoff %s must be between 0 and %s", o.MinBackoff, receipts.MaxRetention)
	case o.MaxBackoff < o.MinBackoff || o.MaxBackoff > receipts.MaxRetention:
		return bad("MaxBackoff %s must be between MinBackoff %s and %s", o.MaxBackoff, o.MinBackoff, receipts.MaxRetention)
	case o.LeaseFor < 0:
		return bad("LeaseFor %s must not be negative", o.LeaseFor)
	case len(o.Scope) > receipts.MaxKeyPartLen:
		return bad("Scope of %d bytes is longer than %d", len(o.Scope), receipts.MaxKeyPartLen)
	}
	return o, nil
}

// Close stops the Reconciler: no new pass starts, checks in flight see
// their context end (their claims are abandoned again, unless settled
// first), and Close waits for the pass in progress. Idempotent.
func (rc *Reconciler) Close() error {
	rc.stopOnce.Do(func() {
		rc.closed.Store(true)
		close(rc.stop)
	})
	rc.wg.Wait()
	rc.runMu.Lock() // a Run in progress has ended
	defer rc.runMu.Unlock()
	return nil
}

// Stats returns the totals of every pass so far.
func (rc *Reconciler) Stats() Stats {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.total
}

func (rc *Reconciler) loop() {
	defer rc.wg.Done()
	t := time.NewTicker(rc.opts.Interval)
	defer t.Stop()
	for {
		if _, err := rc.Run(context.Background()); err != nil && !errors.Is(err, receipts.ErrClosed) {
			rc.logger.Warn("receipts: reconciler pass", "err", err)
		}
		select {
		case <-t.C:
		case <-rc.stop:
			return
		case <-rc.closing:
			return
		}
	}
}

// Run makes one pass now and returns what it did: it lists the abandoned
// claims (of Scope), skips those still backing off, and reconciles the
// others, at most Concurrency at a time, until all are done or ctx ends.
// Passes do not overlap: a Run waits for the one in progress. The error is
// the listing's (ctx, receipts.ErrClosed, the store's); what became of each
// claim is in the stats and OnSettle. After Close it returns
// receipts.ErrClosed.
func (rc *Reconciler) Run(ctx context.Context) (st Stats, err error) {
	rc.runMu.Lock()
	defer rc.runMu.Unlock()
	if rc.closed.Load() {
		return Stats{}, receipts.ErrClosed
	}
	start := time.Now()
	st = Stats{Passes: 1}
	defer func() { // st is named: Duration lands in the result
		st.Duration = time.Since(start)
		rc.mu.Lock()
		rc.total.add(st)
		rc.mu.Unlock()
	}()

	// The pass's context ends with ctx, Close, or the DB's Close.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-rc.stop:
		case <-rc.closing:
		case <-ctx.Done():
		}
		cancel()
	}()

	// List first, then work: writes move records, and a listing taken
	// while they happen could show a claim twice.
	var todo []*receipts.Receipt
	listed := map[receipts.Key]bool{}
	now := rc.clock()
	for r, err := range rc.db.Scan(ctx, receipts.Filter{Scope: rc.opts.Scope, Abandoned: true}) {
		if err != nil {
			return st, err
		}
		st.Listed++
		listed[r.Key] = true
		rc.mu.Lock()
		b, waiting := rc.backoff[r.Key]
		rc.mu.Unlock()
		if waiting && now.Before(b.next) {
			st.Deferred++
			continue
		}
		todo = append(todo, r)
	}
	rc.mu.Lock()
	for k := range rc.backoff { // claims no longer abandoned
		if !listed[k] {
			delete(rc.backoff, k)
		}
	}
	rc.mu.Unlock()

	var (
		wg  sync.WaitGroup
		mu  sync.Mutex // protects st below
		sem = make(chan struct{}, rc.opts.Concurrency)
	)
	for _, r := range todo {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			s := rc.reconcile(ctx, r)
			mu.Lock()
			if s.Attempt != 0 {
				st.Checked++
			}
			st.count(s.Outcome)
			mu.Unlock()
			if rc.opts.OnSettle != nil {
				rc.opts.OnSettle(s)
			}
		}()
	}
	wg.Wait()
	return st, nil
}

// reconcile takes r over, runs Check and records its answer. It holds the
// DB's in-flight gate throughout, so the DB's Close waits for it (and ends
// Check's context first, through the pass's context).
func (rc *Reconciler) reconcile(ctx context.Context, r *receipts.Receipt) Settlement {
	db := rc.db
	s := Settlement{Key: r.Key}
	if _, err := enter(db); err != nil {
		s.Outcome, s.Err = Error, err
		return s
	}
	defer exit(db)
	l, err := takeOver(ctx, db, r, rc.opts.LeaseFor)
	if err != nil {
		s.Outcome, s.Err = Error, err
		if errors.Is(err, receipts.ErrLeaseLost) || errors.Is(err, receipts.ErrInProgress) {
			s.Outcome = Skipped
		}
		return s
	}
	s.Attempt = l.Attempt()

	detached := detach.Context(ctx)
	result, cerr := rc.check(ctx, l, r)
	// Check's NotPerformed means no attempt's effect happened: the key is
	// forgotten, not released (a release would keep it Recovered).
	o := conclude(detached, l, result, cerr)
	s.Receipt, s.Err = o.receipt, cerr
	switch o.verdict {
	case private.VerdictCommit:
		s.Outcome = Committed
	case private.VerdictFail:
		s.Outcome = Failed
	case private.VerdictRelease:
		s.Outcome = Forgotten
	default:
		rc.backOff(r.Key)
		s.Outcome = Unknown
		if o.unknown != nil { // a result it cannot record
			s.Err = o.unknown
		}
		if o.err != nil {
			s.Outcome, s.Err = Error, fmt.Errorf("%w (after the check: %w)", o.err, cerr)
		}
		return s
	}
	if o.err != nil {
		s.Outcome, s.Receipt, s.Err = Error, nil, o.err
		return s
	}
	rc.clear(r.Key)
	return s
}

// check runs Check under l, renewed in the background; a panic is an
// unknown outcome.
func (rc *Reconciler) check(ctx context.Context, l *receipts.Lease, r *receipts.Receipt) (result []byte, err error) {
	cctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	defer keepAlive(l, cancel)()
	defer func() {
		if p := recover(); p != nil {
			result, err = nil, fmt.Errorf("receipts: reconciler check of %s panicked: %v", rc.db.KeyName(r.Key), p)
		}
	}()
	return rc.opts.Check(cctx, l, r)
}

// backOff doubles k's backoff (from MinBackoff, up to MaxBackoff).
func (rc *Reconciler) backOff(k receipts.Key) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	b := rc.backoff[k]
	b.delay = min(max(2*b.delay, rc.opts.MinBackoff), rc.opts.MaxBackoff)
	b.next = rc.clock().Add(b.delay)
	rc.backoff[k] = b
}

// clock is the store's clock that backoffs are measured by (the root's
// DB.clock): Options.Now, or the process's clock when an engine keeps its
// own.
func (rc *Reconciler) clock() time.Time {
	if rc.now != nil {
		return rc.now()
	}
	return time.Now()
}

// clear forgets k's backoff.
func (rc *Reconciler) clear(k receipts.Key) {
	rc.mu.Lock()
	delete(rc.backoff, k)
	rc.mu.Unlock()
}
