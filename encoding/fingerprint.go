package encoding

import (
	"bytes"
	"crypto/sha256"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// FingerprintSize is the length of what Fingerprint returns.
const FingerprintSize = sha256.Size

// Fingerprint returns the SHA-256 digest of the canonical msgpack encoding of
// v: map keys sorted, integers in their most compact form (so int8(1) and
// int64(1) agree), structs as their msgpack form. Use it as the fingerprint of
// an intent: the arguments of the action a key stands for. Two values that
// differ only in map order fingerprint the same; the raw arguments are never
// stored.
//
// Floating-point numbers keep their type: 1 and 1.0 differ. Callers that
// receive numbers as JSON should normalise them first (for example decode
// with json.Number and convert integral values to int64).
func Fingerprint(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.SetSortMapKeys(true)
	enc.UseCompactInts(true)
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("encoding: fingerprint: %w", err)
	}
	sum := sha256.Sum256(buf.Bytes())
	return sum[:], nil
}
