package encoding_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"testing"

	"github.com/receiptstore/receipts/encoding"
)

// A record stores a trace context as an optional eighth element: a record
// without one is encoded as before it existed (seven elements), one with
// one round-trips, RecordLayout reads both, and a trace that is empty or
// longer than MaxTrace is corrupt.
func TestRecordTrace(t *testing.T) {
	r := encoding.Record{State: encoding.StateSucceeded, Fingerprint: []byte("fp"), Result: []byte("result"),
		Attempts: 1, Token: 7, CreatedAt: 10, UpdatedAt: 20}
	plain := encoding.EncodeRecord(&r)
	if plain[2] != 0x97 {
		t.Fatalf("a record without a trace: body header %#x, want a fixarray of seven", plain[2])
	}
	r.Trace = []byte("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	traced := encoding.EncodeRecord(&r)
	if traced[2] != 0x98 {
		t.Fatalf("a record with a trace: body header %#x, want a fixarray of eight", traced[2])
	}
	for _, b := range [][]byte{plain, traced} {
		got, err := encoding.DecodeRecord(b)
		if err != nil {
			t.Fatal(err)
		}
		want := r
		if b[2] == 0x97 {
			want.Trace = nil
		}
		if !bytes.Equal(got.Trace, want.Trace) || !bytes.Equal(got.Result, want.Result) || got.Token != want.Token {
			t.Fatalf("round trip: %+v, want %+v", got, want)
		}
		l, err := encoding.RecordLayout(b)
		if err != nil || string(b[l.FpOff:l.FpOff+l.FpLen]) != "fp" || string(b[l.ResOff:l.ResOff+l.ResLen]) != "result" {
			t.Fatalf("layout %+v %v", l, err)
		}
	}
	// the eighth element rewritten: empty, and one byte over the bound
	for _, n := range []int{0, encoding.MaxTrace + 1} {
		body := append([]byte{}, traced[:len(traced)-4-len(r.Trace)-2]...) // up to the trace's bin header
		body = append(body, 0xc4, byte(n))
		if n > 255 {
			body = append(body[:len(body)-2], 0xc5, byte(n>>8), byte(n))
		}
		body = append(body, bytes.Repeat([]byte{'x'}, n)...)
		b := binary.BigEndian.AppendUint32(body, crc32.Checksum(body, crc32.MakeTable(crc32.Castagnoli)))
		if _, err := encoding.DecodeRecord(b); !errors.Is(err, encoding.ErrCorrupt) {
			t.Fatalf("trace of %d bytes: %v, want ErrCorrupt", n, err)
		}
	}
}
