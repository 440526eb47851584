package receipts

import (
	"context"
	"errors"
	"fmt"

	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/internal/seal"
)

// Results encrypted per scope (Options.Keyring).
//
// Envelope encryption: every scope has a data key of its own (32 random bytes, AES-256-GCM),
// created the first time a result of the scope is recorded, and stored by the engine
// (driver.DataKeys) only as the application's Keyring wrapped it. A result is stored as
//
//	magic (4 bytes) | key tag (4) | nonce (12: the lease's token, 4 random bytes) | ciphertext | GCM tag (16)
//
// with the envelope's first 20 bytes, the token, the state and the stored key (scope and ID)
// as additional data, so a ciphertext moved to another key, attempt or state does not open.
// The nonce starts with the token, which is unique store-wide: two results sealed under one
// data key share a nonce only if one lease seals twice (a commit retried after an error) and
// the four random bytes agree. Fingerprints, states, tokens and times are outside the
// envelope, so claims, mismatch checks, tombstones and GC never decrypt; a replay decrypts
// once Options.BeforeReplay has allowed it.
//
// A stored result is read as sealed when it starts with the magic, whose first byte (0xc1)
// no msgpack value, UTF-8 text or JSON starts with.

// Keyring is the application's key-encryption key (KEK), for Options.Keyring: it wraps the
// data key of each scope before the store keeps it, and unwraps it when the store needs it
// (once per scope, then kept in memory, and read again a minute later before it seals).
// Scopes are named by their ScopeID, a keyed hash of the scope that reveals it to nobody
// without the store's secret, never by the scope itself. Package keyring is a Keyring in a local file (with an example
// for a KMS). Implementations must be safe for concurrent use.
type Keyring interface {
	// WrapKey encrypts dataKey, the data key of the scope named scopeID, and returns what
	// the store keeps in its place. Bind scopeID to it (as additional data, or a KMS's
	// encryption context), so that a wrapped key cannot be moved to another scope.
	WrapKey(ctx context.Context, scopeID, dataKey []byte) (wrapped []byte, err error)
	// UnwrapKey returns the data key that WrapKey wrapped for scopeID, with whichever of
	// the Keyring's key versions wrapped it (rotation: DB.RewrapKeys). After DestroyKey of
	// scopeID it returns an error wrapping ErrErased.
	UnwrapKey(ctx context.Context, scopeID, wrapped []byte) (dataKey []byte, err error)
}

// KeyDestroyer is implemented by a Keyring that keeps something of its own per scope and can
// destroy it: DB.EraseScope calls DestroyKey, after which UnwrapKey of that scope fails for
// every wrapped copy of its data key, including those in backups and checkpoints taken before
// the erasure. Without it, erasure deletes the wrapped data key from the store, which reaches
// the store but not the copies in its backups: those stay readable to whoever holds a backup
// and the key-encryption key.
type KeyDestroyer interface {
	// DestroyKey destroys what the Keyring keeps for scopeID, for good; destroying it again
	// is not an error.
	DestroyKey(ctx context.Context, scopeID []byte) error
}

// ScopeID returns the name the store gives scope where the scope itself is not written: a
// keyed hash under the store's secret (16 bytes), the same on every node and across restarts.
// It is what a Keyring is given, and what erasure records keep (DB.Erasures). It does no I/O
// and answers after Close.
func (db *DB) ScopeID(scope string) []byte { return driver.ScopeID(db.secret, db.storedScope(scope)) }

// sealResult is what l stores for result recorded as state: its envelope with a Keyring,
// result itself without.
func (l *Lease) sealResult(ctx context.Context, state driver.State, result []byte) ([]byte, error) {
	if !l.db.seal.Enabled() {
		return result, nil
	}
	sealed, err := l.db.seal.Seal(ctx, l.skey, l.token, state, result)
	if errors.Is(err, ErrErased) { // the scope was erased under the lease: its record is gone
		return nil, fmt.Errorf("%w: the key's scope is erased: %w", ErrLeaseLost, err)
	}
	return sealed, err
}

// unseal decrypts rec's result into r.
func (db *DB) unseal(ctx context.Context, r *Receipt, rec *driver.Record) error {
	if err := db.seal.Open(ctx, rec); err != nil {
		return err
	}
	r.Result = rec.Result
	return nil
}

// newSealer returns the DB's sealer for the Keyring kr (nil: none) on eng.
func newSealer(kr Keyring, eng driver.Engine) (*seal.Sealer, error) {
	if _, ok := eng.(driver.DataKeys); kr != nil && !ok {
		return nil, fmt.Errorf("%w: Options.Keyring: the %s engine keeps no data keys", ErrUnsupported, eng.Name())
	}
	return seal.New(kr, eng), nil
}

// RewrapKeys wraps every scope's data key (and the store's hash key, Options.HashKeys) anew
// with the Keyring as it is now: after the application rotated its key-encryption key
// (keyring.File.Rotate, a new KMS key version), so that the old one can be retired. No result
// is rewritten: results stay sealed under their scopes' data keys, which do not change. It
// returns how many keys it rewrapped. A
// key written or rewrapped concurrently (another node) is left as that write left it. It
// returns ErrUnsupported without Options.Keyring.
func (db *DB) RewrapKeys(ctx context.Context) (int, error) {
	if err := db.enter(); err != nil {
		return 0, err
	}
	defer db.exit()
	s := db.seal
	if !s.Enabled() {
		return 0, fmt.Errorf("%w: RewrapKeys without Options.Keyring", ErrUnsupported)
	}
	n := 0
	if ok, err := rewrapHashKey(ctx, db.eng, db.opts.Keyring); err != nil { // Options.HashKeys' key
		return n, err
	} else if ok {
		n++
	}
	m, err := s.Rewrap(ctx)
	return n + m, err
}
