package encoding_test

import (
	"bytes"
	"math"
	"testing"

	"github.com/receiptstore/receipts/encoding"
)

// TestRecordCodecMatchesMsgpack: AppendRecord writes what msgpack's encoder
// writes, and the decoders decode what it wrote (and every one-byte change
// of it, checksum fixed up) as msgpack's decoder does, at each boundary of
// msgpack's integer and bin forms, with and without a trace and a journal.
func TestRecordCodecMatchesMsgpack(t *testing.T) {
	uints := []uint64{0, 1, 0x7f, 0x80, 0xff, 0x100, 0xffff, 0x10000, math.MaxUint32, math.MaxUint32 + 1, math.MaxInt64, math.MaxInt64 + 1, math.MaxUint64}
	ints := []int64{0, 1, 0x7f, 0x80, 0xffff, 0x10000, math.MaxUint32 + 1, math.MaxInt64, -1, -32, -33, -128, -129, -32768, -32769, math.MinInt32, math.MinInt32 - 1, math.MinInt64}
	bins := [][]byte{nil, {}, {1}, bytes.Repeat([]byte{2}, 255), bytes.Repeat([]byte{3}, 256), bytes.Repeat([]byte{4}, 65535), bytes.Repeat([]byte{5}, 65536)}
	var recs []*encoding.Record
	for i, u := range uints {
		n := ints[i%len(ints)]
		recs = append(recs, &encoding.Record{State: encoding.State(i%3 + 1), Fingerprint: []byte("fp"), Attempts: uint32(u), Token: u,
			CreatedAt: n, UpdatedAt: ints[(i+1)%len(ints)], LeaseExpiresAt: ints[(i+2)%len(ints)]})
	}
	for _, n := range ints {
		recs = append(recs, &encoding.Record{State: encoding.StatePending, Fingerprint: []byte{9}, Attempts: 1, Token: 7, CreatedAt: n, UpdatedAt: n, LeaseExpiresAt: n})
	}
	for i, b := range bins {
		for _, trace := range [][]byte{nil, []byte("t"), bytes.Repeat([]byte{'x'}, encoding.MaxTrace)} {
			for _, journal := range [][]byte{nil, {1, 0}, b} {
				recs = append(recs, &encoding.Record{State: encoding.StateSucceeded, Fingerprint: bins[max(i, 2)], Result: b, Attempts: 2, Token: 1 << 40,
					CreatedAt: 1 << 60, UpdatedAt: 1 << 61, LeaseExpiresAt: 1 << 62, Trace: trace, Journal: journal})
			}
		}
	}
	for _, r := range recs {
		enc := encoding.EncodeRecord(r)
		checkEncoding(t, r, enc)
		checkDecoders(t, enc)
		if len(enc) > 1024 {
			continue
		}
		for i := range enc {
			for _, x := range []byte{0x01, 0x80, 0xff} {
				b := append([]byte{}, enc...)
				b[i] ^= x
				checkDecoders(t, b)
				checkDecoders(t, fixCRC(b))
			}
		}
		for n := range enc {
			checkDecoders(t, fixCRC(enc[:n]))
		}
	}
}
