// Package encoding holds the on-disk form of receipts records and the
// canonical fingerprint of an intent.
//
// A record is versioned and checksummed:
//
//	version (1 byte) | state (1 byte) | msgpack array body | CRC-32C (4 bytes, big-endian)
//
// The body of version 1 is a msgpack array of seven elements:
// fingerprint (bin), result (bin or nil), attempts (uint), token (uint),
// created, updated and lease-expiry times (int, Unix nanoseconds), and, on a
// record that stores one, an eighth: its trace context (bin, 1 to MaxTrace
// bytes), and on a record that stores a step journal, a ninth: the journal
// (bin, non-empty; its trace then is nil when it has none). A record without
// a trace or a journal is encoded exactly as before those elements existed.
//
// Decode never panics and never allocates by a length that the bytes declare
// before checking it against the bytes that are there: every malformed input
// returns an error wrapping ErrCorrupt.
package encoding

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"sync"

	"github.com/vmihailenco/msgpack/v5"
)

// RecordVersion is the record format this package writes.
const RecordVersion = 1

// State is a record's state as stored (same values as receipts.State).
type State uint8

// Record states.
const (
	StatePending State = iota + 1
	StateSucceeded
	StateFailed
)

// Valid reports whether s is one of the stored states.
func (s State) Valid() bool { return s >= StatePending && s <= StateFailed }

// ErrCorrupt is wrapped by every decoding error.
var ErrCorrupt = errors.New("encoding: corrupt record")

// Record is one receipt or claim as stored. Times are Unix nanoseconds.
type Record struct {
	State          State
	Fingerprint    []byte
	Result         []byte
	Attempts       uint32
	Token          uint64
	CreatedAt      int64
	UpdatedAt      int64
	LeaseExpiresAt int64
	// Trace is the trace context stored with the record (at most MaxTrace
	// bytes), or nil.
	Trace []byte
	// Journal is the record's step journal (opaque here), or nil.
	Journal []byte
}

// MaxTrace bounds Record.Trace.
const MaxTrace = 256

const (
	headerLen   = 2
	trailerLen  = 4
	bodyFields  = 7                          // without a trace
	traceFields = 8                          // with one
	stepFields  = 9                          // with a journal (and a trace, maybe nil)
	minEncoding = headerLen + 1 + trailerLen // at least an array header
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// AppendRecord appends the encoding of r to dst and returns the result.
func AppendRecord(dst []byte, r *Record) []byte {
	buf := bufPool.Get().(*bytes.Buffer)
	buf.Reset()
	enc := msgpack.GetEncoder()
	enc.Reset(buf)
	enc.UseCompactInts(true)
	// Writing to a bytes.Buffer cannot fail.
	fields := bodyFields
	if len(r.Trace) > 0 {
		fields = traceFields
	}
	if len(r.Journal) > 0 {
		fields = stepFields
	}
	_ = enc.EncodeArrayLen(fields)
	_ = enc.EncodeBytes(r.Fingerprint)
	_ = enc.EncodeBytes(r.Result)
	_ = enc.EncodeUint(uint64(r.Attempts))
	_ = enc.EncodeUint(r.Token)
	_ = enc.EncodeInt(r.CreatedAt)
	_ = enc.EncodeInt(r.UpdatedAt)
	_ = enc.EncodeInt(r.LeaseExpiresAt)
	if fields >= traceFields {
		_ = enc.EncodeBytes(r.Trace)
	}
	if fields == stepFields {
		_ = enc.EncodeBytes(r.Journal)
	}
	msgpack.PutEncoder(enc)

	start := len(dst)
	dst = append(dst, RecordVersion, byte(r.State))
	dst = append(dst, buf.Bytes()...)
	bufPool.Put(buf)
	return binary.BigEndian.AppendUint32(dst, crc32.Checksum(dst[start:], castagnoli))
}

// EncodeRecord returns the encoding of r.
func EncodeRecord(r *Record) []byte {
	return AppendRecord(make([]byte, 0, 64+len(r.Fingerprint)+len(r.Result)+len(r.Trace)+len(r.Journal)), r)
}

func corrupt(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrCorrupt, fmt.Sprintf(format, args...))
}

// PeekState returns the state of an encoded record after checking only its
// length, version and state byte (not the checksum). Use DecodeRecord for
// anything that is exposed to a caller.
func PeekState(b []byte) (State, error) {
	if len(b) < minEncoding {
		return 0, corrupt("record of %d bytes is too short", len(b))
	}
	if b[0] != RecordVersion {
		return 0, corrupt("unknown record version %d", b[0])
	}
	s := State(b[1])
	if !s.Valid() {
		return 0, corrupt("unknown state %d", b[1])
	}
	return s, nil
}

// DecodeRecord decodes b into a new Record. The result does not alias b.
func DecodeRecord(b []byte) (*Record, error) {
	r := new(Record)
	if err := DecodeRecordInto(r, b); err != nil {
		return nil, err
	}
	return r, nil
}

// decoder is a pooled msgpack decoder with its reader.
type decoder struct {
	rd  bytes.Reader
	dec *msgpack.Decoder
}

var decoderPool = sync.Pool{New: func() any {
	d := &decoder{}
	d.dec = msgpack.NewDecoder(&d.rd)
	return d
}}

// DecodeRecordInto decodes b into r. On error r is left in an unspecified
// state. The result does not alias b: the fingerprint and result share one
// new allocation of at most len(b) bytes.
func DecodeRecordInto(r *Record, b []byte) error { return decodeRecord(r, b, false) }

// DecodeRecordShared is DecodeRecordInto without the copy: r's fingerprint,
// result and trace alias b (capacity-limited). For bytes that are never
// modified while r, or anything made from it, is in use.
func DecodeRecordShared(r *Record, b []byte) error { return decodeRecord(r, b, true) }

// decodeRecord is DecodeRecordInto, aliasing b if shared.
func decodeRecord(r *Record, b []byte, shared bool) (err error) {
	state, err := PeekState(b)
	if err != nil {
		return err
	}
	n := len(b) - trailerLen
	if want, ok := Checksum(b); !ok {
		return corrupt("checksum mismatch (stored %08x)", want)
	}
	body := b[headerLen:n]
	d := decoderPool.Get().(*decoder)
	d.rd.Reset(body)
	d.dec.Reset(&d.rd)
	defer func() {
		d.rd.Reset(nil)
		decoderPool.Put(d)
	}()
	dec, rd := d.dec, &d.rd
	// The decoder is only ever asked for scalar values and lengths, which
	// cannot panic; guard anyway, since a panic here would take the service
	// down on a corrupt disk.
	defer func() {
		if p := recover(); p != nil {
			err = corrupt("decoder panic: %v", p)
		}
	}()

	fields, err := dec.DecodeArrayLen()
	if err != nil {
		return corrupt("body: %v", err)
	}
	if fields < bodyFields || fields > stepFields {
		return corrupt("body has %d fields, want %d to %d", fields, bodyFields, stepFields)
	}
	r.State = state
	var slab []byte // shared: nil, the values alias body
	if !shared {
		slab = make([]byte, 0, len(body))
	}
	if r.Fingerprint, slab, err = readBin(dec, rd, slab, body, shared); err != nil {
		return corrupt("fingerprint: %v", err)
	}
	if r.Result, slab, err = readBin(dec, rd, slab, body, shared); err != nil {
		return corrupt("result: %v", err)
	}
	attempts, err := dec.DecodeUint64()
	if err != nil {
		return corrupt("attempts: %v", err)
	}
	if attempts > 1<<32-1 {
		return corrupt("attempts %d out of range", attempts)
	}
	r.Attempts = uint32(attempts)
	if r.Token, err = dec.DecodeUint64(); err != nil {
		return corrupt("token: %v", err)
	}
	if r.CreatedAt, err = dec.DecodeInt64(); err != nil {
		return corrupt("created: %v", err)
	}
	if r.UpdatedAt, err = dec.DecodeInt64(); err != nil {
		return corrupt("updated: %v", err)
	}
	if r.LeaseExpiresAt, err = dec.DecodeInt64(); err != nil {
		return corrupt("lease expiry: %v", err)
	}
	r.Trace, r.Journal = nil, nil
	if fields >= traceFields {
		if r.Trace, slab, err = readBin(dec, rd, slab, body, shared); err != nil {
			return corrupt("trace: %v", err)
		}
		if len(r.Trace) > MaxTrace || (len(r.Trace) == 0 && fields == traceFields) {
			return corrupt("trace of %d bytes (want 1 to %d)", len(r.Trace), MaxTrace)
		}
		if len(r.Trace) == 0 {
			r.Trace = nil
		}
	}
	if fields == stepFields {
		if r.Journal, _, err = readBin(dec, rd, slab, body, shared); err != nil {
			return corrupt("journal: %v", err)
		}
		if len(r.Journal) == 0 {
			return corrupt("empty journal")
		}
	}
	if rd.Len() != 0 {
		return corrupt("%d trailing bytes", rd.Len())
	}
	if len(r.Fingerprint) == 0 {
		return corrupt("empty fingerprint")
	}
	return nil
}

// readBin reads a msgpack bin (or nil) value into the free capacity of
// slab, checking the declared length against the bytes left first. It
// returns the value (full-capacity-limited, so appends never spill into the
// next value) and the rest of slab. If shared, the value is not copied: it
// is body's bytes (rd reads body, directly: the decoder does not buffer a
// bytes.Reader).
func readBin(dec *msgpack.Decoder, rd *bytes.Reader, slab, body []byte, shared bool) (v, rest []byte, err error) {
	n, err := dec.DecodeBytesLen()
	if err != nil {
		return nil, slab, err
	}
	if n < 0 {
		return nil, slab, nil
	}
	if shared {
		if n > rd.Len() {
			return nil, slab, fmt.Errorf("declared length %d exceeds the %d bytes left", n, rd.Len())
		}
		at := len(body) - rd.Len()
		if _, err := rd.Seek(int64(n), io.SeekCurrent); err != nil {
			return nil, slab, err
		}
		return body[at : at+n : at+n], slab, nil
	}
	if n > rd.Len() || n > cap(slab)-len(slab) {
		return nil, slab, fmt.Errorf("declared length %d exceeds the %d bytes left", n, rd.Len())
	}
	v = slab[len(slab) : len(slab)+n : len(slab)+n]
	if err := dec.ReadFull(v); err != nil {
		return nil, slab, err
	}
	return v, slab[len(slab)+n : len(slab)+n], nil
}

// Checksum returns the checksum stored in the encoded record b and whether
// it matches b's content. It does not decode b.
func Checksum(b []byte) (crc uint32, ok bool) {
	crc, ok = StoredChecksum(b)
	return crc, ok && crc32.Checksum(b[:len(b)-trailerLen], castagnoli) == crc
}

// StoredChecksum returns the checksum stored in the encoded record b,
// without checking it against b's content (ok is false if b is too short
// to be a record). For bytes known intact: just encoded, or decoded.
func StoredChecksum(b []byte) (crc uint32, ok bool) {
	if len(b) < minEncoding {
		return 0, false
	}
	return binary.BigEndian.Uint32(b[len(b)-trailerLen:]), true
}

// Layout is where the fingerprint and the result lie in an encoded record:
// b[FpOff:FpOff+FpLen] and b[ResOff:ResOff+ResLen] (ResNil: the result is
// nil).
type Layout struct {
	FpOff, FpLen, ResOff, ResLen uint32
	ResNil                       bool
}

// RecordLayout locates the fingerprint and the result in the encoded record
// b without decoding the rest. It checks only what it reads; use it on
// records that DecodeRecord accepts.
func RecordLayout(b []byte) (Layout, error) {
	var l Layout
	i := headerLen
	if len(b) <= i || (b[i] != 0x90|bodyFields && b[i] != 0x90|traceFields) { // fixarray of seven or eight
		return l, corrupt("body is not an array of %d or %d", bodyFields, traceFields)
	}
	i++
	off, n, isNil, err := binAt(b, i)
	if err != nil || isNil {
		return l, corrupt("fingerprint is not a bin")
	}
	l.FpOff, l.FpLen = uint32(off), uint32(n)
	if off, n, isNil, err = binAt(b, off+n); err != nil {
		return l, corrupt("result: %v", err)
	}
	l.ResOff, l.ResLen, l.ResNil = uint32(off), uint32(n), isNil
	return l, nil
}

// binAt reads the msgpack bin (or nil) header at b[i] and returns where its
// payload lies, checked against len(b).
func binAt(b []byte, i int) (off, n int, isNil bool, err error) {
	if i >= len(b) {
		return 0, 0, false, corrupt("truncated")
	}
	switch c := b[i]; c {
	case 0xc0:
		return i + 1, 0, true, nil
	case 0xc4:
		if i+2 > len(b) {
			return 0, 0, false, corrupt("truncated")
		}
		off, n = i+2, int(b[i+1])
	case 0xc5:
		if i+3 > len(b) {
			return 0, 0, false, corrupt("truncated")
		}
		off, n = i+3, int(binary.BigEndian.Uint16(b[i+1:]))
	case 0xc6:
		if i+5 > len(b) {
			return 0, 0, false, corrupt("truncated")
		}
		off, n = i+5, int(binary.BigEndian.Uint32(b[i+1:]))
	default:
		return 0, 0, false, corrupt("code %#x is not a bin", c)
	}
	if n > len(b)-off {
		return 0, 0, false, corrupt("bin of %d bytes, %d left", n, len(b)-off)
	}
	return off, n, false, nil
}
