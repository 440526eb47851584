package pgstore

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/receiptstore/receipts/driver"
)

// A claim whose caller's context ends while its COMMIT is in flight.
//
// The server may commit the claim after the caller's context has ended, before its reply
// arrives. pgx, on a context that ends mid-statement, closes the connection and sends the
// server a cancel request, so the caller is left with an error while the claim may have
// landed: a key claimed by nobody, whose retries get ErrInProgress for the whole lease and
// whose next attempt is told Recovered for an effect that never ran. So a send that carries
// a claim's COMMIT runs detached from the caller's context (detach: in a goroutine of its own,
// on the engine's context, which only Close cancels, with the caller's values), and the
// caller waits for it or for its own context, whichever ends first. A caller who leaves first
// gets its context's error; the claim's answer comes in anyway, and what it granted is undone
// by its token (undoClaim: the key is free again, or, after a takeover, abandoned as it was,
// so the next attempt is still Recovered). Neither pgx's deadline nor its cancel request
// ever reaches a COMMIT that pgstore sent (the cancel request matters with synchronous
// replication: a COMMIT whose wait for the standby is cancelled commits locally, and its
// reply says COMMIT).
//
// A claim whose reply was lost for another reason (the connection broke) is retried with its
// nonce while the caller waits; a caller who leaves before an answer leaves the claim to
// resolveLost, which waits until the backend it was sent to is no longer running it, looks the
// claim up by its nonce and undoes it if it landed. Both run on a context detached from the
// caller's and bounded (settleTimeout, and Close).

// settleTimeout bounds what the engine does for a caller who has gone (undo a claim, look one
// up by its nonce), and Close's wait for it.
const settleTimeout = 10 * time.Second

// background is the engine's work for callers who have gone: Close waits for it.
type background struct {
	mu     sync.Mutex
	closed bool // protected by mu: no new work
	wg     sync.WaitGroup
}

// spawn runs f in a goroutine of its own, unless Close has begun (false: f is not run).
func (b *background) spawn(f func()) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return false
	}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		f()
	}()
	return true
}

// close refuses new work and waits up to d for the work in progress; false: some is left.
func (b *background) close(d time.Duration) bool {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	done := make(chan struct{})
	go func() {
		b.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// sendContext is a context for a send that must not end with its caller: the engine's
// (cancelled by Close only) with the caller's values (its trace context).
type sendContext struct {
	context.Context                 // the engine's
	values          context.Context // the caller's
}

func (c sendContext) Value(k any) any { return c.values.Value(k) }

// detach runs send in a goroutine of its own on a context that only Close cancels, carrying
// ctx's values; false (send not run) once Close has begun.
func (e *engine) detach(ctx context.Context, send func(ctx context.Context)) bool {
	return e.bg.spawn(func() { send(sendContext{e.ctx, ctx}) })
}

// Call states of detachCall.
const (
	detWaiting int32 = iota
	detDone
	detGone
)

// detachCall runs send detached (detach) and waits for it or for ctx, whichever ends first.
// true: send is done (its answers are the caller's). false: ctx ended first; send goes on and
// then left runs, to settle what send decided for a caller who has gone. send may ask gone
// whether the caller has gone already (say, before it commits). Once Close has begun send
// runs on the caller's goroutine and context.
func (e *engine) detachCall(ctx context.Context, send func(ctx context.Context, gone func() bool), left func()) bool {
	var state atomic.Int32
	gone := func() bool { return state.Load() == detGone }
	if ctx.Done() == nil { // the caller cannot leave: no goroutine needed
		send(sendContext{e.ctx, ctx}, gone)
		return true
	}
	done := make(chan struct{})
	if !e.detach(ctx, func(dctx context.Context) {
		defer close(done)
		send(dctx, gone)
		if !state.CompareAndSwap(detWaiting, detDone) {
			left()
		}
	}) {
		send(ctx, gone)
		return true
	}
	select {
	case <-done:
		return true
	case <-ctx.Done():
		if state.CompareAndSwap(detWaiting, detGone) {
			return false
		}
		<-done
		return true
	}
}

// settleLater runs f in the background on a context detached from ctx and bounded by
// settleTimeout (and Close), or at once if Close has begun.
func (e *engine) settleLater(ctx context.Context, f func(ctx context.Context)) {
	run := func() {
		sctx, cancel := e.settleContext(ctx)
		defer cancel()
		f(sctx)
	}
	if !e.bg.spawn(run) {
		run()
	}
}

// settleContext is ctx detached from its cancellation, with ctx's values, bounded by
// settleTimeout and cancelled by Close.
func (e *engine) settleContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(sendContext{e.ctx, ctx}, settleTimeout)
}

// undoClaim undoes the claim with token that nobody holds (its caller has gone, or it cannot
// be handed out), as Release does: a first attempt's record is deleted (the key is free, as if
// never claimed), a takeover's is abandoned (the next attempt is Recovered, as it would have
// been). A claim taken over or finished meanwhile is left alone (fenced). If the undo fails, the claim stays Pending until its lease
// runs out (logged). ctx is the caller's: it runs on a settling context (settleContext).
func (e *engine) undoClaim(ctx context.Context, k driver.Key, token uint64, tookOver bool) {
	ctx, cancel := e.settleContext(ctx)
	defer cancel()
	if err := e.Release(ctx, k, token, tookOver); err != nil && !errors.Is(err, driver.ErrLeaseLost) {
		e.o.Logger.Warn("pgstore: undoing a claim nobody holds failed; it stays pending until its lease runs out",
			"token", token, "err", err)
	}
}

// resolveLost settles a claim of req, sent with nonce, whose reply was lost and whose caller
// has gone: it waits until the backends it was sent to (pids; 0s are skipped) no longer run a
// statement (a claim they have not committed by then will not be), looks the claim up by its
// nonce, and undoes it if it landed (undoClaim). ctx is the caller's: it runs on a settling
// context.
func (e *engine) resolveLost(ctx context.Context, req driver.ClaimRequest, nonce []byte, pids ...uint32) {
	ctx, cancel := e.settleContext(ctx)
	defer cancel()
	e.awaitSettled(ctx, pids)
	var token int64
	var attempts int32
	var err error
	for attempt := 0; ; attempt++ {
		err = e.pool.QueryRow(ctx, e.q.byNonce, []byte(req.Key.Scope), []byte(req.Key.ID), e.oldest(), nonce).Scan(&token, &attempts)
		if attempt >= maxLostReply || !lostReply(ctx, err) || sleep(ctx, 10*time.Millisecond<<min(attempt, 5)) != nil {
			break
		}
	}
	switch {
	case errors.Is(err, pgx.ErrNoRows): // it did not land (or was finished or undone already)
	case err != nil:
		e.o.Logger.Warn("pgstore: a claim whose reply was lost cannot be looked up; it stays pending until its lease runs out if it landed",
			"err", err)
	default:
		e.undoClaim(ctx, req.Key, uint64(token), attempts > 1)
	}
}

// awaitSettled waits until none of the backends pids is running a statement (or ctx ends):
// a claim sent to one of them whose reply was lost is then decided, one way or the other.
func (e *engine) awaitSettled(ctx context.Context, pids []uint32) {
	var ids []int32
	for _, p := range pids {
		if p != 0 {
			ids = append(ids, int32(p))
		}
	}
	if len(ids) == 0 {
		return
	}
	for wait := time.Millisecond; ; wait = min(2*wait, 100*time.Millisecond) {
		var busy bool
		err := e.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = ANY($1) AND state = 'active')`, ids).Scan(&busy)
		if err != nil || !busy || sleep(ctx, wait) != nil {
			return
		}
	}
}

// sentErr is the error of a send whose reply may have been lost, with the backend (process
// ID) the send went to.
type sentErr struct {
	err error
	pid uint32
}

func (s *sentErr) Error() string { return s.err.Error() }
func (s *sentErr) Unwrap() error { return s.err }

// sent marks err (if not nil) with the backend of pc.
func sent(err error, pc *pgconn.PgConn) error {
	if err == nil {
		return nil
	}
	return &sentErr{err: err, pid: pc.PID()}
}

// sentTo is the backend an error marked by sent names (0: none).
func sentTo(err error) uint32 {
	var s *sentErr
	if errors.As(err, &s) {
		return s.pid
	}
	return 0
}
