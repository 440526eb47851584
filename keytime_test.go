package receipts_test

import (
	"strings"
	"testing"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/stretchr/testify/require"
)

func TestUUIDv7Time(t *testing.T) {
	// RFC 9562, Appendix A.6: 2022-02-22 14:22:22 -05:00.
	want := time.Date(2022, 2, 22, 19, 22, 22, 0, time.UTC)
	for _, id := range []string{"017F22E2-79B0-7CC3-98C4-DC0C0C07398F", "017f22e2-79b0-7cc3-98c4-dc0c0c07398f"} {
		got, ok := receipts.UUIDv7Time(id)
		require.True(t, ok, id)
		require.True(t, want.Equal(got), "%s: %v, want %v", id, got, want)
	}
	got, ok := receipts.UUIDv7Time("00000000-0000-7000-8000-000000000000")
	require.True(t, ok)
	require.Zero(t, got.UnixMilli())
	got, ok = receipts.UUIDv7Time("ffffffff-ffff-7fff-bfff-ffffffffffff")
	require.True(t, ok)
	require.Equal(t, int64(1<<48-1), got.UnixMilli())
	for _, bad := range []string{
		"",
		"017F22E2-79B0-4CC3-98C4-DC0C0C07398F",   // version 4
		"017F22E2-79B0-7CC3-C8C4-DC0C0C07398F",   // variant 110
		"017F22E2-79B0-7CC3-78C4-DC0C0C07398F",   // variant 0
		"017F22E279B07CC398C4DC0C0C07398F",       // no hyphens
		"{017F22E2-79B0-7CC3-98C4-DC0C0C07398F}", // braces
		"017F22E2-79B0-7CC3-98C4-DC0C0C07398G",   // not hex
		"017F22E2_79B0-7CC3-98C4-DC0C0C07398F",   // not a hyphen
		"01ARYZ6S41TSV4RRFFQ69G5FAV",             // a ULID
	} {
		_, ok := receipts.UUIDv7Time(bad)
		require.False(t, ok, bad)
	}
}

func TestULIDTime(t *testing.T) {
	for _, v := range []struct {
		id string
		ms int64
	}{
		{"01ARYZ6S41TSV4RRFFQ69G5FAV", 1469918176385}, // github.com/ulid/javascript's decodeTime example
		{"01aryz6s41tsv4rrffq69g5fav", 1469918176385},
		{"0000XSNJG0MQJHBF4QX1EFD6Y3", 1_000_000_000}, // oklog/ulid's README: time.Unix(1000000, 0)
		{"00000000000000000000000000", 0},
		{"7ZZZZZZZZZZZZZZZZZZZZZZZZZ", 1<<48 - 1},
	} {
		got, ok := receipts.ULIDTime(v.id)
		require.True(t, ok, v.id)
		require.Equal(t, v.ms, got.UnixMilli(), v.id)
	}
	for _, bad := range []string{
		"",
		"8ZZZZZZZZZZZZZZZZZZZZZZZZZ",  // more than 128 bits
		"01ARYZ6S41TSV4RRFFQ69G5FAU",  // U is not in the alphabet
		"01ARYZ6S41TSV4RRFFQ69G5FA",   // 25 characters
		"01ARYZ6S41TSV4RRFFQ69G5FAVV", // 27
		"017f22e2-79b0-7cc3-98c4-dc0",
	} {
		_, ok := receipts.ULIDTime(bad)
		require.False(t, ok, bad)
	}
}

// FuzzKeyTime: the parsers never panic, accept only their own form, and
// agree with a re-encoding of the time they read.
func FuzzKeyTime(f *testing.F) {
	for _, s := range []string{"017F22E2-79B0-7CC3-98C4-DC0C0C07398F", "01ARYZ6S41TSV4RRFFQ69G5FAV", "", "zz"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		if tm, ok := receipts.UUIDv7Time(id); ok {
			require.Len(t, id, 36)
			ms := tm.UnixMilli()
			require.True(t, ms >= 0 && ms < 1<<48)
			hex := strings.ReplaceAll(strings.ToLower(id[:13]), "-", "")
			require.Equal(t, '7', rune(id[14]))
			require.Equal(t, fmtHex48(ms), hex)
		}
		if tm, ok := receipts.ULIDTime(id); ok {
			require.Len(t, id, 26)
			require.Equal(t, encodeULIDTime(tm.UnixMilli()), strings.ToUpper(id[:10]))
		}
	})
}

func fmtHex48(ms int64) string {
	const digits = "0123456789abcdef"
	b := make([]byte, 12)
	for i := 11; i >= 0; i-- {
		b[i] = digits[ms&0xf]
		ms >>= 4
	}
	return string(b)
}

func encodeULIDTime(ms int64) string {
	const digits = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
	b := make([]byte, 10)
	for i := 9; i >= 0; i-- {
		b[i] = digits[ms&0x1f]
		ms >>= 5
	}
	return string(b)
}
