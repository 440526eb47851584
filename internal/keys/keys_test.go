package keys

import (
	"bytes"
	"math"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

func part(t *rapid.T, label string) string {
	return string(rapid.SliceOfN(rapid.Byte(), 1, MaxPartLen).Draw(t, label))
}

// TestRecordRoundTrip: every (epoch, scope, id) with scope and id of 1 to
// MaxPartLen arbitrary bytes parses back to itself, RecordLen is its length,
// Epoch reads the epoch without parsing, and AppendRecord keeps dst.
func TestRecordRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		epoch := rapid.Uint64().Draw(t, "epoch")
		scope, id := part(t, "scope"), part(t, "id")
		dst := rapid.SliceOfN(rapid.Byte(), 0, 8).Draw(t, "dst")
		k := AppendRecord(bytes.Clone(dst), epoch, scope, id)
		require.Equal(t, dst, k[:len(dst)], "dst kept")
		k = k[len(dst):]
		require.Len(t, k, RecordLen(scope, id))
		e, s, i, err := ParseRecord(k)
		require.NoError(t, err)
		require.Equal(t, epoch, e)
		require.Equal(t, scope, s)
		require.Equal(t, id, i)
		e, ok := Epoch(k)
		require.True(t, ok)
		require.Equal(t, epoch, e)
		require.True(t, bytes.HasPrefix(k, ScopeStart(epoch, scope)))
		require.True(t, bytes.HasPrefix(k, EpochStart(epoch)))
	})
}

// TestRecordStringsAreCopies: ParseRecord's strings do not alias the key.
func TestRecordStringsAreCopies(t *testing.T) {
	k := AppendRecord(nil, 7, "scope", "id")
	_, s, i, err := ParseRecord(k)
	require.NoError(t, err)
	for j := range k {
		k[j] = 'x'
	}
	require.Equal(t, "scope", s)
	require.Equal(t, "id", i)
}

// TestLengthPrefix: the scope is length-prefixed in record and lock keys,
// so splits of the same bytes never collide.
func TestLengthPrefix(t *testing.T) {
	pairs := [][2]string{{"ab", "c"}, {"a", "bc"}, {"abc", "\x01"}, {"\x03abc", "d"}}
	records, locks := map[string]bool{}, map[string]bool{}
	for _, p := range pairs {
		r := string(AppendRecord(nil, 1, p[0], p[1]))
		l := LockKey(p[0], p[1])
		require.False(t, records[r], "record key of %q collides", p)
		require.False(t, locks[l], "lock key of %q collides", p)
		records[r], locks[l] = true, true
		require.Equal(t, byte(len(p[0])), r[len(EpochStart(1))], "length byte after the epoch")
		require.Equal(t, byte(len(p[0])), l[0], "length byte first")
		require.Equal(t, l, string(AppendLockKey(nil, p[0], p[1])))
	}
	require.Len(t, LockKey(strings.Repeat("s", MaxPartLen), strings.Repeat("i", MaxPartLen)), MaxLockKeyLen)
	rapid.Check(t, func(t *rapid.T) {
		s1, i1, s2, i2 := part(t, "s1"), part(t, "i1"), part(t, "s2"), part(t, "i2")
		if s1 == s2 && i1 == i2 {
			return
		}
		require.NotEqual(t, AppendRecord(nil, 0, s1, i1), AppendRecord(nil, 0, s2, i2))
		require.NotEqual(t, LockKey(s1, i1), LockKey(s2, i2))
	})
}

// TestSetEpoch: SetEpoch rewrites only the epoch, in place.
func TestSetEpoch(t *testing.T) {
	for _, epochs := range [][2]uint64{{0, 1}, {1, 0}, {255, 256}, {1 << 40, math.MaxUint64}, {math.MaxUint64, 0}} {
		k := AppendRecord(nil, epochs[0], "scope", "id")
		n := len(k)
		SetEpoch(k, epochs[1])
		require.Len(t, k, n)
		require.Equal(t, AppendRecord(nil, epochs[1], "scope", "id"), k)
		e, s, i, err := ParseRecord(k)
		require.NoError(t, err)
		require.Equal(t, epochs[1], e)
		require.Equal(t, "scope", s)
		require.Equal(t, "id", i)
	}
}

// TestOrdering: record keys sort by epoch first (big-endian, across byte
// boundaries), then scope length and scope; every epoch's keys lie in
// [EpochStart(e), EpochStart(e+1)); all record keys lie in [RecordsStart,
// RecordsEnd) and all store keys in [StoreStart, StoreEnd), before ordinary
// text keys.
func TestOrdering(t *testing.T) {
	epochs := []uint64{0, 1, 255, 256, 65535, 65536, 1 << 32, math.MaxUint64 - 1}
	var ks [][]byte
	for _, e := range epochs {
		for _, s := range []string{"a", "b", "\xff", "aa"} {
			for _, id := range []string{"1", "\x00", "\xff\xff"} {
				k := AppendRecord(nil, e, s, id)
				ks = append(ks, k)
				require.True(t, bytes.Compare(EpochStart(e), k) <= 0)
				require.True(t, bytes.Compare(k, EpochStart(e+1)) < 0)
				require.True(t, bytes.Compare(RecordsStart, k) <= 0 && bytes.Compare(k, RecordsEnd) < 0)
			}
		}
	}
	sorted := append([][]byte(nil), ks...)
	sort.Slice(sorted, func(i, j int) bool { return bytes.Compare(sorted[i], sorted[j]) < 0 })
	var last uint64
	for i, k := range sorted {
		e, _, _, err := ParseRecord(k)
		require.NoError(t, err)
		if i > 0 {
			require.GreaterOrEqual(t, e, last, "sorted by epoch first")
		}
		last = e
	}
	for _, k := range append([][]byte{Meta, TokenCeiling, GCFloor, Clock, RecordsStart, RecordsEnd}, ks...) {
		require.True(t, bytes.HasPrefix(k, []byte(Prefix)) || bytes.Equal(k, RecordsEnd))
		require.True(t, bytes.Compare(StoreStart, k) <= 0 && bytes.Compare(k, StoreEnd) < 0, "%q in the store's range", k)
		require.True(t, bytes.Compare(k, []byte("\x01")) < 0, "%q sorts before ordinary keys", k)
	}
	for _, k := range [][]byte{Meta, TokenCeiling, GCFloor, Clock} {
		require.False(t, bytes.Compare(RecordsStart, k) <= 0 && bytes.Compare(k, RecordsEnd) < 0, "%q is not a record key", k)
		_, ok := Epoch(k)
		require.False(t, ok)
	}
}

// TestParseMalformed: anything but a well-formed record key is ErrMalformed.
func TestParseMalformed(t *testing.T) {
	good := AppendRecord(nil, 3, "scope", "id")
	long := strings.Repeat("i", MaxPartLen+1)
	for name, k := range map[string][]byte{
		"empty":          nil,
		"prefix only":    RecordsStart,
		"no length byte": EpochStart(3),
		"meta":           Meta,
		"other prefix":   append([]byte(Prefix+"x"), good[len(RecordsStart):]...),
		"empty scope":    append(EpochStart(3), 0, 'i', 'd'),
		"empty id":       ScopeStart(3, "scope"),
		"scope too long": append(EpochStart(3), 9, 's', 'c'),
		"id too long":    append(ScopeStart(3, "s"), long...),
		"truncated":      good[:len(EpochStart(3))-1],
	} {
		_, _, _, err := ParseRecord(k)
		require.ErrorIs(t, err, ErrMalformed, name)
	}
	_, ok := Epoch(good[:len(EpochStart(3))-1])
	require.False(t, ok)
}
