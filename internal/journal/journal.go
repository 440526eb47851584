// Package journal is the stored form of a claim's step journal (receipts.Lease.Step): the
// steps an action has finished, in order. The root encodes it and hands the bytes to its
// engine (driver.Journals), which stores them with the claim's record.
//
//	version (1 byte, 1) | count (uvarint) | count × entry
//	entry: name (uvarint length, bytes) | fingerprint (uvarint length, bytes) |
//	       state (1 byte: 1 started, 2 succeeded, 3 failed) | token (uvarint) | at (varint, Unix ns) |
//	       result (uvarint length, bytes)
//
// A result is stored as the root wrote it: in the clear, or sealed under its scope's data
// key for the token that recorded it (Options.Keyring). Decode never panics and checks
// every declared length against the bytes that are there: malformed input is an error
// wrapping driver.ErrCorrupt.
package journal

import (
	"encoding/binary"
	"fmt"

	"github.com/receiptstore/receipts/driver"
)

// Version is the journal format this package writes.
const Version = 1

// Entry is one step: finished, or (the last entry only) started with no outcome yet.
type Entry struct {
	Name        string
	Fingerprint []byte
	State       driver.State // Succeeded or Failed; Pending: started
	Token       uint64       // the lease that recorded it
	At          int64        // when it was recorded, Unix nanoseconds
	Result      []byte       // as stored
}

// Size is the number of bytes e takes in an encoded journal.
func (e *Entry) Size() int {
	return uvarintLen(uint64(len(e.Name))) + len(e.Name) + uvarintLen(uint64(len(e.Fingerprint))) + len(e.Fingerprint) +
		1 + uvarintLen(e.Token) + binary.MaxVarintLen64 + uvarintLen(uint64(len(e.Result))) + len(e.Result)
}

func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

// Append appends the encoding of entries to dst.
func Append(dst []byte, entries []Entry) []byte {
	dst = append(dst, Version)
	dst = binary.AppendUvarint(dst, uint64(len(entries)))
	for i := range entries {
		e := &entries[i]
		dst = binary.AppendUvarint(dst, uint64(len(e.Name)))
		dst = append(dst, e.Name...)
		dst = binary.AppendUvarint(dst, uint64(len(e.Fingerprint)))
		dst = append(dst, e.Fingerprint...)
		dst = append(dst, byte(e.State))
		dst = binary.AppendUvarint(dst, e.Token)
		dst = binary.AppendVarint(dst, e.At)
		dst = binary.AppendUvarint(dst, uint64(len(e.Result)))
		dst = append(dst, e.Result...)
	}
	return dst
}

// Decode decodes a journal. Nil or empty bytes are an empty journal. The entries alias b.
func Decode(b []byte) ([]Entry, error) {
	if len(b) == 0 {
		return nil, nil
	}
	if b[0] != Version {
		return nil, corrupt("unknown version %d", b[0])
	}
	d := decoder{b: b[1:]}
	n := d.uvarint()
	if d.err == nil && n > uint64(len(d.b))/5 { // an entry takes at least 5 bytes
		return nil, corrupt("%d entries in %d bytes", n, len(d.b))
	}
	entries := make([]Entry, 0, n)
	for i := uint64(0); i < n && d.err == nil; i++ {
		var e Entry
		e.Name = string(d.bytes())
		e.Fingerprint = d.bytes()
		e.State = driver.State(d.byte())
		e.Token = d.uvarint()
		e.At = d.varint()
		e.Result = d.bytes()
		if d.err == nil && e.State != driver.Succeeded && e.State != driver.Failed &&
			(e.State != driver.Pending || i != n-1) {
			return nil, corrupt("entry %d of %d: state %d", i, n, e.State)
		}
		if d.err == nil && e.Name == "" {
			return nil, corrupt("entry %d: empty name", i)
		}
		entries = append(entries, e)
	}
	if d.err != nil {
		return nil, d.err
	}
	if len(d.b) != 0 {
		return nil, corrupt("%d trailing bytes", len(d.b))
	}
	return entries, nil
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = corrupt("bad uvarint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.err = corrupt("bad varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) byte() byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) == 0 {
		d.err = corrupt("truncated")
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.err = corrupt("a length of %d with %d bytes left", n, len(d.b))
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func corrupt(format string, args ...any) error {
	return fmt.Errorf("%w: step journal: %s", driver.ErrCorrupt, fmt.Sprintf(format, args...))
}
