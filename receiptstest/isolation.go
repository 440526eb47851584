package receiptstest

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/internal/testkit"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

var isolationTests = []test{
	{"Scopes", testScopeIsolation},
}

// isolationChecks is how many random checks testScopeIsolation runs:
// RECEIPTSTEST_ISOLATION_CHECKS, or 300.
func isolationChecks() int {
	if n, err := strconv.Atoi(os.Getenv("RECEIPTSTEST_ISOLATION_CHECKS")); err == nil && n > 0 {
		return n
	}
	return 300
}

var isoAtoms = []string{
	"a", "b", "ab", "ba", "/", "//", ":", "|", "\x00", "\x00\x00", "\x01", "\x02",
	"\xff", "\xfe\xff", "\xc3", "\xc3\x28", "\xed\xa0\x80", "é", " ", "%2F", "a/b", "a\x00b",
	string([]byte{255}), "\x00rcpt", "r", "'", "\"", "\\", "%", "_",
}

// isoPart draws a non-empty key part of at most MaxKeyPartLen bytes.
var isoPart = rapid.Custom(func(t *rapid.T) string {
	switch rapid.IntRange(0, 3).Draw(t, "shape") {
	case 0:
		return rapid.SampledFrom(isoAtoms).Draw(t, "atom")
	case 1:
		return strings.Join(rapid.SliceOfN(rapid.SampledFrom(isoAtoms), 1, 5).Draw(t, "atoms"), "")
	case 2: // lengths at the edges, cut at a byte (may split a rune)
		n := rapid.SampledFrom([]int{1, 2, 127, 128, 254, 255}).Draw(t, "len")
		atom := rapid.SampledFrom(isoAtoms).Draw(t, "fill")
		return strings.Repeat(atom, n)[:n]
	default:
		return string(rapid.SliceOfN(rapid.Byte(), 1, 8).Draw(t, "bytes"))
	}
})

func isoValid(s string) bool { return len(s) > 0 && len(s) <= receipts.MaxKeyPartLen }

// isoKeys draws 2..10 distinct keys: a few random ones and, for each, the
// keys that would collide with it under a naive layout.
func isoKeys(t *rapid.T) []receipts.Key {
	var out []receipts.Key
	seen := map[receipts.Key]bool{}
	add := func(s, id string) {
		k := receipts.Key{Scope: s, ID: id}
		if isoValid(s) && isoValid(id) && !seen[k] && len(out) < 10 {
			seen[k] = true
			out = append(out, k)
		}
	}
	n := rapid.IntRange(1, 3).Draw(t, "bases")
	for range n {
		s, id := isoPart.Draw(t, "scope"), isoPart.Draw(t, "id")
		add(s, id)
		if len(s) > 1 { // ("ab","c") vs ("a","bc")
			add(s[:len(s)-1], s[len(s)-1:]+id)
		}
		if len(id) > 1 {
			add(s+id[:1], id[1:])
		}
		add(s, id+"\x00")
		add(s+"\x00", id)
		add(s[:1], id)                          // a scope that is a prefix of another
		add(id, s)                              // swapped halves
		add(s, s)                               // same bytes in both halves
		add(string([]byte{byte(len(s))})+s, id) // a scope starting with a length byte
		add(strings.ToUpper(s), id)             // case differs
	}
	return rapid.Permutation(out).Draw(t, "order")
}

type isoState struct {
	lease  *receipts.Lease
	result []byte // committed result, nil if none
}

func testScopeIsolation(t *testing.T, s Store) { ScopeIsolation(t, s, isolationChecks()) }

// ScopeIsolation runs the kit's scope-isolation property (the
// Isolation/Scopes test) against a store s opens, for checks random checks
// (at least; a run with -rapid.seed or -rapid.failfile, reproducing a
// failure, runs one round). Long harnesses call it with more checks than the
// kit's default.
//
// The property is over adversarial scopes and IDs (separators, NUL bytes,
// invalid UTF-8, SQL and LIKE metacharacters, quotes, case, parts that are
// prefixes of each other, 254/255-byte edges, pairs that collide under naive
// concatenation). Each key gets its own fingerprint and results; no
// operation on one key may ever read, replay, conflict with or block on
// another key, and Scan with Filter.Scope returns exactly that scope. Each
// check starts past the previous one's retention, and every 100th runs GC,
// so the store stays small.
func ScopeIsolation(t *testing.T, s Store, checks int) {
	e := newEnv(t, s, func(o *receipts.Options) { o.LeaseTTL = time.Minute })
	ctx := context.Background()
	done := 0
	prop := func(rt *rapid.T) {
		done++
		// Each check starts past the previous one's retention: a clean store.
		e.clock.Advance(2*retention + e.window())
		if done%100 == 0 {
			e.gc() // keep the store small
		}
		db := e.db
		keys := isoKeys(rt)
		st := make([]isoState, len(keys))
		fp := func(i int) []byte { return []byte(fmt.Sprintf("fp-%d", i)) }
		steps := rapid.IntRange(len(keys), 4*len(keys)).Draw(rt, "steps")
		for range steps {
			i := rapid.IntRange(0, len(keys)-1).Draw(rt, "key")
			k, s := keys[i], &st[i]
			switch rapid.IntRange(0, 5).Draw(rt, "op") {
			case 0, 1: // Claim (sometimes waiting: must not block on another key)
				var opts []receipts.ClaimOption
				cctx := ctx
				if s.lease == nil && rapid.Bool().Draw(rt, "wait") {
					var cancel context.CancelFunc
					cctx, cancel = context.WithTimeout(ctx, 10*time.Second)
					defer cancel()
					opts = append(opts, receipts.WaitForResult())
				}
				l, rc, err := db.Claim(cctx, k, fp(i), opts...)
				switch {
				case s.result != nil:
					require.NoError(rt, err, "replay of %s", k)
					require.Nil(rt, l)
					require.Equal(rt, k, rc.Key)
					require.Equal(rt, fp(i), rc.Fingerprint, "%s replayed another key's receipt", k)
					require.Equal(rt, s.result, rc.Result, "%s replayed another key's result", k)
				case s.lease != nil:
					require.ErrorIs(rt, err, receipts.ErrInProgress, "%s", k)
				default:
					require.NoError(rt, err, "claim of free %s", k)
					require.Nil(rt, rc, "%s: a free key replayed a receipt", k)
					require.Equal(rt, uint32(1), l.Attempt(), "%s", k)
					require.False(rt, l.Recovered(), "%s", k)
					require.Equal(rt, k, l.Key())
					s.lease = l
				}
			case 2: // Commit
				if s.lease == nil {
					continue
				}
				res := []byte(fmt.Sprintf("result-%d-%x", i, k.Scope))
				rc, err := s.lease.Commit(ctx, res)
				require.NoError(rt, err, "commit of %s", k)
				require.Equal(rt, k, rc.Key)
				s.lease, s.result = nil, res
			case 3: // Release
				if s.lease == nil {
					continue
				}
				require.NoError(rt, s.lease.Release(ctx), "release of %s", k)
				s.lease = nil
			case 4: // Lookup
				rc, err := db.Lookup(ctx, k)
				switch {
				case s.result != nil:
					require.NoError(rt, err, "lookup %s", k)
					require.Equal(rt, receipts.Succeeded, rc.State, "%s", k)
					require.Equal(rt, s.result, rc.Result, "%s", k)
				case s.lease != nil:
					require.NoError(rt, err, "lookup %s", k)
					require.Equal(rt, receipts.Pending, rc.State, "%s", k)
					require.Equal(rt, s.lease.Token(), rc.Token, "%s", k)
				default:
					require.ErrorIs(rt, err, receipts.ErrNotFound, "lookup %s", k)
				}
				if err == nil {
					require.Equal(rt, k, rc.Key)
					require.Equal(rt, fp(i), rc.Fingerprint, "%s read another key's record", k)
				}
			case 5: // Scan one scope
				want := map[receipts.Key]bool{}
				for j, kj := range keys {
					if kj.Scope == k.Scope && (st[j].lease != nil || st[j].result != nil) {
						want[kj] = true
					}
				}
				got := map[receipts.Key]bool{}
				for rc, err := range db.Scan(ctx, receipts.Filter{Scope: k.Scope}) {
					require.NoError(rt, err)
					require.Equal(rt, k.Scope, rc.Key.Scope, "scan of scope %q returned %s", k.Scope, rc.Key)
					require.False(rt, got[rc.Key], "scan returned %s twice", rc.Key)
					got[rc.Key] = true
				}
				require.Equal(rt, want, got, "scan of scope %q", k.Scope)
			}
		}
		// Every key reads back as its own.
		for i, k := range keys {
			rc, err := db.Lookup(ctx, k)
			if st[i].lease == nil && st[i].result == nil {
				require.ErrorIs(rt, err, receipts.ErrNotFound, "%s", k)
				continue
			}
			require.NoError(rt, err, "%s", k)
			require.Equal(rt, fp(i), rc.Fingerprint, "%s", k)
		}
	}
	testkit.RunRapid(t, checks, prop)
	t.Logf("%d checks", done)
}
