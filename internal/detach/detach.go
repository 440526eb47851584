// Package detach is context.WithoutCancel without its cost on every Value.
//
// The standard library's detached context is a struct value whose Value
// method passes a copy of itself, as a Context, to the lookup: one heap
// allocation on every Value call that reaches it (Go 1.26). A Do looks up
// the trace context on its detached context once per commit, so that was
// an allocation per Do for nothing.
package detach

import (
	"context"
	"time"
)

// Context returns a context that is never cancelled, has no deadline, and
// carries parent's values: context.WithoutCancel(parent), with the same
// answers to Deadline, Done, Err, Value and context.Cause, as a pointer
// type whose Value allocates nothing.
func Context(parent context.Context) context.Context {
	if parent == nil {
		panic("cannot create context from nil parent")
	}
	return &ctx{parent: parent}
}

type ctx struct{ parent context.Context }

func (*ctx) Deadline() (time.Time, bool) { return time.Time{}, false }
func (*ctx) Done() <-chan struct{}       { return nil }
func (*ctx) Err() error                  { return nil }

// Value returns parent's value for key. context.Cause never reaches it to
// look for a cancellable ancestor: it asks only a context whose Err is not
// nil (Go 1.26, the module's minimum), and Err is always nil here.
func (c *ctx) Value(key any) any { return c.parent.Value(key) }

func (*ctx) String() string { return "detach.Context" }
