package intents

import (
	"context"
	"iter"
)

// Store is where a Journal keeps its actions. This package has the Pebble
// store (Open); package intentspg has one on PostgreSQL. A Store is used
// by one Journal, which decides every transition: a Store keeps what it is
// given (every field of Action, including the delivery lease, Holder and
// LeaseUntil: a store that drops them lets every host deliver every
// action), under these rules.
//
//   - Durable before return: Create, and Update with sync, return once the
//     write survives a crash of the process and of the machine. Update
//     without sync is bookkeeping (attempt counts): a crash may lose it,
//     never write part of it.
//   - Nothing half-visible: Get and List never return an action that a
//     crash could still take back.
//   - Atomic read-modify-write: Update applies change to the stored action
//     and writes the result as one step that no other Update, Create or
//     Delete of the key interleaves with, and only when the stored state is
//     one of from; otherwise it returns an error wrapping ErrWrongState (or
//     ErrNotFound) and changes nothing. Delete checks the state the same
//     way. Delivery leases are claimed through it, by every host sharing
//     the store.
//   - Ref is unique: Create of an action whose non-empty Ref the store
//     holds creates nothing and returns the stored action.
type Store interface {
	// Create stores a new action, unless its Ref is taken: then it
	// returns the stored action with that Ref and created == false.
	Create(ctx context.Context, a *Action) (stored *Action, created bool, err error)
	// Update applies change to the action key, if its stored state is one
	// of from, and stores the result, which it returns. change gets a
	// copy it may modify (but not its Key or Ref) and must not keep; an
	// error from change is returned and nothing is written.
	Update(ctx context.Context, key string, from []State, sync bool, change func(*Action) error) (*Action, error)
	// Get returns the action key, or ErrNotFound.
	Get(ctx context.Context, key string) (*Action, error)
	// List yields the actions in state (0: every state) in key order,
	// which is approval order for keys minted by Approve.
	List(ctx context.Context, state State) iter.Seq2[*Action, error]
	// Delete removes the action key (and its Ref) if its state is one of
	// from.
	Delete(ctx context.Context, key string, from []State) error
	// Close releases the store; Journal.Close calls it once.
	Close() error
}

// StateIn reports whether s is one of set: the check Update and Delete
// make, for Store implementations.
func StateIn(s State, set []State) bool {
	for _, x := range set {
		if s == x {
			return true
		}
	}
	return false
}
