package encoding

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"

	"github.com/vmihailenco/msgpack/v5"
)

// StoreFormat is the store format this version writes and understands.
const StoreFormat = 1

// Meta is the store's meta record, written once when the store is created.
type Meta struct {
	Format     int    `msgpack:"format"`
	EpochWidth int64  `msgpack:"epoch_width"` // nanoseconds
	Secret     []byte `msgpack:"secret"`      // keys ProviderKey digests
	CreatedAt  int64  `msgpack:"created_at"`  // Unix nanoseconds
}

const metaMagic = 'R'

// EncodeMeta encodes m: magic | format | msgpack map | CRC-32C.
func EncodeMeta(m *Meta) ([]byte, error) {
	body, err := msgpack.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encoding: meta: %w", err)
	}
	b := append([]byte{metaMagic, byte(m.Format)}, body...)
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, castagnoli)), nil
}

// DecodeMeta decodes a meta record. The format byte is checked before the
// body, so a store of a newer format is recognised as such (Meta.Format is
// set and the error is nil, with other fields zero) even if its body is laid
// out differently.
func DecodeMeta(b []byte) (*Meta, error) {
	if len(b) < 2+1+trailerLen || b[0] != metaMagic {
		return nil, corrupt("meta of %d bytes is malformed", len(b))
	}
	n := len(b) - trailerLen
	if crc32.Checksum(b[:n], castagnoli) != binary.BigEndian.Uint32(b[n:]) {
		return nil, corrupt("meta checksum mismatch")
	}
	if int(b[1]) != StoreFormat {
		return &Meta{Format: int(b[1])}, nil
	}
	m := new(Meta)
	if err := msgpack.Unmarshal(b[2:n], m); err != nil {
		return nil, corrupt("meta body: %v", err)
	}
	if m.Format != StoreFormat || m.EpochWidth <= 0 || len(m.Secret) < 16 {
		return nil, corrupt("meta fields out of range (format %d, epoch width %d, secret %d bytes)", m.Format, m.EpochWidth, len(m.Secret))
	}
	return m, nil
}

// EncodeUint64 encodes a counter (token ceiling, GC floor).
func EncodeUint64(v uint64) []byte {
	b := binary.BigEndian.AppendUint64(nil, v)
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// DecodeUint64 decodes what EncodeUint64 wrote.
func DecodeUint64(b []byte) (uint64, error) {
	if len(b) != 8+trailerLen {
		return 0, corrupt("counter of %d bytes", len(b))
	}
	if crc32.Checksum(b[:8], castagnoli) != binary.BigEndian.Uint32(b[8:]) {
		return 0, corrupt("counter checksum mismatch")
	}
	return binary.BigEndian.Uint64(b), nil
}
