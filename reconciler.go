package receipts

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/receiptstore/receipts/internal/detach"
)

// Defaults and bounds of ReconcilerOptions.
const (
	DefaultReconcileInterval    = time.Minute
	DefaultReconcileConcurrency = 4
	DefaultReconcileMaxBackoff  = time.Hour
	// MaxReconcileConcurrency bounds ReconcilerOptions.Concurrency.
	MaxReconcileConcurrency = 1024
)

// ReconcilerOptions configure a Reconciler.
type ReconcilerOptions struct {
	// Check is the user's reconciliation: it asks the provider, by
	// l.ProviderKey() (the same for every attempt of the key), whether the
	// abandoned operation r's effect happened, and answers as Do's fn does:
	//   - nil: it happened; the result is committed as a Succeeded receipt,
	//     which every retry of the key then gets.
	//   - Permanent(err): a definitive failure, stored as a Failed receipt
	//     (its result is what Check returned, or err's text).
	//   - NotPerformed(err): no attempt's effect happened; the claim is
	//     forgotten (Lease.Forget) and the key is free.
	//   - any other error, or a panic: still unknown; the claim is abandoned
	//     again and checked again after a backoff.
	// Check runs under the lease, renewed in the background; its context
	// ends if the lease is lost or when the Reconciler or the DB closes
	// (the check then counts as unknown). Required.
	Check func(ctx context.Context, l *Lease, r *Receipt) ([]byte, error)
	// Scope limits the reconciler to one scope; "" means all.
	Scope string
	// Interval is the time between background passes (the first starts at
	// once). Zero means DefaultReconcileInterval; negative disables
	// background passes (call Reconciler.Run yourself); a positive value
	// must be between MinGCInterval (1ms) and MaxRetention.
	Interval time.Duration
	// Concurrency bounds the checks running at once. Zero means
	// DefaultReconcileConcurrency (4); at most MaxReconcileConcurrency.
	Concurrency int
	// MinBackoff is how long, by the store's clock (Options.Now), a claim
	// whose check was unknown waits before it is checked again; each
	// further unknown doubles it, up to MaxBackoff. Zero means the
	// Interval (DefaultReconcileInterval if background passes are off).
	MinBackoff time.Duration
	// MaxBackoff caps the backoff. Zero means DefaultReconcileMaxBackoff
	// (1h), or MinBackoff if that is longer; at most MaxRetention.
	MaxBackoff time.Duration
	// LeaseFor is the length of the leases the reconciler takes (see
	// LeaseFor); zero means Options.LeaseTTL.
	LeaseFor time.Duration
	// OnSettle, if set, is told of every claim the reconciler took over and
	// of what became of it. It may be called from several goroutines at
	// once, and must not block for long: a check's slot waits for it.
	OnSettle func(Settlement)
}

// Settlement is what a Reconciler did with one abandoned claim.
type Settlement struct {
	Key Key
	// Attempt is the attempt the reconciler made (its lease's, one more
	// than the abandoned claim's), 0 if it took nothing over.
	Attempt uint32
	Outcome SettleOutcome
	// Receipt is the receipt written (ReconcileCommitted, ReconcileFailed).
	Receipt *Receipt
	// Err is why: Check's error (ReconcileUnknown, ReconcileForgotten,
	// ReconcileFailed), or the store's (ReconcileSkipped: ErrLeaseLost or
	// *InProgressError; ReconcileError).
	Err error
}

// SettleOutcome is what became of an abandoned claim in a Reconciler pass.
type SettleOutcome uint8

// Outcomes of a reconciliation.
const (
	// ReconcileCommitted: the effect had happened; a Succeeded receipt is
	// stored.
	ReconcileCommitted SettleOutcome = iota + 1
	// ReconcileFailed: a definitive failure; a Failed receipt is stored.
	ReconcileFailed
	// ReconcileForgotten: no attempt's effect happened; the key is free.
	ReconcileForgotten
	// ReconcileUnknown: the check could not tell; the claim is abandoned
	// again and backs off.
	ReconcileUnknown
	// ReconcileSkipped: the claim was not taken over: another caller took it
	// over, settled it, or renewed its lease since it was listed.
	ReconcileSkipped
	// ReconcileError: the store failed (the claim, if taken over, stays
	// pending until its lease runs out, then is listed again).
	ReconcileError
)

// String names the outcome.
func (o SettleOutcome) String() string {
	switch o {
	case ReconcileCommitted:
		return "committed"
	case ReconcileFailed:
		return "failed"
	case ReconcileForgotten:
		return "forgotten"
	case ReconcileUnknown:
		return "unknown"
	case ReconcileSkipped:
		return "skipped"
	case ReconcileError:
		return "error"
	}
	return fmt.Sprintf("SettleOutcome(%d)", uint8(o))
}

// ReconcileStats counts what Reconciler passes did.
type ReconcileStats struct {
	Passes   int // passes run
	Listed   int // abandoned claims listed
	Deferred int // listed but still backing off: not checked
	Checked  int // Check calls (one per claim taken over)
	// By outcome.
	Committed, Failed, Forgotten, Unknown, Skipped, Errors int
	Duration                                               time.Duration // time spent in passes
}

func (s *ReconcileStats) add(o ReconcileStats) {
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

func (s *ReconcileStats) count(o SettleOutcome) {
	switch o {
	case ReconcileCommitted:
		s.Committed++
	case ReconcileFailed:
		s.Failed++
	case ReconcileForgotten:
		s.Forgotten++
	case ReconcileUnknown:
		s.Unknown++
	case ReconcileSkipped:
		s.Skipped++
	default:
		s.Errors++
	}
}

// A Reconciler settles abandoned claims (the unknown outcomes Scan lists
// with Filter{Abandoned: true}) without waiting for a client's retry: in
// each pass it lists them, takes each over with DB.TakeOver (so that no
// other attempt can interleave), runs the user's Check under the lease, at
// most Concurrency at a time, and records what Check found. Claims whose
// check stays unknown back off. Several reconcilers, on one node or many,
// may run at once: each claim is taken over by one of them.
//
// Start one with DB.NewReconciler; Close stops it. DB.Close stops it too
// (checks in flight see their context end).
type Reconciler struct {
	db   *DB
	opts ReconcilerOptions
	ttl  []ClaimOption // LeaseFor, if set

	stop     chan struct{} // closed by Close
	stopOnce sync.Once
	wg       sync.WaitGroup // the background loop
	runMu    sync.Mutex     // serializes passes

	mu      sync.Mutex // protects backoff and total
	backoff map[Key]backoff
	total   ReconcileStats
	closed  atomic.Bool
}

// backoff is a claim's state after unknown checks: not before next (store
// clock), and the delay that led there.
type backoff struct {
	next  time.Time
	delay time.Duration
}

// NewReconciler starts a Reconciler of db's abandoned claims with opts
// (see ReconcilerOptions; Check is required). It returns ErrInvalidOptions
// for options outside their bounds and ErrClosed after Close.
func (db *DB) NewReconciler(opts ReconcilerOptions) (*Reconciler, error) {
	if err := db.enter(); err != nil {
		return nil, err
	}
	defer db.exit()
	o, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	rc := &Reconciler{db: db, opts: o, stop: make(chan struct{}), backoff: map[Key]backoff{}}
	if o.LeaseFor != 0 {
		rc.ttl = []ClaimOption{LeaseFor(o.LeaseFor)}
		if _, err := db.leaseTTL(&claimConfig{ttlSet: true, ttl: o.LeaseFor}); err != nil {
			return nil, err
		}
	}
	if o.Interval > 0 {
		// Inside the gate: Close waits for db.bg only after every call
		// has left it, so this Add comes before that Wait.
		db.bg.Add(1)
		rc.wg.Add(1)
		go rc.loop()
	}
	return rc, nil
}

func (o ReconcilerOptions) resolve() (ReconcilerOptions, error) {
	bad := func(format string, args ...any) (ReconcilerOptions, error) {
		return o, fmt.Errorf("%w: ReconcilerOptions: "+format, append([]any{ErrInvalidOptions}, args...)...)
	}
	if o.Check == nil {
		return bad("Check is required")
	}
	if o.Interval == 0 {
		o.Interval = DefaultReconcileInterval
	}
	if o.Concurrency == 0 {
		o.Concurrency = DefaultReconcileConcurrency
	}
	if o.MinBackoff == 0 {
		o.MinBackoff = o.Interval
		if o.MinBackoff < 0 {
			o.MinBackoff = DefaultReconcileInterval
		}
	}
	if o.MaxBackoff == 0 {
		o.MaxBackoff = max(DefaultReconcileMaxBackoff, o.MinBackoff)
	}
	switch {
	case o.Interval > 0 && (o.Interval < MinGCInterval || o.Interval > MaxRetention):
		return bad("Interval %s must be negative, zero, or between %s and %s", o.Interval, MinGCInterval, MaxRetention)
	case o.Concurrency < 0 || o.Concurrency > MaxReconcileConcurrency:
		return bad("Concurrency %d must be between 1 and %d", o.Concurrency, MaxReconcileConcurrency)
	case o.MinBackoff < 0 || o.MinBackoff > MaxRetention:
		return bad("MinBackoff %s must be between 0 and %s", o.MinBackoff, MaxRetention)
	case o.MaxBackoff < o.MinBackoff || o.MaxBackoff > MaxRetention:
		return bad("MaxBackoff %s must be between MinBackoff %s and %s", o.MaxBackoff, o.MinBackoff, MaxRetention)
	case o.LeaseFor < 0:
		return bad("LeaseFor %s must not be negative", o.LeaseFor)
	case len(o.Scope) > MaxKeyPartLen:
		return bad("Scope of %d bytes is longer than %d", len(o.Scope), MaxKeyPartLen)
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
func (rc *Reconciler) Stats() ReconcileStats {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.total
}

func (rc *Reconciler) loop() {
	defer rc.db.bg.Done()
	defer rc.wg.Done()
	t := time.NewTicker(rc.opts.Interval)
	defer t.Stop()
	for {
		if _, err := rc.Run(context.Background()); err != nil && !errors.Is(err, ErrClosed) {
			rc.db.opts.Logger.Warn("receipts: reconciler pass", "err", err)
		}
		select {
		case <-t.C:
		case <-rc.stop:
			return
		case <-rc.db.closing:
			return
		}
	}
}

// Run makes one pass now and returns what it did: it lists the abandoned
// claims (of Scope), skips those still backing off, and reconciles the
// others, at most Concurrency at a time, until all are done or ctx ends.
// Passes do not overlap: a Run waits for the one in progress. The error is
// the listing's (ctx, ErrClosed, the store's); what became of each claim
// is in the stats and OnSettle. After Close it returns ErrClosed.
func (rc *Reconciler) Run(ctx context.Context) (st ReconcileStats, err error) {
	rc.runMu.Lock()
	defer rc.runMu.Unlock()
	if rc.closed.Load() {
		return ReconcileStats{}, ErrClosed
	}
	start := time.Now()
	st = ReconcileStats{Passes: 1}
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
		case <-rc.db.closing:
		case <-ctx.Done():
		}
		cancel()
	}()

	// List first, then work: writes move records, and a listing taken
	// while they happen could show a claim twice.
	var todo []*Receipt
	listed := map[Key]bool{}
	now := rc.db.clock()
	for r, err := range rc.db.Scan(ctx, Filter{Scope: rc.opts.Scope, Abandoned: true}) {
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
func (rc *Reconciler) reconcile(ctx context.Context, r *Receipt) Settlement {
	db := rc.db
	s := Settlement{Key: r.Key}
	if err := db.enter(); err != nil {
		s.Outcome, s.Err = ReconcileError, err
		return s
	}
	defer db.exit()
	l, err := db.takeOver(ctx, r, claimOptions(rc.ttl))
	if err != nil {
		s.Outcome, s.Err = ReconcileError, err
		if errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrInProgress) {
			s.Outcome = ReconcileSkipped
		}
		return s
	}
	s.Attempt = l.Attempt()

	detached := detach.Context(ctx)
	result, cerr := rc.check(ctx, l, r)
	// Check's NotPerformed means no attempt's effect happened: the key is
	// forgotten, not released (a release would keep it Recovered).
	o := l.conclude(detached, result, cerr, l.forget)
	s.Receipt, s.Err = o.receipt, cerr
	switch o.verdict {
	case verdictCommit:
		s.Outcome = ReconcileCommitted
	case verdictFail:
		s.Outcome = ReconcileFailed
	case verdictRelease:
		s.Outcome = ReconcileForgotten
	default:
		rc.backOff(r.Key)
		s.Outcome = ReconcileUnknown
		if o.why != "" { // a result it cannot record
			s.Err = l.outcomeUnknown(o.why, cerr)
		}
		if o.err != nil {
			s.Outcome, s.Err = ReconcileError, fmt.Errorf("%w (after the check: %w)", o.err, cerr)
		}
		return s
	}
	if o.err != nil {
		s.Outcome, s.Receipt, s.Err = ReconcileError, nil, o.err
		return s
	}
	rc.clear(r.Key)
	return s
}

// check runs Check under l, renewed in the background; a panic is an
// unknown outcome.
func (rc *Reconciler) check(ctx context.Context, l *Lease, r *Receipt) (result []byte, err error) {
	cctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	defer l.keepAlive(cancel, false).stop()
	defer func() {
		if p := recover(); p != nil {
			result, err = nil, fmt.Errorf("receipts: reconciler check of %s panicked: %v", l.db.keyName(r.Key), p)
		}
	}()
	return rc.opts.Check(cctx, l, r)
}

// backOff doubles k's backoff (from MinBackoff, up to MaxBackoff).
func (rc *Reconciler) backOff(k Key) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	b := rc.backoff[k]
	b.delay = min(max(2*b.delay, rc.opts.MinBackoff), rc.opts.MaxBackoff)
	b.next = rc.db.clock().Add(b.delay)
	rc.backoff[k] = b
}

// clear forgets k's backoff.
func (rc *Reconciler) clear(k Key) {
	rc.mu.Lock()
	delete(rc.backoff, k)
	rc.mu.Unlock()
}
