package driver

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"iter"
	"time"
)

// Privacy: the optional interfaces an engine implements so that the root can encrypt results
// per scope (receipts' Options.Keyring) and erase a scope (receipts' DB.EraseScope). The root
// does the cryptography; an engine stores the wrapped data keys and the erasure records, and
// makes a scope's erasure one atomic step that claims respect.

// ErrErased is returned by an engine for a write in a scope whose erasure is in force
// (DataKeys.PutDataKey). receipts.ErrErased is this error.
var ErrErased = errors.New("receipts: scope erased")

// ErrSealed is returned for a stored result that is encrypted when no Keyring is set to
// open it. receipts.ErrSealed is this error.
var ErrSealed = errors.New("receipts: the result is encrypted and no keyring is set")

// Erased is the outcome of a claim in a scope whose erasure is in force (Eraser): nothing
// written; Record holds the key, UpdatedAt the erasure's time and ExpiresAt its Until.
const Erased = Expired + 1

// ScopeIDLen is the length of a ScopeID.
const ScopeIDLen = 16

// ScopeID is the name the store gives a scope where the scope itself must not be written: the
// data key table, the erasure records, a Keyring's calls. It is a keyed hash (HMAC-SHA256,
// truncated to ScopeIDLen bytes) under the store's secret (Engine.Secret), so it reveals the
// scope to nobody who lacks the secret, and is the same on every node of a store.
func ScopeID(secret []byte, scope string) []byte {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte("receipts scope id\x00"))
	mac.Write([]byte(scope))
	return mac.Sum(nil)[:ScopeIDLen]
}

// DataKeys is implemented by an engine that keeps the data keys of scopes, as the Keyring
// wrapped them: receipts' Options.Keyring needs it (an engine without it refuses the option
// with ErrUnsupported). Keys are named by ScopeID. The engine never sees a key unwrapped.
type DataKeys interface {
	// DataKey returns the wrapped data key stored for id; found is false if there is none.
	DataKey(ctx context.Context, id []byte) (wrapped []byte, found bool, err error)
	// PutDataKey stores wrapped as id's data key, durably, unless one is stored already,
	// and returns the key in force: wrapped, or the one stored before (by another node, or
	// a racing call). It returns ErrErased (writing nothing) while an erasure of the scope
	// is in force.
	PutDataKey(ctx context.Context, id, wrapped []byte) ([]byte, error)
	// SwapDataKey replaces id's wrapped data key old by new (the same data key wrapped
	// anew, after a rotation of the Keyring's key-encryption key), durably, if old is
	// still the one stored; it reports whether it did.
	SwapDataKey(ctx context.Context, id, old, new []byte) (bool, error)
	// ScanDataKeys yields every stored data key, durable ones only.
	ScanDataKeys(ctx context.Context) iter.Seq2[DataKey, error]
}

// DataKey is one scope's stored data key.
type DataKey struct {
	ID      []byte // ScopeID of the scope
	Wrapped []byte // as the Keyring wrapped it
}

// Erasure is what a store keeps of a scope's erasure: no scope, no ID, no result.
type Erasure struct {
	ID []byte // ScopeID of the scope
	// At is when the scope was (last) erased, by the engine's clock.
	At time.Time
	// Until is when its erasure stops being in force: claims of the scope answer Erased
	// until then. At least At + Retention + TombstoneWindow (Retention alone with
	// tombstones off): as long as a retry of any receipt erased could still have been
	// answered from the store.
	Until time.Time
	// Records counts the records deleted, by every erasure of the scope (tombstone
	// markers not counted).
	Records int64
	// KeyDestroyed: the root destroyed the scope's key in the application's Keyring too
	// (MarkKeyDestroyed), so no copy of its wrapped data key can be opened again.
	KeyDestroyed bool
	// Count is how many times the scope was erased: an erasure of a scope whose erasure is
	// in force does not count again. The root names each generation of a scope's data key
	// by it.
	Count uint32
}

// InForce reports whether e is in force at now.
func (e Erasure) InForce(now time.Time) bool { return now.Before(e.Until) }

// Eraser is implemented by an engine that can erase a scope (receipts' DB.EraseScope); an
// engine without it makes EraseScope return ErrUnsupported.
type Eraser interface {
	// EraseScope deletes every record and every tombstone marker of scope and its data
	// key (DataKeys), and records the erasure, in one atomic, durable step: a crash leaves
	// the scope either whole or erased. From then until the record's Until, claims of the
	// scope answer Erased and PutDataKey refuses its key. Claims and fenced writes of the
	// scope that are in flight when it starts either end before it deletes (what they
	// wrote is deleted) or find the erasure (Erased; ErrLeaseLost). On a scope whose
	// erasure is in force it erases again (deleting anything written since) and keeps the
	// record's At, adding the records it deleted; an erasure no longer in force is
	// replaced. Its cost is O(epochs, or partitions) writes, not one per record.
	// (An erasure in force keeps its At and Until: nothing of the scope can be written
	// while it is in force.)
	EraseScope(ctx context.Context, scope string) (Erasure, error)
	// Erasure returns the erasure record of the scope named id (ScopeID), found=false if
	// there is none, in force or not.
	Erasure(ctx context.Context, id []byte) (er Erasure, found bool, err error)
	// Erasures yields every erasure record kept (they are never reclaimed: a ledger that
	// names no scope), durable ones only.
	Erasures(ctx context.Context) iter.Seq2[Erasure, error]
	// MarkKeyDestroyed records, durably, that the Keyring destroyed the key of the scope
	// named id: Erasure.KeyDestroyed.
	MarkKeyDestroyed(ctx context.Context, id []byte) error
}

// Settings is implemented by an engine that keeps named settings of the root's with the
// store (receipts' Options.HashKeys records there that the store's keys are hashed). An
// engine without it cannot run with Options.HashKeys (ErrUnsupported).
type Settings interface {
	// Setting returns the value recorded for name; found is false if there is none.
	Setting(ctx context.Context, name string) (value []byte, found bool, err error)
	// PutSetting records value for name, durably, unless a value is recorded already, and
	// returns the value in force: value, or the one recorded before.
	PutSetting(ctx context.Context, name string, value []byte) ([]byte, error)
	// SwapSetting replaces name's value old by new, durably, if old is the one recorded;
	// it reports whether it did.
	SwapSetting(ctx context.Context, name string, old, new []byte) (bool, error)
}
