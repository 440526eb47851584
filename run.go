package receipts

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// Do performs the operation k at most once and returns its receipt. It
// claims k (waiting, bounded by ctx, for an in-flight holder of the same key
// and returning that holder's receipt, or taking over if the holder releases
// or its lease runs out), runs fn while renewing the lease in the
// background, and commits fn's result. Replays of a finished operation never
// call fn.
//
// fn's error decides what is recorded:
//   - nil: the result is committed as a Succeeded receipt.
//   - NotPerformed(err): nothing happened; the claim is released and Do
//     returns an error wrapping err.
//   - Permanent(err): a definitive failure, stored as a Failed receipt.
//   - any other error, or a panic: the outcome is unknown; the claim is
//     abandoned at once and the next attempt gets Lease.Recovered() == true.
//     Do returns an error wrapping fn's error (a panic is re-raised).
//
// A Failed receipt, the first time or replayed, comes back with an error
// wrapping ErrFailed. Once fn has returned, the outcome is recorded on a
// context detached from ctx, so a caller that goes away right after the
// effect never loses its receipt. If the lease is lost while fn runs (another
// caller took the key over), fn's context is cancelled with ErrLeaseLost as
// its cause, and Do returns an error wrapping ErrLeaseLost.
func (db *DB) Do(ctx context.Context, k Key, fingerprint []byte,
	fn func(ctx context.Context, l *Lease) ([]byte, error),
) (*Receipt, error) {
	if err := db.enter(); err != nil {
		return nil, err
	}
	defer db.exit()
	return db.do(ctx, k, fingerprint, false, func(ctx context.Context, l *Lease, _ *pebble.Batch) ([]byte, error) {
		return fn(ctx, l)
	})
}

// DoBatch is Do for effects that live in this same engine: fn writes its
// effect into b (the application's own keys), and the effect commits with
// the receipt in one synced batch. A crash loses an unsynced claim together
// with the effect it guarded, so the claim is not synced: one fsync per
// operation. If fn returns an error, b is discarded (a Failed receipt is
// written without it). On another engine than Pebble it returns
// ErrUnsupported.
func (db *DB) DoBatch(ctx context.Context, k Key, fingerprint []byte,
	fn func(ctx context.Context, l *Lease, b *pebble.Batch) ([]byte, error),
) (*Receipt, error) {
	if err := db.enter(); err != nil {
		return nil, err
	}
	defer db.exit()
	if db.peb == nil {
		return nil, fmt.Errorf("%w: DoBatch on the %s engine", ErrUnsupported, db.eng.Name())
	}
	return db.do(ctx, k, fingerprint, true, fn)
}

func (db *DB) do(ctx context.Context, k Key, fp []byte, batch bool,
	fn func(ctx context.Context, l *Lease, b *pebble.Batch) ([]byte, error),
) (*Receipt, error) {
	l, r, err := db.claim(ctx, k, fp, claimConfig{wait: true, noSync: batch}, nil)
	if err != nil {
		return nil, err
	}
	if r != nil {
		if r.State == Failed {
			return r, fmt.Errorf("receipts: %s: %w", k, ErrFailed)
		}
		return r, nil
	}
	return db.run(ctx, l, batch, fn)
}

// run executes fn under l and records its outcome.
func (db *DB) run(ctx context.Context, l *Lease, batch bool,
	fn func(ctx context.Context, l *Lease, b *pebble.Batch) ([]byte, error),
) (*Receipt, error) {
	detached := context.WithoutCancel(ctx)
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := db.renewInBackground(l, cancel)

	var b *pebble.Batch
	if batch {
		b = db.peb.NewBatch()
		defer b.Close()
	}
	finished := false
	defer func() {
		if !finished { // fn panicked (or called runtime.Goexit)
			stop()
			if err := l.abandon(detached); err != nil {
				db.opts.Logger.Error("receipts: abandon after panic", "key", l.key, "err", err)
			}
		}
	}()
	result, ferr := fn(fctx, l, b)
	finished = true
	stop()

	if ferr == nil {
		r, err := l.settle(detached, Succeeded, result, b, nil)
		if err != nil {
			return nil, db.afterFinishError(detached, l, err)
		}
		return r, nil
	}
	kind, _ := outcomeOf(ferr)
	switch kind {
	case kindNotPerformed:
		if err := l.release(detached); err != nil {
			return nil, fmt.Errorf("receipts: %s not performed (%w), and release failed: %w", l.key, ferr, err)
		}
		return nil, fmt.Errorf("receipts: %s not performed: %w", l.key, ferr)
	case kindPermanent:
		if result == nil {
			result = []byte(ferr.Error())
		}
		r, err := l.settle(detached, Failed, result, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("receipts: %s failed (%w), and recording it failed: %w", l.key, ferr, db.afterFinishError(detached, l, err))
		}
		return r, fmt.Errorf("receipts: %s: %w: %w", l.key, ErrFailed, ferr)
	}
	if err := l.abandon(detached); err != nil && !errors.Is(err, ErrLeaseLost) {
		return nil, fmt.Errorf("receipts: %s: outcome unknown (%w), and abandoning the claim failed: %w", l.key, ferr, err)
	}
	return nil, fmt.Errorf("receipts: %s: outcome unknown: %w", l.key, ferr)
}

// afterFinishError handles a commit that did not happen: unless the lease is
// already lost, the claim is abandoned, since the effect may have happened.
func (db *DB) afterFinishError(ctx context.Context, l *Lease, err error) error {
	if errors.Is(err, ErrLeaseLost) {
		return err
	}
	if aerr := l.abandon(ctx); aerr != nil && !errors.Is(aerr, ErrLeaseLost) {
		return fmt.Errorf("%w (abandoning the claim also failed: %w)", err, aerr)
	}
	return err
}

// renewInBackground renews l every third of the lease TTL until stop is
// called. If the lease is lost, it cancels fn's context with ErrLeaseLost.
// Unlike KeepAlive it goes on while Close waits for Do to finish.
func (db *DB) renewInBackground(l *Lease, cancel context.CancelCauseFunc) (stop func()) {
	return l.keepAlive(cancel, l.renew)
}

// KeepAlive renews the lease in the background, every third of LeaseTTL,
// until stop is called (stop waits for the renewer to end). Use it with
// Claim when the effect may take longer than the lease; Do does it for you.
// If the lease is lost (another caller took the key over) or the store is
// closed, KeepAlive calls cancel with that error, so the effect's context
// ends, and stops. Other renewal errors are logged and retried.
func (l *Lease) KeepAlive(cancel context.CancelCauseFunc) (stop func()) {
	return l.keepAlive(cancel, l.Renew)
}

func (l *Lease) keepAlive(cancel context.CancelCauseFunc, renew func(context.Context) error) (stop func()) {
	quit := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(max(time.Duration(l.db.ttl)/3, time.Millisecond))
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
			}
			err := renew(context.Background())
			switch {
			case errors.Is(err, ErrLeaseLost), errors.Is(err, ErrClosed):
				cancel(err)
				return
			case err != nil:
				l.db.opts.Logger.Warn("receipts: renew lease", "key", l.key, "err", err)
			}
		}
	}()
	return func() {
		select {
		case <-quit:
		default:
			close(quit)
		}
		<-done
	}
}
