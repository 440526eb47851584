// Package progress carries a progress callback in a context, from a
// long-running read (DB.Check) to its caller (receiptctl's progress line).
package progress

import "context"

type key struct{}

// With returns ctx carrying fn, which is told how many items (records) are
// done so far.
func With(ctx context.Context, fn func(done int)) context.Context {
	return context.WithValue(ctx, key{}, fn)
}

// From returns the callback With put in ctx, or nil.
func From(ctx context.Context) func(done int) {
	fn, _ := ctx.Value(key{}).(func(int))
	return fn
}
