package encoding

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"github.com/vmihailenco/msgpack/v5"
)

// StoreFormat is the store format this version writes.
//
// Format 2 adds Retention and LeaseTTL to the meta record; records and keys
// are laid out as in format 1. A format-1 store is read (its meta has no
// Retention or LeaseTTL) and rewritten as format 2 by the first writable
// open; a version that reads only format 1 refuses a format-2 store with its
// unknown-format error rather than misreading it.
//
// Format 3 adds tombstones: the meta record holds the TombstoneWindow in
// force (negative: none kept), and every record write also writes or
// moves the key's tombstone marker (internal/keys.AppendMarker). A
// version that reads only formats 1 and 2 would neither see markers nor
// move them with their records, so it must refuse a format-3 store. A
// store of format 1 or 2 is migrated by the first writable open: a marker
// is written for every record it holds, then the meta as format 3.
//
// Format 4 writes markers in bulk, off the write path: no record write
// writes a marker; GC, before it drops an epoch's records, writes a marker
// for every one of them (an sstable ingested into Pebble), so a dropped
// epoch's keys keep their tombstones. A version that reads formats up to 3
// would drop epochs without writing their markers, so it must refuse a
// format-4 store. A store of format 3 is opened as it is (the markers it
// keeps beside live records are moved and deleted with them, as format 3
// does, and GC writes them again), and one of format 1 or 2 needs nothing
// written: GC writes its markers when it drops its epochs.
//
// Format 5 adds step journals (receipts' Lease.Step): a record may carry a
// ninth element, its journal. A version that reads formats up to 4 would
// take such a record for corrupt, and its Release would delete a claim whose
// steps happened, so it must refuse a format-5 store. A store of format 1
// to 4 needs nothing written but its meta, rewritten as format 5 by the
// first writable open.
const StoreFormat = 5

// MinStoreFormat is the oldest store format this version reads.
const MinStoreFormat = 1

// Meta is the store's meta record, written when the store is created and
// again whenever it is opened with another Retention or LeaseTTL.
type Meta struct {
	Format     int    `msgpack:"format"`
	EpochWidth int64  `msgpack:"epoch_width"` // nanoseconds
	Secret     []byte `msgpack:"secret"`      // keys ProviderKey digests
	CreatedAt  int64  `msgpack:"created_at"`  // Unix nanoseconds
	// Retention and LeaseTTL are the options in force (nanoseconds): set
	// (positive) in format 2, absent (zero) in format 1.
	Retention int64 `msgpack:"retention,omitempty"`
	LeaseTTL  int64 `msgpack:"lease_ttl,omitempty"`
	// TombstoneWindow is the tombstone window in force (nanoseconds;
	// negative: tombstones are off): set (non-zero) in format 3, absent
	// (zero) before.
	TombstoneWindow int64 `msgpack:"tombstone_window,omitempty"`
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

// DecodeMeta decodes a meta record of a format from MinStoreFormat to
// StoreFormat. The format byte is checked before the body, so a store of
// another format is recognised as such (Meta.Format is set and the error is
// nil, with other fields zero) even if its body is laid out differently.
func DecodeMeta(b []byte) (*Meta, error) {
	if len(b) < 2+1+trailerLen || b[0] != metaMagic {
		return nil, corrupt("meta of %d bytes is malformed", len(b))
	}
	n := len(b) - trailerLen
	if crc32.Checksum(b[:n], castagnoli) != binary.BigEndian.Uint32(b[n:]) {
		return nil, corrupt("meta checksum mismatch")
	}
	format := int(b[1])
	if format < MinStoreFormat || format > StoreFormat {
		return &Meta{Format: format}, nil
	}
	m, err := decodeMetaBody(b[2:n])
	if err != nil {
		return nil, corrupt("meta body: %v", err)
	}
	if m.Format != format || m.EpochWidth <= 0 || len(m.Secret) < 16 {
		return nil, corrupt("meta fields out of range (format %d, epoch width %d, secret %d bytes)", m.Format, m.EpochWidth, len(m.Secret))
	}
	switch {
	case format == 1 && (m.Retention != 0 || m.LeaseTTL != 0):
		return nil, corrupt("format 1 meta with retention or lease TTL")
	case format >= 2 && (m.Retention <= 0 || m.LeaseTTL <= 0 || m.LeaseTTL >= m.Retention):
		return nil, corrupt("meta retention %d, lease TTL %d out of range", m.Retention, m.LeaseTTL)
	case format < 3 && m.TombstoneWindow != 0:
		return nil, corrupt("format %d meta with a tombstone window", format)
	case format >= 3 && m.TombstoneWindow == 0:
		return nil, corrupt("format %d meta without a tombstone window", format)
	}
	return m, nil
}

// EncodeUint64 encodes a counter (token ceiling, GC floor) or a tombstone
// marker's time.
func EncodeUint64(v uint64) []byte { return AppendUint64(nil, v) }

// AppendUint64 appends EncodeUint64(v) to dst.
func AppendUint64(dst []byte, v uint64) []byte {
	n := len(dst)
	dst = binary.BigEndian.AppendUint64(dst, v)
	return binary.BigEndian.AppendUint32(dst, crc32.Checksum(dst[n:], castagnoli))
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

// decodeMetaBody decodes the msgpack map that EncodeMeta writes. It does not
// use msgpack.Unmarshal, which allocates whatever length a corrupt header
// declares (up to 4 GiB for a bin32): every length is checked against the
// bytes that are there first. A field no format this version reads knows is
// corrupt (a new field means a new format).
func decodeMetaBody(body []byte) (m *Meta, err error) {
	rd := bytes.NewReader(body)
	dec := msgpack.NewDecoder(rd)
	defer func() {
		if p := recover(); p != nil {
			m, err = nil, fmt.Errorf("decoder panic: %v", p)
		}
	}()
	fields, err := dec.DecodeMapLen()
	if err != nil {
		return nil, err
	}
	if fields < 0 || fields > rd.Len() {
		return nil, fmt.Errorf("map of %d fields in %d bytes", fields, rd.Len())
	}
	m = new(Meta)
	for range fields {
		name, err := readMetaBytes(dec, rd, 32)
		if err != nil {
			return nil, fmt.Errorf("field name: %w", err)
		}
		switch string(name) {
		case "format":
			m.Format, err = dec.DecodeInt()
		case "epoch_width":
			m.EpochWidth, err = dec.DecodeInt64()
		case "secret":
			m.Secret, err = readMetaBytes(dec, rd, rd.Len())
		case "created_at":
			m.CreatedAt, err = dec.DecodeInt64()
		case "retention":
			m.Retention, err = dec.DecodeInt64()
		case "lease_ttl":
			m.LeaseTTL, err = dec.DecodeInt64()
		case "tombstone_window":
			m.TombstoneWindow, err = dec.DecodeInt64()
		default:
			err = errors.New("unknown field")
		}
		if err != nil {
			return nil, fmt.Errorf("field %q: %w", name, err)
		}
	}
	if rd.Len() != 0 {
		return nil, fmt.Errorf("%d trailing bytes", rd.Len())
	}
	return m, nil
}

// readMetaBytes reads a msgpack str, bin or nil of at most limit bytes,
// checking the declared length before allocating.
func readMetaBytes(dec *msgpack.Decoder, rd *bytes.Reader, limit int) ([]byte, error) {
	n, err := dec.DecodeBytesLen()
	if err != nil {
		return nil, err
	}
	if n < 0 {
		return nil, nil
	}
	if n > rd.Len() || n > limit {
		return nil, fmt.Errorf("declared length %d, %d bytes left (limit %d)", n, rd.Len(), limit)
	}
	out := make([]byte, n)
	if err := dec.ReadFull(out); err != nil {
		return nil, err
	}
	return out, nil
}
