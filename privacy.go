package receipts

import (
	"context"
	"crypto/rand"
	"fmt"

	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/internal/keys"
)

// Keys that reveal nothing at rest (Options.HashKeys).
//
// With hashed keys the engine never sees a scope or an ID: the root hands it, for Key{Scope,
// ID}, the stored key
//
//	Scope: "\x00h" + base64url(HMAC-SHA256(secret, "receipts key scope\x00" | scope)[:16])
//	ID:    "\x00h" + base64url(HMAC-SHA256(secret, "receipts key id\x00" | len(scope) | scope | id)[:16])
//
// under the store's hash key, 24 bytes each. With Options.Keyring the hash key is 32 random
// bytes that the store keeps only as the Keyring wrapped them (setting hashKeySetting), so a
// copy of the store does not even let one test a guessed scope; without one it is the
// store's secret (driver.Engine.Secret), which the store holds. The ID's hash depends on
// the scope, so the same ID in two scopes does not link them. Every call takes the caller's
// key and answers with it (a replay's Receipt.Key is the key given); what only the store
// knows comes back in the stored form: Scan and Tombstones list stored keys (with the raw
// scope in place of its hash when the filter gave it), and every call accepts a stored key
// (or a raw scope with a stored ID) as the key it stands for, so a listing's keys can be
// looked up, taken over and reconciled. In this mode a raw scope or ID may not start with
// "\x00h" (ErrInvalidKey): that is the stored form's mark.
//
// The store records the mode (driver.Settings, name keyFormSetting): a store created with
// HashKeys keeps it (a later Open without the option, receiptctl's, uses it too), and a
// store that holds records with their keys as given cannot take it up (the records would no
// longer be found: a retry would run again).

// keyFormSetting is the setting that records the form of a store's keys.
const keyFormSetting = "key-form"

// keyFormHashed and keyFormWrapped are its values for keys hashed under the store's
// secret, and under a hash key the Keyring wraps (absent: keys as given).
var (
	keyFormHashed  = []byte("hmac-sha256-128-v1")
	keyFormWrapped = []byte("hmac-sha256-128-keyring-v1")
)

// hashKeySetting holds the wrapped hash key (keyFormWrapped).
const hashKeySetting = "key-hash-key"

// hashKeyID is the name the Keyring knows the hash key by: no ScopeID (an HMAC) is all
// zeros but with probability 2^-128.
var hashKeyID = make([]byte, driver.ScopeIDLen)

// storedScope is scope as the engine stores it: its hash in HashKeys mode (a stored scope is
// kept as it is), scope itself otherwise.
func (db *DB) storedScope(scope string) string {
	if db.keys == nil || keys.IsStoredPart(scope) {
		return scope
	}
	return db.keys.Part("receipts key scope\x00", scope, "", false)
}

// storedKey is k as the engine stores it (see the top of this file). It returns
// ErrInvalidKey for a key that is neither raw nor stored in HashKeys mode: a stored scope
// with a raw ID (the ID's hash needs the scope), or a raw part that starts with the mark.
func (db *DB) storedKey(k Key) (driver.Key, error) {
	if db.keys == nil {
		return driver.Key(k), nil
	}
	scopeStored, idStored := keys.IsStoredPart(k.Scope), keys.IsStoredPart(k.ID)
	switch {
	case !scopeStored && len(k.Scope) >= len(keys.StoredMark) && k.Scope[:len(keys.StoredMark)] == keys.StoredMark,
		!idStored && len(k.ID) >= len(keys.StoredMark) && k.ID[:len(keys.StoredMark)] == keys.StoredMark:
		return driver.Key{}, fmt.Errorf("%w: with Options.HashKeys a scope or ID may not start with %q (the stored form's mark)", ErrInvalidKey, keys.StoredMark)
	case scopeStored && !idStored:
		return driver.Key{}, fmt.Errorf("%w: a stored scope with an ID as given (give the scope as given, or the stored ID)", ErrInvalidKey)
	}
	sk := driver.Key{Scope: db.storedScope(k.Scope), ID: k.ID}
	if !idStored {
		sk.ID = db.keys.Part("receipts key id\x00", k.Scope, k.ID, true)
	}
	return sk, nil
}

// shownKey is the key a listing shows for the stored key sk: sk, with scope in place of its
// hash if the caller named the scope (scope is not ""), as given.
func (db *DB) shownKey(sk driver.Key, scope string) Key {
	if db.keys != nil && scope != "" && !keys.IsStoredPart(scope) {
		return Key{Scope: scope, ID: sk.ID}
	}
	return Key(sk)
}

// openKeyForm settles the form of the store's keys at Open: hashed if the store records it,
// or if hash asks for it and the store holds no record and no tombstone yet (then it is
// recorded, under a hash key kr wraps if kr is not nil); as given otherwise. It returns nil
// for keys as given.
func openKeyForm(ctx context.Context, eng driver.Engine, hash bool, kr Keyring) (*keys.Hasher, error) {
	st, ok := eng.(driver.Settings)
	if !ok {
		if hash {
			return nil, fmt.Errorf("%w: Options.HashKeys: the %s engine records no settings", ErrUnsupported, eng.Name())
		}
		return nil, nil
	}
	v, found, err := st.Setting(ctx, keyFormSetting)
	if err != nil {
		return nil, err
	}
	switch {
	case found && string(v) == string(keyFormHashed):
		return keys.NewHasher(eng.Secret()), nil
	case found && string(v) == string(keyFormWrapped):
		return wrappedHasher(ctx, st, kr, nil)
	case found:
		return nil, fmt.Errorf("%w: the store's keys are kept in a form this version does not know (%q)", ErrUnknownFormat, v)
	case !hash:
		return nil, nil
	}
	for _, err := range eng.Scan(ctx, driver.Filter{Limit: 1}) {
		if err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("%w: Options.HashKeys on a store that holds records with their keys as given (their retries would no longer find them): create a new store with it", ErrInvalidOptions)
	}
	if tombs, ok := eng.(driver.Tombstones); ok {
		for _, err := range tombs.ScanTombstones(ctx, "", 1) {
			if err != nil {
				return nil, err
			}
			return nil, fmt.Errorf("%w: Options.HashKeys on a store that keeps tombstones of keys as given: create a new store with it", ErrInvalidOptions)
		}
	}
	form := keyFormHashed
	var kh *keys.Hasher
	if kr != nil {
		form = keyFormWrapped
		raw := make([]byte, 32)
		if _, err := rand.Read(raw); err != nil {
			return nil, err
		}
		if kh, err = wrappedHasher(ctx, st, kr, raw); err != nil {
			return nil, err
		}
	}
	if v, err = st.PutSetting(ctx, keyFormSetting, form); err != nil {
		return nil, err
	}
	switch {
	case string(v) == string(keyFormHashed):
		return keys.NewHasher(eng.Secret()), nil
	case string(v) == string(keyFormWrapped) && kh != nil:
		return kh, nil
	case string(v) == string(keyFormWrapped):
		return wrappedHasher(ctx, st, kr, nil)
	}
	return nil, fmt.Errorf("%w: the store's keys are kept in a form this version does not know (%q)", ErrUnknownFormat, v)
}

// wrappedHasher returns the hasher of the hash key kr wraps in the store: the one recorded,
// or raw, wrapped and recorded if none is (another node's, recorded first, wins).
func wrappedHasher(ctx context.Context, st driver.Settings, kr Keyring, raw []byte) (*keys.Hasher, error) {
	if kr == nil {
		return nil, fmt.Errorf("%w: the store's keys are hashed under a key its Keyring wraps: open it with Options.Keyring", ErrSealed)
	}
	w, found, err := st.Setting(ctx, hashKeySetting)
	if err != nil {
		return nil, err
	}
	if !found {
		if raw == nil {
			return nil, fmt.Errorf("%w: the store's hash key is missing", ErrCorrupt)
		}
		mine, err := kr.WrapKey(ctx, hashKeyID, raw)
		if err != nil {
			return nil, fmt.Errorf("receipts: wrap the store's hash key: %w", err)
		}
		if w, err = st.PutSetting(ctx, hashKeySetting, mine); err != nil {
			return nil, err
		}
	}
	if raw, err = kr.UnwrapKey(ctx, hashKeyID, w); err != nil {
		return nil, fmt.Errorf("receipts: unwrap the store's hash key: %w", err)
	}
	return keys.NewHasher(raw), nil
}

// rewrapHashKey wraps the store's hash key anew with kr (RewrapKeys); it reports whether
// there was one.
func rewrapHashKey(ctx context.Context, eng driver.Engine, kr Keyring) (bool, error) {
	st, ok := eng.(driver.Settings)
	if !ok {
		return false, nil
	}
	w, found, err := st.Setting(ctx, hashKeySetting)
	if err != nil || !found {
		return false, err
	}
	raw, err := kr.UnwrapKey(ctx, hashKeyID, w)
	if err != nil {
		return false, fmt.Errorf("receipts: rewrap: unwrap the store's hash key: %w", err)
	}
	nw, err := kr.WrapKey(ctx, hashKeyID, raw)
	if err != nil {
		return false, fmt.Errorf("receipts: rewrap: wrap the store's hash key: %w", err)
	}
	return st.SwapSetting(ctx, hashKeySetting, w, nw)
}
