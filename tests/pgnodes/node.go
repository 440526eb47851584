package pgnodes

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/receiptstore/receipts"
)

// OpenFunc opens one node's view of the shared store named by dsn (a PostgreSQL DSN, or a
// directory for the Pebble engine). The closer, if not nil, is closed after the DB (a pool).
type OpenFunc func(ctx context.Context, dsn string) (*receipts.DB, io.Closer, error)

// Scope is the scope of every key of the harness.
const Scope = "pgnodes"

// Fingerprint is the fingerprint of every operation of the harness.
var Fingerprint = []byte("fp")

// Workload shapes what a node's workers do.
type Workload struct {
	Workers   int           // per node (8)
	Keys      int           // width of the window of live keys (small: conflicts, waits, takeovers)
	Slide     time.Duration // the window moves on by two keys every Slide
	Start     time.Time     // common origin of the window, the same on every node
	TTL       time.Duration // the store's LeaseTTL (stale holders sleep past it)
	OpTimeout time.Duration // bound of one operation (waits included)
}

// Node is one incarnation of a node process running the workload.
type Node struct {
	DB       *receipts.DB
	Inc      string // "n<node>g<gen>"
	Dir      string // the run directory (logs)
	Seed     uint64
	Workload Workload

	hist     *Log
	provider *Provider
	seq      atomic.Uint64
	failed   atomic.Pointer[error]
}

// Errors a worker's fn returns on purpose.
var (
	errNothing = errors.New("pgnodes: nothing done")    // wrapped in NotPerformed
	errUnknown = errors.New("pgnodes: outcome unknown") // the effect happened, the caller says it does not know
	errDecline = errors.New("pgnodes: declined")        // wrapped in Permanent
)

// op modes.
type mode uint8

const (
	modeDo        mode = iota // Do; fn performs the effect and returns its result
	modeRelease               // Do; fn does nothing and returns NotPerformed
	modeAbandon               // Do; fn performs the effect and returns an unknown-outcome error
	modeFail                  // Do; fn performs the effect and returns Permanent
	modeClaim                 // Claim without waiting: conflicts, replays; a lease is committed by hand
	modeClaimWait             // Claim(WaitForResult)
	modeStale                 // Claim, effect, sleep past the TTL without renewing, then Commit (fenced)
	modeLookup                // Lookup
)

func pickMode(r int) mode {
	switch {
	case r < 50:
		return modeDo
	case r < 56:
		return modeRelease
	case r < 62:
		return modeAbandon
	case r < 66:
		return modeFail
	case r < 78:
		return modeClaim
	case r < 83:
		return modeClaimWait
	case r < 95:
		return modeStale
	}
	return modeLookup
}

func now() int64 { return time.Now().UnixNano() }

func stateName(s receipts.State) string {
	switch s {
	case receipts.Succeeded:
		return "S"
	case receipts.Failed:
		return "F"
	case receipts.Pending:
		return "P"
	}
	return "?"
}

// Run runs the workers until ctx ends, then waits for them. It returns the first error of the
// harness itself (a log that cannot be written), never an error of the store.
func (n *Node) Run(ctx context.Context) error {
	var err error
	if n.hist, err = OpenLog(filepath.Join(n.Dir, histPrefix+n.Inc+".log")); err != nil {
		return err
	}
	defer n.hist.Close()
	if n.provider, err = OpenProvider(n.Dir); err != nil {
		return err
	}
	defer n.provider.Close()
	var wg sync.WaitGroup
	for w := range n.Workload.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n.worker(ctx, w)
		}()
	}
	wg.Wait()
	if p := n.failed.Load(); p != nil {
		return *p
	}
	return nil
}

func (n *Node) fail(err error) {
	n.failed.CompareAndSwap(nil, &err)
}

func (n *Node) log(ev Event, sync bool) {
	ev.Inc = n.Inc
	if err := n.hist.Append(ev, sync); err != nil {
		n.fail(err)
	}
}

// key picks a key of the live window: the window's position depends only on the time since
// Workload.Start, so every node works on the same few keys at the same time.
func (n *Node) key(rng *rand.Rand) string {
	base := 2 * int(time.Since(n.Workload.Start)/n.Workload.Slide)
	if rng.IntN(5) == 0 {
		// A key from the recent past: claims left by killed nodes get taken over (Recovered)
		// while the run goes on, not only by the final settle pass.
		return fmt.Sprintf("k%d", max(0, base-rng.IntN(10*n.Workload.Keys)))
	}
	return fmt.Sprintf("k%d", base+rng.IntN(n.Workload.Keys))
}

func (n *Node) worker(ctx context.Context, w int) {
	rng := rand.New(rand.NewPCG(n.Seed, uint64(w)))
	for ctx.Err() == nil && n.failed.Load() == nil {
		id := fmt.Sprintf("%sw%do%d", n.Inc, w, n.seq.Add(1))
		n.one(ctx, rng, id, n.key(rng), pickMode(rng.IntN(100)))
		// Think time: keeps two shared cores usable and lets leases run out now and then.
		time.Sleep(time.Duration(1+rng.IntN(4)) * time.Millisecond)
	}
}

// one runs one operation and logs what it was told.
func (n *Node) one(ctx context.Context, rng *rand.Rand, id, key string, m mode) {
	ctx, cancel := context.WithTimeout(ctx, n.Workload.OpTimeout)
	defer cancel()
	k := receipts.Key{Scope: Scope, ID: key}
	call := now()
	switch m {
	case modeLookup:
		r, err := n.DB.Lookup(ctx, k)
		n.outcome(id, key, "lookup", call, r, err)
	case modeClaim, modeClaimWait, modeStale:
		var opts []receipts.ClaimOption
		if m == modeClaimWait {
			opts = append(opts, receipts.WaitForResult())
		}
		l, r, err := n.DB.Claim(ctx, k, Fingerprint, opts...)
		if l == nil {
			n.outcome(id, key, "claim", call, r, err)
			return
		}
		n.grant(id, call, l)
		hold := time.Duration(0)
		if m == modeStale && !l.Recovered() {
			hold = n.Workload.TTL * 13 / 10 // past the lease, no renewal: a takeover fences it out
		}
		res, ferr := n.act(rng, id, l, modeDo, hold)
		n.fnEnd(id, l, res, ferr)
		var rc *receipts.Receipt
		if ferr == nil {
			rc, err = l.Commit(context.WithoutCancel(ctx), res)
		} else {
			err = l.Release(context.WithoutCancel(ctx))
			if err == nil {
				err = receipts.NotPerformed(ferr)
			}
		}
		n.outcome(id, key, "commit", call, rc, err)
	default:
		r, err := n.DB.Do(ctx, k, Fingerprint, func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
			n.grant(id, call, l)
			hold := time.Duration(0)
			if rng.IntN(50) == 0 {
				hold = time.Duration(50+rng.IntN(300)) * time.Millisecond // others wait
			}
			res, ferr := n.act(rng, id, l, m, hold)
			n.fnEnd(id, l, res, ferr)
			return res, ferr
		})
		n.outcome(id, key, "do", call, r, err)
	}
}

func (n *Node) grant(id string, call int64, l *receipts.Lease) {
	n.log(Event{Kind: KindGrant, Op: id, Key: l.Key().ID, Token: l.Token(), Attempt: l.Attempt(), Recovered: l.Recovered(),
		PK: l.ProviderKey(), Call: call, Ret: now()}, false)
}

// act is the body of an attempt: reconcile if the lease is Recovered, else perform the effect.
// It returns the result to record and fn's error.
func (n *Node) act(rng *rand.Rand, id string, l *receipts.Lease, m mode, hold time.Duration) ([]byte, error) {
	if l.Recovered() {
		// An earlier attempt's outcome is unknown: ask the provider, as a real caller would.
		ev, found, err := n.provider.Find(l.ProviderKey())
		if err != nil {
			n.fail(err)
			return nil, err
		}
		// A takeover holds on a little, so that a fenced-out stale holder tries to commit
		// while this attempt is still pending (which only fencing stops).
		time.Sleep(time.Duration(150+rng.IntN(400)) * time.Millisecond)
		if found {
			return []byte("adopt:" + ev.Op), nil
		}
	}
	if m == modeRelease {
		return nil, receipts.NotPerformed(errNothing)
	}
	// The provider takes any call (it cannot be fenced), so a careful caller confirms it still
	// holds the lease right before the effect: Renew is a fenced write, and one that answers
	// promptly leaves the effect a whole lease. Without it an attempt that slept through its
	// lease (the takeover's hold above, in a mode that does not renew) or got its grant late
	// could act after another attempt took the key over and found no effect yet.
	t0 := time.Now()
	if err := l.Renew(context.Background()); err != nil || time.Since(t0) > n.Workload.TTL/4 {
		if err == nil {
			err = fmt.Errorf("renewal took %s", time.Since(t0))
		}
		return nil, receipts.NotPerformed(fmt.Errorf("%w: the lease is not confirmed: %w", errNothing, err))
	}
	ev := Event{Op: id, Key: l.Key().ID, Token: l.Token(), Attempt: l.Attempt(), Recovered: l.Recovered(), PK: l.ProviderKey(), Inc: n.Inc, Call: now()}
	ev.Ret = ev.Call
	if err := n.provider.Perform(ev); err != nil {
		n.fail(err)
		return nil, err
	}
	res := []byte("eff:" + id)
	time.Sleep(hold)
	switch m {
	case modeAbandon:
		return res, errUnknown
	case modeFail:
		return res, receipts.Permanent(errDecline)
	}
	return res, nil
}

func (n *Node) fnEnd(id string, l *receipts.Lease, res []byte, ferr error) {
	what := "commit"
	var pe, np bool
	if ferr != nil {
		pe, np = errors.Is(ferr, errDecline), errors.Is(ferr, errNothing)
	}
	switch {
	case ferr == nil:
	case pe:
		what = "fail"
	case np:
		what = "release"
	default:
		what = "abandon"
	}
	n.log(Event{Kind: KindFnEnd, Op: id, Key: l.Key().ID, What: what, Result: string(res), Token: l.Token(), Attempt: l.Attempt(), Ret: now()}, false)
}

// outcome logs what the operation was told: a receipt is an ack (fsynced before the worker goes
// on), anything else an error outcome.
func (n *Node) outcome(id, key, what string, call int64, r *receipts.Receipt, err error) {
	ret := now()
	if r != nil {
		n.log(Event{Kind: KindAck, Op: id, Key: key, What: what, State: stateName(r.State), Result: string(r.Result),
			Token: r.Token, Attempt: r.Attempts, Call: call, Ret: ret}, r.State != receipts.Pending)
		return
	}
	var ipe *receipts.InProgressError
	kind := "error"
	switch {
	case err == nil:
		kind = "none" // a claim that returned neither: a bug the checker reports
	case errors.As(err, &ipe):
		kind = "inprogress"
	case errors.Is(err, receipts.ErrNotFound):
		kind = "notfound"
	case errors.Is(err, receipts.ErrLeaseLost):
		kind = "leaselost"
	case errors.Is(err, errNothing):
		kind = "notperformed"
	case errors.Is(err, errUnknown):
		kind = "abandoned"
	}
	n.log(Event{Kind: KindErr, Op: id, Key: key, What: kind, Call: call, Ret: ret}, false)
}
