package receipts

import (
	"context"
	"time"

	"github.com/receiptstore/receipts/internal/private"
)

// The hooks through which package reconcile's Reconciler works inside the
// protocol without exported names for it (internal/private says what each
// does). The outcome protocol itself stays in run.go (Lease.conclude).
func init() {
	private.Enter = func(db any) (<-chan struct{}, error) {
		d := db.(*DB)
		return d.closing, d.enter()
	}
	private.Exit = func(db any) { db.(*DB).exit() }
	private.Background = func(db any, run func()) {
		d := db.(*DB)
		d.bg.Add(1)
		go func() {
			defer d.bg.Done()
			run()
		}()
	}
	private.CheckLeaseFor = func(db any, d time.Duration) error {
		_, err := db.(*DB).leaseTTL(&claimConfig{ttlSet: true, ttl: d})
		return err
	}
	private.TakeOver = func(ctx context.Context, db, r any, leaseFor time.Duration) (any, error) {
		var cfg claimConfig
		if leaseFor != 0 {
			cfg.ttlSet, cfg.ttl = true, leaseFor
		}
		l, err := db.(*DB).takeOver(ctx, r.(*Receipt), cfg)
		if err != nil {
			return nil, err
		}
		return l, nil
	}
	private.Conclude = func(ctx context.Context, lease any, result []byte, ferr error) (int, any, error, error) {
		l := lease.(*Lease)
		o := l.conclude(ctx, result, ferr, l.forget)
		var unknown error
		if o.why != "" { // a result it cannot record
			unknown = l.outcomeUnknown(o.why, ferr)
		}
		return verdicts[o.verdict], o.receipt, unknown, o.err
	}
	private.KeepAlive = func(lease any, cancel context.CancelCauseFunc) func() {
		return lease.(*Lease).keepAlive(cancel, false).stop
	}
}

// verdicts maps the contract's verdicts to private's.
var verdicts = [...]int{
	verdictCommit:  private.VerdictCommit,
	verdictFail:    private.VerdictFail,
	verdictRelease: private.VerdictRelease,
	verdictUnknown: private.VerdictUnknown,
}
