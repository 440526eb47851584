// Package uuidv7 mints UUIDs of version 7 (RFC 9562): the operation keys
// that receiptmcp.NewOperationKey and package intents hand out. Their mint
// time reads back with receipts.UUIDv7Time.
package uuidv7

import (
	"crypto/rand"
	"time"
)

// New returns a UUIDv7 for the time t in its canonical 36-character form:
// the first 48 bits are t in Unix milliseconds, the other 74 bits random.
// Keys minted later sort after keys minted earlier (to the millisecond).
func New(t time.Time) string {
	var b [16]byte
	_, _ = rand.Read(b[6:]) // never fails (crypto/rand)
	ms := uint64(t.UnixMilli())
	for i := range 6 {
		b[i] = byte(ms >> (40 - 8*i))
	}
	b[6] = 0x70 | b[6]&0x0f // version 7
	b[8] = 0x80 | b[8]&0x3f // variant 10
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 36)
	for i, c := range b {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			out = append(out, '-')
		}
		out = append(out, digits[c>>4], digits[c&0xf])
	}
	return string(out)
}
