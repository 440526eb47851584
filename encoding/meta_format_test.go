package encoding_test

import (
	"bytes"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	"github.com/receiptstore/receipts/encoding"
)

// metaFormat1 is a meta record as the format-1 version wrote it (epoch width
// 6h, secret 32 bytes of 7, created 2026-10-07 12:00 UTC): no retention, no
// lease TTL.
var metaFormat1 = mustHex("520184a6666f726d617401ab65706f63685f7769647468d3000013a52453c000a6736563726574c420" +
	"0707070707070707070707070707070707070707070707070707070707070707" +
	"aa637265617465645f6174d318dc3d8693ba8000ff6d1723")

func mustHex(s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		panic(err)
	}
	return b
}

func TestDecodeMetaFormat1(t *testing.T) {
	m, err := encoding.DecodeMeta(metaFormat1)
	if err != nil {
		t.Fatalf("a format-1 meta does not decode: %v", err)
	}
	want := encoding.Meta{Format: 1, EpochWidth: int64(6 * time.Hour), Secret: bytes.Repeat([]byte{7}, 32), CreatedAt: 1791374400000000000}
	if m.Format != want.Format || m.EpochWidth != want.EpochWidth || !bytes.Equal(m.Secret, want.Secret) ||
		m.CreatedAt != want.CreatedAt || m.Retention != 0 || m.LeaseTTL != 0 {
		t.Fatalf("got %+v, want %+v", m, want)
	}
}

func TestMetaFormat2RoundTrip(t *testing.T) {
	in := &encoding.Meta{Format: 2, EpochWidth: int64(42 * time.Hour), Secret: bytes.Repeat([]byte{1}, 32),
		CreatedAt: 5, Retention: int64(7 * 24 * time.Hour), LeaseTTL: int64(time.Minute)}
	b, err := encoding.EncodeMeta(in)
	if err != nil {
		t.Fatal(err)
	}
	m, err := encoding.DecodeMeta(b)
	if err != nil {
		t.Fatal(err)
	}
	if m.Retention != in.Retention || m.LeaseTTL != in.LeaseTTL || m.Format != 2 {
		t.Fatalf("got %+v, want %+v", m, in)
	}
	// Format 2 without its settings, or with a lease as long as the
	// retention, is corrupt.
	for _, bad := range []encoding.Meta{
		{Format: 2, EpochWidth: 1, Secret: in.Secret},
		{Format: 2, EpochWidth: 1, Secret: in.Secret, Retention: 10, LeaseTTL: 10},
		{Format: 1, EpochWidth: 1, Secret: in.Secret, Retention: 10, LeaseTTL: 1},
	} {
		b, err := encoding.EncodeMeta(&bad)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := encoding.DecodeMeta(b); !errors.Is(err, encoding.ErrCorrupt) {
			t.Fatalf("%+v: got %v, want ErrCorrupt", bad, err)
		}
	}
}

func TestMetaFormat3RoundTrip(t *testing.T) {
	for _, window := range []int64{int64(7 * 24 * time.Hour), -1} {
		in := &encoding.Meta{Format: 3, EpochWidth: int64(time.Hour), Secret: bytes.Repeat([]byte{1}, 32),
			CreatedAt: 5, Retention: int64(24 * time.Hour), LeaseTTL: int64(time.Minute), TombstoneWindow: window}
		b, err := encoding.EncodeMeta(in)
		if err != nil {
			t.Fatal(err)
		}
		m, err := encoding.DecodeMeta(b)
		if err != nil {
			t.Fatal(err)
		}
		if m.TombstoneWindow != window || m.Format != 3 || m.Retention != in.Retention {
			t.Fatalf("got %+v, want %+v", m, in)
		}
	}
	// Format 3 without a window, or format 2 with one, is corrupt.
	for _, bad := range []encoding.Meta{
		{Format: 3, EpochWidth: 1, Secret: bytes.Repeat([]byte{1}, 32), Retention: 10, LeaseTTL: 1},
		{Format: 2, EpochWidth: 1, Secret: bytes.Repeat([]byte{1}, 32), Retention: 10, LeaseTTL: 1, TombstoneWindow: 5},
	} {
		b, err := encoding.EncodeMeta(&bad)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := encoding.DecodeMeta(b); !errors.Is(err, encoding.ErrCorrupt) {
			t.Fatalf("%+v: got %v, want ErrCorrupt", bad, err)
		}
	}
}
