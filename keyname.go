package receipts

import (
	"crypto/hmac"
	"crypto/sha256"
	"log/slog"

	"github.com/receiptstore/receipts/internal/keys"
)

// How the store names a key where it may not show it: in its errors and
// log records, and for observers (observe.Event.KeyHash). The stored form
// of a key (Options.HashKeys) is privacy.go's.

// keyHash is Event.KeyHash for k under hk.
func keyHash(hk []byte, k Key) string { return keys.Hash(hk, k.Scope, k.ID) }

// deriveHashKey derives the key that KeyHash uses from the store's secret,
// so that a key's hash is never its ProviderKey.
func deriveHashKey(secret []byte) []byte {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte("receipts/observer-key-hash/v1"))
	return mac.Sum(nil)
}

// LogKey is the attribute that names k in a log record the way the store's
// own records do: "key_hash" with k's keyed hash (as Event.KeyHash), or,
// with Options.LogKeys, "key" with k.String(). Front ends such as
// receipthttp and receiptmcp log keys with it, so that a store that keeps
// raw keys out of its logs keeps them out of theirs too.
func (db *DB) LogKey(k Key) slog.Attr {
	if db.opts.LogKeys {
		return slog.String("key", k.String())
	}
	return slog.String("key_hash", keyHash(db.hashKey, k))
}

// KeyName is how the store names k in the text of its errors: "key#" and
// k's keyed hash (the same hex digits as Event.KeyHash and LogKey), or, with
// Options.LogKeys, k.String(). Errors end up in logs, so they name keys the
// way the logs do; packages that wrap the store (pgstore.DoTx, front ends)
// use it for theirs. A nil db names k itself.
func (db *DB) KeyName(k Key) string { return db.keyName(k) }

// keyName is KeyName.
func (db *DB) keyName(k Key) string {
	if db == nil || db.opts.LogKeys {
		return k.String()
	}
	return "key#" + keyHash(db.hashKey, k)
}
