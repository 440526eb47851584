package keys

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"hash"
	"sync"
)

// The stored form of keys under receipts' Options.HashKeys: each scope and ID
// is kept as a keyed hash under the store's secret (or a hash key the
// Keyring wraps), so that a copy of the store does not say who called what.

// StoredMark starts both parts of a stored key in HashKeys mode.
const StoredMark = "\x00h"

// StoredPartLen is the length of a stored scope or ID: the mark and 16 bytes in base64url.
const StoredPartLen = len(StoredMark) + 22

// IsStoredPart reports whether s is a stored scope or ID.
func IsStoredPart(s string) bool {
	if len(s) != StoredPartLen || s[:len(StoredMark)] != StoredMark {
		return false
	}
	_, err := base64.RawURLEncoding.DecodeString(s[len(StoredMark):])
	return err == nil
}

// Hasher computes stored key parts under one secret; its HMACs are pooled
// (each keyed once). It is safe for concurrent use.
type Hasher struct{ pool sync.Pool }

// NewHasher returns a Hasher keyed by secret.
func NewHasher(secret []byte) *Hasher {
	h := &Hasher{}
	h.pool.New = func() any { return hmac.New(sha256.New, secret) }
	return h
}

// Part returns the stored form of a scope (withScope false: scope alone) or
// of an ID within its scope (withScope true), under label, which keeps the
// two kinds apart: StoredMark and the first 16 bytes of the HMAC in
// base64url.
func (h *Hasher) Part(label string, scope, id string, withScope bool) string {
	mac := h.pool.Get().(hash.Hash)
	mac.Reset()
	mac.Write([]byte(label))
	if withScope {
		mac.Write([]byte{byte(len(scope))})
		mac.Write([]byte(scope))
		mac.Write([]byte(id))
	} else {
		mac.Write([]byte(scope))
	}
	var sum [sha256.Size]byte
	mac.Sum(sum[:0])
	h.pool.Put(mac)
	b := make([]byte, StoredPartLen)
	copy(b, StoredMark)
	base64.RawURLEncoding.Encode(b[len(StoredMark):], sum[:16])
	return string(b)
}
