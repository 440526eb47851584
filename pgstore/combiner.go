package pgstore

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/receiptstore/receipts/driver"
)

// Statements of different keys share a transaction when they arrive together.
//
// Under load most of the server's work for a first call's claim, or for a finish, is per
// statement and per transaction, not per key: setting up the plan over the partitions, the
// protocol's parse, bind and execute, the advisory lock's statement, BEGIN and COMMIT, and
// the commit's WAL flush. So while batchInflight transactions of one kind are in flight, the
// calls that arrive wait, and the next one sends all of them (up to batchMax, distinct keys)
// as one statement over arrays of keys, which makes for each key the decision its own
// statement would have made (claim.go, finish.go). With fewer callers than
// batchInflight nothing waits and every call is sent alone, as before.
const (
	batchInflight = 2  // transactions of one kind in flight before calls wait to be batched
	batchMax      = 32 // keys in one batch
)

// A batchCall is one call waiting for, or in, a batch; v holds its arguments and answer.
type batchCall[V any] struct {
	ctx context.Context
	key driver.Key
	// state: callWaiting, then callDone (answered, or made the next sender: lead) or
	// callGone (its caller returned: ctx ended), whichever comes first.
	state atomic.Int32
	done  chan struct{} // closed when state becomes callDone
	lead  []*batchCall[V]
	v     V
}

const (
	callWaiting int32 = iota
	callDone
	callGone
)

// combiner queues calls while batchInflight batches are in flight and sends them together.
// No goroutine of its own: the caller that finds room sends, and when its batch is answered
// it makes the first waiting call the next sender.
type combiner[V any] struct {
	// send answers every call of batch (self, the sender, among them; a batch of one is
	// sent alone), sending on ctx: self's context, or the detached one (detach).
	send func(ctx context.Context, self *batchCall[V], batch []*batchCall[V])
	// gone, if set, is called after send for each call whose caller returned while its batch
	// was in flight (its answer is in v), the sender's own included when detached.
	gone func(c *batchCall[V])
	// detach, if set, runs each batch in a goroutine of its own (started by it: false if it
	// cannot be, once the engine is closing; the batch is then sent on the sender's
	// goroutine and context) on a context that the callers' cannot cancel (ctx: the
	// sender's, for its values). The sender waits for the batch or for its own context,
	// whichever ends first, as every other member does: a batch that carries a COMMIT is
	// never cut short by a caller who leaves (gone settles what it decided for them).
	detach func(ctx context.Context, run func(ctx context.Context)) bool

	mu       sync.Mutex
	queue    []*batchCall[V]
	inflight int
	batches  atomic.Uint64 // batches of two or more keys sent
	batched  atomic.Uint64 // the calls those batches carried
}

// do answers c, alone or in a batch. false: c's context ended first (c was not sent, or its
// batch was still in flight): its caller returns the context's error.
func (b *combiner[V]) do(c *batchCall[V]) bool {
	b.mu.Lock()
	if b.inflight < batchInflight {
		b.inflight++
		batch := append(b.takeLocked(batchMax-1, c.key), c)
		b.mu.Unlock()
		return b.lead(c, batch)
	}
	c.done = make(chan struct{})
	b.queue = append(b.queue, c)
	b.mu.Unlock()
	select {
	case <-c.done:
	case <-c.ctx.Done():
		if c.state.CompareAndSwap(callWaiting, callGone) {
			b.mu.Lock()
			if i := slices.Index(b.queue, c); i >= 0 {
				b.queue = slices.Delete(b.queue, i, i+1)
			}
			b.mu.Unlock()
			return false
		}
		<-c.done // answered (or made the sender) meanwhile
	}
	if c.lead != nil {
		c.state.Store(callWaiting) // the sender's own answer is still to come
		return b.lead(c, c.lead)
	}
	return true
}

// lead sends batch, self being the sender: on its goroutine and context, or detached
// (combiner.detach), then waiting for the batch or for self's context. false: self's
// context ended first (self is gone: run settles its answer with gone).
func (b *combiner[V]) lead(self *batchCall[V], batch []*batchCall[V]) bool {
	if b.detach == nil {
		b.run(self.ctx, self, batch)
		return true
	}
	done := make(chan struct{})
	if !b.detach(self.ctx, func(ctx context.Context) {
		defer close(done)
		b.run(ctx, self, batch)
	}) {
		b.run(self.ctx, self, batch)
		return true
	}
	select {
	case <-done:
		return true
	case <-self.ctx.Done():
		if self.state.CompareAndSwap(callWaiting, callGone) {
			return false
		}
		<-done
		return true
	}
}

// takeLocked takes up to n waiting calls off the queue, none for key k or for a key taken
// already (the keys of a batch are distinct); b.mu is held.
func (b *combiner[V]) takeLocked(n int, k driver.Key) []*batchCall[V] {
	var out []*batchCall[V]
	rest := b.queue[:0]
	for _, c := range b.queue {
		switch {
		case c.state.Load() == callGone:
		case len(out) < n && c.key != k && !slices.ContainsFunc(out, func(o *batchCall[V]) bool { return o.key == c.key }):
			out = append(out, c)
		default:
			rest = append(rest, c)
		}
	}
	clear(b.queue[len(rest):])
	b.queue = rest
	return out
}

// run sends batch on ctx (self is the sender) and answers its members, then makes the first
// waiting call the next sender, or leaves the in-flight count one lower.
func (b *combiner[V]) run(ctx context.Context, self *batchCall[V], batch []*batchCall[V]) {
	if len(batch) > 1 {
		b.batches.Add(1)
		b.batched.Add(uint64(len(batch)))
	}
	b.send(ctx, self, batch)
	for _, c := range batch {
		switch {
		case c.state.CompareAndSwap(callWaiting, callDone):
			if c != self {
				close(c.done)
			}
		case b.gone != nil:
			b.gone(c)
		}
	}
	for {
		b.mu.Lock()
		if len(b.queue) == 0 {
			b.inflight--
			b.mu.Unlock()
			return
		}
		next := b.queue[0]
		b.queue = b.queue[1:]
		if !next.state.CompareAndSwap(callWaiting, callDone) {
			b.mu.Unlock()
			continue // gone
		}
		next.lead = append(b.takeLocked(batchMax-1, next.key), next)
		b.mu.Unlock()
		close(next.done)
		return
	}
}

// samePartition is the calls of batch whose partition (part) is the sender's: those one
// statement aimed at that partition can serve. The others are left to go on alone.
func samePartition[V any](self *batchCall[V], batch []*batchCall[V], part func(*V) int64) []*batchCall[V] {
	ep := part(&self.v)
	in := make([]*batchCall[V], 0, len(batch))
	for _, c := range batch {
		if part(&c.v) == ep {
			in = append(in, c)
		}
	}
	return in
}
