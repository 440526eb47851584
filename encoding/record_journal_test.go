package encoding_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/receiptstore/receipts/encoding"
)

// TestRecordJournal: a record with a step journal keeps it (with a trace or without), and
// one without is encoded as before the field existed.
func TestRecordJournal(t *testing.T) {
	base := encoding.Record{State: encoding.StatePending, Fingerprint: []byte("fp"), Attempts: 2, Token: 9, CreatedAt: 1, UpdatedAt: 2, LeaseExpiresAt: 3}
	plain := encoding.EncodeRecord(&base)
	for _, trace := range [][]byte{nil, []byte("00-trace")} {
		r := base
		r.Trace, r.Journal = trace, []byte{1, 0}
		b := encoding.EncodeRecord(&r)
		got, err := encoding.DecodeRecord(b)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Journal, r.Journal) || !bytes.Equal(got.Trace, trace) || (trace == nil) != (got.Trace == nil) {
			t.Fatalf("trace %q: got journal %x trace %q", trace, got.Journal, got.Trace)
		}
		r.Journal = nil
		if trace == nil && !bytes.Equal(encoding.EncodeRecord(&r), plain) {
			t.Fatal("a record without a journal is not encoded as before")
		}
	}
	// An empty journal field is corrupt (the field is written only for a journal).
	r := base
	r.Journal = []byte{1}
	b := encoding.EncodeRecord(&r)
	i := bytes.LastIndex(b, []byte{0xc4, 1, 1}) // bin8 of one byte
	if i < 0 {
		t.Fatal("journal not found in the encoding")
	}
	bad := fixCRC(append(append(append([]byte{}, b[:i]...), 0xc4, 0), b[i+3:]...))
	if _, err := encoding.DecodeRecord(bad); !errors.Is(err, encoding.ErrCorrupt) {
		t.Fatalf("empty journal: %v", err)
	}
}
