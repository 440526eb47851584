package receiptmcp

import (
	"context"
	"sync/atomic"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/internal/stepwatch"
)

// Attempt describes the claim under which the middleware runs a tool
// handler. Read it with AttemptFrom in the handler.
type Attempt struct {
	// Key is the operation key: the caller's scope and the key from
	// params._meta.
	Key receipts.Key
	// Number is 1 for the first execution and grows by one per takeover of
	// an abandoned claim (Lease.Attempt).
	Number uint32
	// Recovered reports that an earlier attempt's outcome is unknown (its
	// handler failed with an error that is not a JSON-RPC error, panicked,
	// or its process died): reconcile before acting, e.g. look the effect
	// up by ProviderKey (Lease.Recovered).
	Recovered bool
	// Token is the claim's fencing token (Lease.Token): unique store-wide,
	// and larger for every later attempt of this key (and for every claim
	// made after this one). Pass it to downstream writes and let them apply
	// only while it is the largest they have seen (see "Fencing downstream
	// writes" in the package documentation): a stale attempt, still running
	// after its claim was taken over, then changes nothing.
	Token uint64
	// ProviderKey is stable across attempts of this operation and reveals
	// neither scope nor key: forward it as the idempotency key of
	// downstream providers (Lease.ProviderKey).
	ProviderKey string

	lease  *receipts.Lease  // the claim's lease
	staged atomic.Bool      // Stage was called
	steps  *stepwatch.Watch // what the steps told
}

type attemptKey struct{}

// AttemptFrom returns the Attempt of a tool call the middleware is
// executing under an operation key. ok is false for calls that pass through
// (no key, a Skip tool, any method other than tools/call).
func AttemptFrom(ctx context.Context) (a *Attempt, ok bool) {
	a, ok = ctx.Value(attemptKey{}).(*Attempt)
	return a, ok
}

// Stage stages an effect that commits with the stored result, in the
// engine's unit of atomic work (receipts.Lease.Stage): a *pebble.Batch on
// the embedded engine, a pgx.Tx on PostgreSQL; write it with
// receipts.EffectOn (pebblestore.Effect for a batch). The effect and the stored result become durable
// together, or neither does. Effects run in the order they were staged, and
// only when the tool returns a finished result without isError; otherwise
// they are dropped. If an effect returns an error, nothing is recorded, the
// claim is abandoned (the retry is Recovered), and the client gets
// CodeNotRecorded.
func (a *Attempt) Stage(effect receipts.Effect) {
	if a.lease == nil {
		panic("receiptmcp: Stage on an Attempt not made by the middleware")
	}
	a.staged.Store(true)
	a.lease.Stage(effect)
}

// Step runs fn as the next step of the tool's action, unless the key's
// journal holds it finished: then it returns the recorded result without
// calling fn (receipts.Lease.Step). A retry resumes the work: the steps an
// earlier attempt finished are not run again, on any node, and the step
// whose outcome is unknown runs again with Step.Recovered() == true and the
// same Step.ProviderKey, the key to forward to its provider. Steps are
// matched by position, name and fingerprint; fn's error is read as Do
// reads it (nil, receipts.NotPerformed, receipts.Permanent, anything else:
// unknown).
//
// The middleware answers for the steps whatever the handler returns:
//   - a step whose outcome is unknown (fn failed in an unknown way or
//     panicked, or its outcome could not be recorded) abandons the claim at
//     once: nothing is stored, and the client gets CodeNotRecorded
//     (TypeNotRecorded) with the step's name in data.step; its retry runs as
//     a recovered attempt and resumes at that step;
//   - a step that does not match the key's journal (receipts.ErrStepMismatch:
//     the code changed while the action was in flight) runs nothing, the
//     claim is abandoned, and the client gets CodeInternal with
//     TypeStepMismatch and the name in data.step; an operator settles the
//     key (receiptctl).
func (a *Attempt) Step(ctx context.Context, name string, fingerprint []byte, fn func(ctx context.Context, s *receipts.Step) ([]byte, error)) ([]byte, error) {
	if a.lease == nil {
		panic("receiptmcp: Step on an Attempt not made by the middleware")
	}
	res, err := a.lease.Step(ctx, name, fingerprint, fn)
	if err != nil && a.steps != nil {
		a.steps.Note(name, err)
	}
	return res, err
}
