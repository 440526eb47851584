package encoding_test

// Fuzz targets for the on-disk decoders. Each decoder must never panic, must
// mark every failure as ErrCorrupt, must not allocate more than a small
// multiple of its input (a corrupt header may declare any length), and must
// round-trip what it accepts. Every input is also tried with its checksum
// fixed up (and as a body inside a valid header and checksum), so the
// fuzzer gets past the CRC into the msgpack decoder.
//
//	go test ./encoding                                   # seed corpus only (CI)
//	go test ./encoding -run '^$' -fuzz FuzzDecodeRecord -fuzztime 5m
//	scripts/fuzz.sh 5m                                   # every target

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"reflect"
	"runtime"
	"testing"

	"github.com/receiptstore/receipts/encoding"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// allocBudget is the most a decode of n bytes may allocate.
func allocBudget(n int) uint64 { return 16*uint64(n) + 4096 }

// allocated returns the bytes fn allocates: the least of up to eight runs
// (it stops at one that allocates nothing), since the runtime's own
// goroutines may allocate during one, and under the race detector sync.Pool
// drops a quarter of what is put back on purpose, so a decoder taken from
// its pool is made anew in a quarter of the runs: with three runs, a
// (1/4)³ chance per input made CI's race run fail once (FuzzDecodeRecord's
// DecodeRecordShared "allocated 256 bytes"); with eight, (1/4)⁸.
func allocated(fn func()) uint64 {
	var best uint64
	for i := range 8 {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		fn()
		runtime.ReadMemStats(&after)
		if d := after.TotalAlloc - before.TotalAlloc; i == 0 || d < best {
			best = d
		}
		if best == 0 {
			break
		}
	}
	return best
}

func fixCRC(b []byte) []byte {
	if len(b) < 4 {
		return nil
	}
	out := append([]byte{}, b[:len(b)-4]...)
	return binary.BigEndian.AppendUint32(out, crc32.Checksum(out, castagnoli))
}

func wrap(header []byte, body []byte) []byte {
	out := append(append([]byte{}, header...), body...)
	return binary.BigEndian.AppendUint32(out, crc32.Checksum(out, castagnoli))
}

// variants are the inputs tried for one fuzzer input.
func variants(b []byte, header []byte) [][]byte {
	vs := [][]byte{b}
	if f := fixCRC(b); f != nil {
		vs = append(vs, f)
	}
	return append(vs, wrap(header, b))
}

// checkLayout checks RecordLayout and Checksum on the encoded record enc of
// r (as EncodeRecord writes it).
func checkLayout(t *testing.T, r *encoding.Record, enc []byte) {
	t.Helper()
	if _, ok := encoding.Checksum(enc); !ok {
		t.Fatalf("Checksum rejects an encoded record: %x", enc)
	}
	l, err := encoding.RecordLayout(enc)
	if err != nil {
		t.Fatalf("RecordLayout of an encoded record: %v (%x)", err, enc)
	}
	fp := enc[l.FpOff : l.FpOff+l.FpLen]
	res := enc[l.ResOff : l.ResOff+l.ResLen]
	if !bytes.Equal(fp, r.Fingerprint) || !bytes.Equal(res, r.Result) || l.ResNil != (r.Result == nil) {
		t.Fatalf("RecordLayout %+v does not locate fingerprint %x and result %x in %x", l, r.Fingerprint, r.Result, enc)
	}
}

// checkDecoders checks that the decoders decode b exactly as msgpack's
// decoder alone does (the canonical fast path changes no answer): the same
// record, or the same error.
func checkDecoders(t *testing.T, b []byte) {
	t.Helper()
	for _, shared := range []bool{false, true} {
		var got, want encoding.Record
		var err error
		if shared {
			err = encoding.DecodeRecordShared(&got, b)
		} else {
			err = encoding.DecodeRecordInto(&got, b)
		}
		werr := encoding.DecodeRecordMsgpack(&want, b, shared)
		if (err == nil) != (werr == nil) || (err != nil && err.Error() != werr.Error()) {
			t.Fatalf("shared %v: decoded with %v, msgpack's decoder with %v: %x", shared, err, werr, b)
		}
		if err == nil && !reflect.DeepEqual(got, want) {
			t.Fatalf("shared %v: decoded %+v, msgpack's decoder %+v: %x", shared, got, want, b)
		}
	}
}

// checkEncoding checks that enc, r's encoding, is what msgpack's encoder
// writes for it.
func checkEncoding(t *testing.T, r *encoding.Record, enc []byte) {
	t.Helper()
	if want := encoding.AppendRecordMsgpack(nil, r); !bytes.Equal(enc, want) {
		t.Fatalf("encoded %+v as %x, msgpack's encoder as %x", r, enc, want)
	}
}

func checkRecord(t *testing.T, b []byte) {
	_, _ = encoding.RecordLayout(b) // never panics
	checkDecoders(t, b)
	_, _ = encoding.Checksum(b)
	in := append([]byte{}, b...)
	var r *encoding.Record
	var err error
	if got := allocated(func() { r, err = encoding.DecodeRecord(in) }); got > allocBudget(len(b)) {
		t.Fatalf("DecodeRecord of %d bytes allocated %d bytes (budget %d): %x", len(b), got, allocBudget(len(b)), b)
	}
	if _, perr := encoding.PeekState(in); perr != nil && !errors.Is(perr, encoding.ErrCorrupt) {
		t.Fatalf("PeekState error not marked corrupt: %v", perr)
	}
	// DecodeRecordShared accepts what DecodeRecord accepts, decodes the same record, and
	// allocates nothing for it.
	var shared encoding.Record
	var serr error
	if got := allocated(func() { serr = encoding.DecodeRecordShared(&shared, in) }); serr == nil && got != 0 {
		t.Fatalf("DecodeRecordShared of %d bytes allocated %d bytes: %x", len(b), got, b)
	}
	if (serr == nil) != (err == nil) || (serr != nil && !errors.Is(serr, encoding.ErrCorrupt)) {
		t.Fatalf("DecodeRecordShared: %v; DecodeRecord: %v", serr, err)
	}
	if err == nil && !reflect.DeepEqual(*r, shared) {
		t.Fatalf("DecodeRecordShared decoded %+v, DecodeRecord %+v", shared, *r)
	}
	if err != nil {
		if !errors.Is(err, encoding.ErrCorrupt) {
			t.Fatalf("DecodeRecord error not marked corrupt: %v", err)
		}
		if r != nil {
			t.Fatalf("DecodeRecord returned a record and an error")
		}
		return
	}
	// The record does not alias the input.
	for i := range in {
		in[i] ^= 0xff
	}
	again, err := encoding.DecodeRecord(b)
	if err != nil || !reflect.DeepEqual(r, again) {
		t.Fatalf("decoded record aliases its input: %+v vs %+v (%v)", r, again, err)
	}
	if len(r.Fingerprint) == 0 || !r.State.Valid() {
		t.Fatalf("accepted a record with no fingerprint or a bad state: %+v", r)
	}
	enc := encoding.EncodeRecord(r)
	checkEncoding(t, r, enc)
	checkLayout(t, r, enc)
	r2, err := encoding.DecodeRecord(enc)
	if err != nil {
		t.Fatalf("re-encoded record does not decode: %v\nrecord %+v\ninput %x", err, r, b)
	}
	if !reflect.DeepEqual(r, r2) {
		t.Fatalf("round trip changed the record:\n%+v\n%+v", r, r2)
	}
	if !bytes.Equal(enc, encoding.EncodeRecord(r2)) {
		t.Fatalf("encoding is not stable")
	}
}

func FuzzDecodeRecord(f *testing.F) {
	f.Add(encoding.EncodeRecord(&encoding.Record{State: encoding.StatePending, Fingerprint: []byte("fp"), Attempts: 1, Token: 1, CreatedAt: 1, UpdatedAt: 1, LeaseExpiresAt: 2}))
	f.Add(encoding.EncodeRecord(&encoding.Record{State: encoding.StateSucceeded, Fingerprint: bytes.Repeat([]byte{7}, 32), Result: []byte("result"), Attempts: 3, Token: 1 << 40, CreatedAt: -5, UpdatedAt: 1 << 62}))
	f.Add(encoding.EncodeRecord(&encoding.Record{State: encoding.StateFailed, Fingerprint: []byte{0}, Result: []byte{}, Attempts: 1<<32 - 1, Token: 1<<64 - 1}))
	f.Add([]byte{})
	f.Add([]byte{1, 2, 0x97})
	f.Add([]byte{0x97, 0xc6, 0xff, 0xff, 0xff, 0xf0, 'f', 'p'}) // a body declaring 4 GiB
	f.Add([]byte{0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, v := range variants(b, []byte{encoding.RecordVersion, byte(encoding.StateSucceeded)}) {
			checkRecord(t, v)
		}
	})
}

func checkMeta(t *testing.T, b []byte) {
	var m *encoding.Meta
	var err error
	if got := allocated(func() { m, err = encoding.DecodeMeta(b) }); got > allocBudget(len(b)) {
		t.Fatalf("DecodeMeta of %d bytes allocated %d bytes (budget %d): %x", len(b), got, allocBudget(len(b)), b)
	}
	if err != nil {
		if !errors.Is(err, encoding.ErrCorrupt) {
			t.Fatalf("DecodeMeta error not marked corrupt: %v", err)
		}
		return
	}
	enc, err := encoding.EncodeMeta(m)
	if err != nil {
		t.Fatalf("EncodeMeta of a decoded meta: %v", err)
	}
	m2, err := encoding.DecodeMeta(enc)
	if err != nil {
		t.Fatalf("re-encoded meta does not decode: %v (%+v)", err, m)
	}
	if !reflect.DeepEqual(m, m2) {
		t.Fatalf("meta round trip changed it:\n%+v\n%+v", m, m2)
	}
}

func FuzzDecodeMeta(f *testing.F) {
	good, err := encoding.EncodeMeta(&encoding.Meta{Format: encoding.StoreFormat, EpochWidth: 1 << 30, Secret: bytes.Repeat([]byte{9}, 32), CreatedAt: 12345, Retention: 1 << 40, LeaseTTL: 1 << 35, TombstoneWindow: 1 << 41})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add(metaFormat1)
	f.Add(good[2 : len(good)-4]) // the body alone
	newer, _ := encoding.EncodeMeta(&encoding.Meta{Format: encoding.StoreFormat + 1})
	f.Add(newer)
	f.Add([]byte{})
	f.Add([]byte{0x81, 0xa6, 's', 'e', 'c', 'r', 'e', 't', 0xc4, 0x10})
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, v := range variants(b, []byte{'R', encoding.StoreFormat}) {
			checkMeta(t, v)
		}
	})
}

func FuzzDecodeUint64(f *testing.F) {
	f.Add(encoding.EncodeUint64(0))
	f.Add(encoding.EncodeUint64(1<<64 - 1))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, v := range variants(b, nil) {
			n, err := encoding.DecodeUint64(v)
			if err != nil {
				if !errors.Is(err, encoding.ErrCorrupt) {
					t.Fatalf("error not marked corrupt: %v", err)
				}
				continue
			}
			if !bytes.Equal(encoding.EncodeUint64(n), v) {
				t.Fatalf("DecodeUint64 accepted %x, which is not EncodeUint64(%d)", v, n)
			}
		}
	})
}

// FuzzRecordRoundTrip: every record encodes and decodes to itself.
func FuzzRecordRoundTrip(f *testing.F) {
	f.Add(uint8(1), []byte("fp"), []byte(nil), uint32(1), uint64(1), int64(1), int64(2), int64(3))
	f.Add(uint8(2), []byte{0}, []byte{}, uint32(1<<32-1), uint64(1<<64-1), int64(-1<<63), int64(1<<63-1), int64(0))
	f.Fuzz(func(t *testing.T, state uint8, fp, result []byte, attempts uint32, token uint64, created, updated, lease int64) {
		r := &encoding.Record{State: encoding.State(state%3 + 1), Fingerprint: fp, Result: result, Attempts: attempts, Token: token, CreatedAt: created, UpdatedAt: updated, LeaseExpiresAt: lease}
		enc := encoding.EncodeRecord(r)
		checkEncoding(t, r, enc)
		checkDecoders(t, enc)
		got, err := encoding.DecodeRecord(enc)
		if len(fp) == 0 {
			if !errors.Is(err, encoding.ErrCorrupt) {
				t.Fatalf("a record without fingerprint decoded: %v", err)
			}
			return
		}
		if err != nil {
			t.Fatalf("decode of an encoded record: %v", err)
		}
		if !reflect.DeepEqual(r, got) {
			t.Fatalf("round trip:\n%+v\n%+v", r, got)
		}
		checkLayout(t, r, enc)
	})
}
