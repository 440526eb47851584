package receiptmcp

import (
	"context"
	"fmt"
	"sync"

	"github.com/cockroachdb/pebble/v2"
	"github.com/receiptstore/receipts"
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

	mu      sync.Mutex
	effects []func(b *pebble.Batch) error
}

type attemptKey struct{}

// AttemptFrom returns the Attempt of a tool call the middleware is
// executing under an operation key. ok is false for calls that pass through
// (no key, a Skip tool, any method other than tools/call).
func AttemptFrom(ctx context.Context) (a *Attempt, ok bool) {
	a, ok = ctx.Value(attemptKey{}).(*Attempt)
	return a, ok
}

// AddEffect stages a write to the engine's own Pebble database
// (receipts.DB.Pebble) that commits in the same synced batch as the
// receipt (Lease.RunBatch): the effect and the stored result become
// durable together, or neither does. Effects run in the order they were
// added, and only when the tool returns a finished result without isError;
// otherwise they are dropped. If an effect returns an error, nothing is
// recorded and the client gets CodeNotRecorded.
func (a *Attempt) AddEffect(effect func(b *pebble.Batch) error) {
	a.mu.Lock()
	a.effects = append(a.effects, effect)
	a.mu.Unlock()
}

// hasEffects reports whether effects are staged.
func (a *Attempt) hasEffects() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.effects) > 0
}

// applyEffects writes the staged effects into b, in the order they were
// added.
func (a *Attempt) applyEffects(b *pebble.Batch) error {
	a.mu.Lock()
	effects := a.effects
	a.effects = nil
	a.mu.Unlock()
	for _, f := range effects {
		if err := f(b); err != nil {
			return fmt.Errorf("receiptmcp: staged effect: %w", err)
		}
	}
	return nil
}
