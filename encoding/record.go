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
	"math"
	"sync"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/receiptstore/receipts/internal/mutate"
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

// AppendRecord appends the encoding of r to dst and returns the result.
//
// The body is written directly, byte for byte what msgpack's Encoder
// writes for it (EncodeArrayLen, EncodeBytes, EncodeUint, EncodeInt: the
// shortest form of each value), without an encoder, a buffer or a copy;
// the tests compare it with msgpack's on every record they fuzz.
func AppendRecord(dst []byte, r *Record) []byte {
	fields := bodyFields
	if len(r.Trace) > 0 {
		fields = traceFields
	}
	if len(r.Journal) > 0 {
		fields = stepFields
	}
	start := len(dst)
	dst = append(dst, RecordVersion, byte(r.State), 0x90|byte(fields)) // fixarray
	dst = appendBin(dst, r.Fingerprint)
	dst = appendBin(dst, r.Result)
	dst = appendUint(dst, uint64(r.Attempts))
	dst = appendUint(dst, r.Token)
	dst = appendInt(dst, r.CreatedAt)
	dst = appendInt(dst, r.UpdatedAt)
	dst = appendInt(dst, r.LeaseExpiresAt)
	if fields >= traceFields {
		dst = appendBin(dst, r.Trace)
	}
	if fields == stepFields {
		dst = appendBin(dst, r.Journal)
	}
	return binary.BigEndian.AppendUint32(dst, crc32.Checksum(dst[start:], castagnoli))
}

// msgpack codes the record's body uses.
const (
	codeNil    = 0xc0
	codeBin8   = 0xc4
	codeBin16  = 0xc5
	codeBin32  = 0xc6
	codeUint8  = 0xcc
	codeUint16 = 0xcd
	codeUint32 = 0xce
	codeUint64 = 0xcf
	codeInt8   = 0xd0
	codeInt16  = 0xd1
	codeInt32  = 0xd2
	codeInt64  = 0xd3
)

// appendBin is msgpack's EncodeBytes: nil, or bin 8, 16 or 32 and v.
func appendBin(dst, v []byte) []byte {
	switch n := len(v); {
	case v == nil:
		return append(dst, codeNil)
	case n < 1<<8:
		dst = append(dst, codeBin8, byte(n))
	case n < 1<<16:
		dst = binary.BigEndian.AppendUint16(append(dst, codeBin16), uint16(n))
	default:
		dst = binary.BigEndian.AppendUint32(append(dst, codeBin32), uint32(n))
	}
	return append(dst, v...)
}

// appendUint is msgpack's EncodeUint: a positive fixint, or uint 8, 16, 32
// or 64, the shortest that holds n.
func appendUint(dst []byte, n uint64) []byte {
	switch {
	case n <= 0x7f:
		return append(dst, byte(n))
	case n <= 0xff:
		return append(dst, codeUint8, byte(n))
	case n <= 0xffff:
		return binary.BigEndian.AppendUint16(append(dst, codeUint16), uint16(n))
	case n <= 0xffffffff:
		return binary.BigEndian.AppendUint32(append(dst, codeUint32), uint32(n))
	}
	return binary.BigEndian.AppendUint64(append(dst, codeUint64), n)
}

// appendInt is msgpack's EncodeInt: appendUint for n >= 0, otherwise a
// negative fixint, or int 8, 16, 32 or 64, the shortest that holds n.
func appendInt(dst []byte, n int64) []byte {
	switch {
	case n >= 0:
		return appendUint(dst, uint64(n))
	case n >= -32:
		return append(dst, byte(n))
	case n >= math.MinInt8:
		return append(dst, codeInt8, byte(n))
	case n >= math.MinInt16:
		return binary.BigEndian.AppendUint16(append(dst, codeInt16), uint16(n))
	case n >= math.MinInt32:
		return binary.BigEndian.AppendUint32(append(dst, codeInt32), uint32(n))
	}
	return binary.BigEndian.AppendUint64(append(dst, codeInt64), uint64(n))
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
func decodeRecord(r *Record, b []byte, shared bool) error {
	state, body, err := recordBody(b)
	if err != nil {
		return err
	}
	if decodeCanonical(r, state, body, shared) {
		return nil
	}
	return decodeMsgpack(r, state, body, shared)
}

// recordBody checks b's header and checksum and returns its state and body.
func recordBody(b []byte) (State, []byte, error) {
	state, err := PeekState(b)
	if err != nil {
		return 0, nil, err
	}
	if want, ok := Checksum(b); !ok {
		return 0, nil, corrupt("checksum mismatch (stored %08x)", want)
	}
	return state, b[headerLen : len(b)-trailerLen], nil
}

// decodeMsgpack decodes the body of a record in state into r with msgpack's
// decoder, aliasing body if shared.
func decodeMsgpack(r *Record, state State, body []byte, shared bool) (err error) {
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

// decodeCanonical is decodeRecord's body decoding for the bytes AppendRecord
// writes, without msgpack's decoder: it reads the body of a record in state
// into r (aliasing body if shared, as readBin does) and reports true only
// if body is well-formed, in the forms AppendRecord writes, and decodes to
// a record that decodeRecord's checks accept. Otherwise it reports false,
// r in an unspecified state, and the msgpack decoder decides (accepting
// the other forms msgpack reads, and giving the error of a corrupt body).
// So it changes what decodeRecord returns for no input: a body it accepts
// decodes to the same record either way (the fuzz tests compare them).
func decodeCanonical(r *Record, state State, body []byte, shared bool) bool {
	if len(body) == 0 || body[0] < 0x90|bodyFields || body[0] > 0x90|stepFields {
		return false
	}
	fields, i := int(body[0]&0x0f), 1
	var slab []byte
	if !shared {
		slab = make([]byte, 0, len(body))
	}
	var ok bool
	if r.Fingerprint, i, slab, ok = binCanonical(body, i, slab, shared); !ok || len(r.Fingerprint) == 0 {
		return false
	}
	if r.Result, i, slab, ok = binCanonical(body, i, slab, shared); !ok {
		return false
	}
	var u uint64
	if u, i, ok = uintCanonical(body, i); !ok || u > 1<<32-1 {
		return false
	}
	r.Attempts = uint32(u)
	if r.Token, i, ok = uintCanonical(body, i); !ok {
		return false
	}
	for _, t := range [...]*int64{&r.CreatedAt, &r.UpdatedAt, &r.LeaseExpiresAt} {
		if u, i, ok = uintCanonical(body, i); !ok || u > math.MaxInt64 {
			return false // a negative time (msgpack's decoder reads those)
		}
		*t = int64(u)
	}
	r.Trace, r.Journal = nil, nil
	if fields >= traceFields {
		if r.Trace, i, slab, ok = binCanonical(body, i, slab, shared); !ok || len(r.Trace) > MaxTrace || (len(r.Trace) == 0 && fields == traceFields) {
			return false
		}
		if len(r.Trace) == 0 {
			r.Trace = nil
		}
	}
	if fields == stepFields {
		if r.Journal, i, _, ok = binCanonical(body, i, slab, shared); !ok || len(r.Journal) == 0 {
			return false
		}
	}
	r.State = state
	return i == len(body)
}

// binCanonical is readBin for decodeCanonical: the nil or bin 8, 16 or 32
// value at body[i], and the index after it.
func binCanonical(body []byte, i int, slab []byte, shared bool) (v []byte, next int, rest []byte, ok bool) {
	if i >= len(body) {
		return nil, 0, slab, false
	}
	var n int
	switch body[i] {
	case codeNil:
		return nil, i + 1, slab, true
	case codeBin8:
		if i+2 > len(body) {
			return nil, 0, slab, false
		}
		n, i = int(body[i+1]), i+2
	case codeBin16:
		if i+3 > len(body) {
			return nil, 0, slab, false
		}
		n, i = int(binary.BigEndian.Uint16(body[i+1:])), i+3
	case codeBin32:
		if i+5 > len(body) {
			return nil, 0, slab, false
		}
		n, i = int(binary.BigEndian.Uint32(body[i+1:])), i+5
	default:
		return nil, 0, slab, false
	}
	if n > len(body)-i {
		return nil, 0, slab, false
	}
	if shared {
		return body[i : i+n : i+n], i + n, slab, true
	}
	v = slab[len(slab) : len(slab)+n : len(slab)+n]
	copy(v, body[i:i+n])
	return v, i + n, slab[len(slab)+n : len(slab)+n], true
}

// uintCanonical reads the positive fixint or uint 8, 16, 32 or 64 at
// body[i], and returns the index after it.
func uintCanonical(body []byte, i int) (u uint64, next int, ok bool) {
	if i >= len(body) {
		return 0, 0, false
	}
	switch c, v := body[i], body[i+1:]; {
	case c <= 0x7f:
		return uint64(c), i + 1, true
	case c == codeUint8 && len(v) >= 1:
		return uint64(v[0]), i + 2, true
	case c == codeUint16 && len(v) >= 2:
		if mutate.Name == mutate.RecCanon {
			return uint64(v[1]), i + 3, true
		}
		return uint64(binary.BigEndian.Uint16(v)), i + 3, true
	case c == codeUint32 && len(v) >= 4:
		return uint64(binary.BigEndian.Uint32(v)), i + 5, true
	case c == codeUint64 && len(v) >= 8:
		return binary.BigEndian.Uint64(v), i + 9, true
	}
	return 0, 0, false
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
